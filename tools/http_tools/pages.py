"""The console's pages for HTTP tools (tools.http_tools.services): create, edit, delete. The tool's own page
(`tool_detail`) shows the endpoint. Secrets are write-only: a form takes new values, never shows stored ones
(not even on a form refused for another field), and names those stored."""
from django import forms

from common.json_values import JSONValueField
from tenancy.editing import ObjectDeleteView, ObjectFormView, SecretTextarea, credentials_from_text, credentials_stored
from tenancy.web import TenantForm, acting_user
from tools.http_tools import services as http_tools
from tools.models import OAuthProvider

JSON_AREA = {"rows": 4, "spellcheck": "false"}


class HttpToolForm(TenantForm):
    name = forms.CharField(max_length=64, help_text="Letters, digits, _ and -. The model calls the tool by it.")
    description = forms.CharField(required=False, max_length=http_tools.DESCRIPTION_MAX,
                                  widget=forms.Textarea(attrs={"rows": 2}), help_text="What the model reads.")
    input_schema = JSONValueField(label="Input schema", widget=forms.Textarea(attrs=JSON_AREA),
                                  initial={"type": "object", "properties": {}},
                                  help_text='A JSON Schema of type "object": its properties are the arguments.')
    method = forms.ChoiceField(choices=[(m, m) for m in http_tools.METHODS], initial="POST")
    url = forms.CharField(max_length=http_tools.URL_MAX, label="URL",
                          help_text="http or https. {arg} in the path or the query takes an argument, encoded "
                                    "as one piece. Only public addresses, unless the platform admin allows the host.")
    query = JSONValueField(required=False, widget=forms.Textarea(attrs=JSON_AREA), label="Query parameters",
                           help_text='A JSON object, parameter → template, e.g. {"q": "{text}"}.')
    body = JSONValueField(required=False, widget=forms.Textarea(attrs=JSON_AREA), label="Body template",
                          help_text='POST, PUT, PATCH. JSON; "{arg}" alone takes the argument\'s value. Empty: '
                                    "the arguments the URL and the query did not use.")
    headers = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                              help_text="One per line, Name: value (or a JSON object). {secret:NAME} stands for a "
                                        "stored secret, e.g. Authorization: Bearer {secret:token}")
    secrets = forms.CharField(required=False, label="Set secrets",
                              widget=SecretTextarea(attrs={"rows": 2, "autocomplete": "off"}),
                              help_text="One per line, NAME: value (or a JSON object). Sets or replaces those "
                                        "named; the others stay.")
    remove_secrets = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple,
                                               label="Remove secrets")
    oauth_provider = forms.ChoiceField(
        required=False, label="Calls act as",
        help_text="The tenant's credential (the headers and secrets above), or a token of one of the tenant's OAuth "
                  "providers (Tools → OAuth providers): each person's own, or its service account's, sent as the "
                  "Authorization header.")
    pointer = forms.CharField(required=False, max_length=http_tools.POINTER_MAX, label="Result pointer",
                              help_text="A JSON pointer (/data/items) to the part of a JSON answer that is the "
                                        "result. Empty: the whole answer.")
    timeout_s = forms.FloatField(min_value=http_tools.TIMEOUT_RANGE[0], max_value=http_tools.TIMEOUT_RANGE[1],
                                 initial=30, label="Timeout (s)")
    read_only = forms.BooleanField(required=False)
    destructive = forms.BooleanField(required=False)
    idempotent = forms.BooleanField(required=False, help_text="Calls may be run again after a transient failure.")
    enabled = forms.BooleanField(required=False, initial=True)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        stored = sorted(self.instance.secrets or {}) if self.instance is not None else []
        self.fields["remove_secrets"].choices = [(name, name) for name in stored]
        if self.instance is not None:
            shown = credentials_stored(stored, "secrets")
            self.fields["secrets"].help_text = f"{shown} {self.fields['secrets'].help_text}"
        if not stored:
            del self.fields["remove_secrets"]
        self.fields["oauth_provider"].choices = [("", "the tenant's credential"), *(
            (provider.name, f"OAuth provider {provider.name} ({provider.get_accounts_display()})")
            for provider in OAuthProvider.objects.for_tenant(self.tenant))]

    def initial_for(self, endpoint) -> dict:
        tool = endpoint.tool
        return {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema,
                "method": endpoint.method, "url": endpoint.url_template, "query": endpoint.query or None,
                "body": endpoint.body, "headers": "\n".join(f"{k}: {v}" for k, v in (endpoint.headers or {}).items()),
                "pointer": (endpoint.response or {}).get("pointer", ""), "timeout_s": tool.timeout_s,
                "read_only": tool.read_only, "destructive": tool.destructive, "idempotent": tool.idempotent,
                "enabled": tool.enabled,
                "oauth_provider": endpoint.oauth_provider.name if endpoint.oauth_provider_id else ""}

    def clean_headers(self):
        text = self.cleaned_data["headers"]
        return credentials_from_text(text, "headers") if text.strip() else {}

    def clean_secrets(self):
        text = self.cleaned_data["secrets"]
        return credentials_from_text(text, "secrets") if text.strip() else {}

    def service_values(self) -> dict:
        data = self.cleaned_data
        values = {name: data[name] for name in ("name", "description", "input_schema", "method", "url", "headers",
                                                "timeout_s", "read_only", "destructive", "idempotent", "enabled")}
        values["query"] = data["query"] if data["query"] is not None else {}
        values["body"] = data["body"]
        values["oauth_provider"] = data["oauth_provider"] or None
        values["response"] = {"pointer": data["pointer"]} if data["pointer"] else {}
        secrets = dict(data["secrets"])
        secrets.update({name: None for name in data.get("remove_secrets") or ()})
        if secrets or self.instance is None:
            values["secrets"] = secrets
        return values


class HttpToolEdit(ObjectFormView):
    """The page names the endpoint (`http_tool_id`); the service changes its tool."""

    def save(self, values: dict):
        return http_tools.http_tool_update(tool=self.object.tool, actor=acting_user(self.request), **values)


def _delete(*, endpoint, actor=None) -> None:
    http_tools.http_tool_delete(tool=endpoint.tool, actor=actor)


http_tool_create = ObjectFormView.as_view(
    form_class=HttpToolForm, service=http_tools.http_tool_create, template_name="console/http_tool_form.html",
    success_url="console:tool_detail", success_params=(("tool_id", "pk"),),
    success_message="HTTP tool {object.name} created.")
http_tool_edit = HttpToolEdit.as_view(
    form_class=HttpToolForm, template_name="console/http_tool_form.html",
    success_url="console:tool_detail", success_params=(("tool_id", "pk"),),
    success_message="HTTP tool {object.name} saved.")
http_tool_delete = ObjectDeleteView.as_view(
    service=_delete, template_name="console/http_tool_delete.html",
    success_url="console:tool_list", success_message="HTTP tool {object.tool.name} deleted.")
