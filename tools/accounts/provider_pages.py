"""Console pages of HTTP tools' OAuth providers (docs/accounts.md): the list, a form to add or change one (its
client is write-only: left empty, the stored one stays), and delete."""
from django import forms
from django.shortcuts import render

from common.secrets import secret_names
from tenancy.editing import ObjectDeleteView, ObjectFormView
from tenancy.web import ADMIN, TenantForm, tenant_view
from tools.accounts import providers
from tools.models import AccountMode, OAuthProvider


def _address(label: str, help_text: str) -> forms.CharField:
    return forms.CharField(required=False, max_length=providers.URL_MAX, label=label, help_text=help_text)


class OAuthProviderForm(TenantForm):
    name = forms.CharField(max_length=24, help_text=f"{providers.NAME_RULE}. HTTP tools name it.")
    accounts = forms.ChoiceField(
        choices=[(mode, AccountMode(mode).label) for mode in providers.MODES], label="Calls act as",
        help_text="Each person's own account: every member connects theirs on the \"Your accounts\" page, and a "
                  "call carries its verified person's token (never a reviewer's). A service account: Toolkeeper "
                  "gets the client's own token (client credentials) and every call carries it.")
    api_url = forms.CharField(max_length=providers.URL_MAX, label="API URL",
                              help_text="The API's base URL. HTTP tools that use this provider must call under it: "
                                        "its tokens go nowhere else.")
    issuer = _address("Issuer", "Optional. When set, an answer that names another issuer is refused (RFC 9207).")
    authorization_endpoint = _address("Authorization endpoint", "Each person's own account: where they sign in.")
    token_endpoint = _address("Token endpoint", "Required.")
    revocation_endpoint = _address("Revocation endpoint", "Optional: a disconnect ends the grant there (RFC 7009).")
    resource = _address("Resource", "Optional: the API's identifier, sent as the resource parameter (RFC 8707).")
    scopes = forms.CharField(required=False, max_length=500, label="Scopes", help_text="Space-separated.")
    client_id = forms.CharField(required=False, max_length=2000, label="Client id",
                                help_text="The client registered for Toolkeeper at the authorization server; its "
                                          "redirect URI is this platform's /account/upstream/callback/.")
    client_secret = forms.CharField(required=False, max_length=2000, label="Client secret",
                                    widget=forms.PasswordInput(attrs={"autocomplete": "off"}),
                                    help_text="A confidential client's (a service account's is). Write-only.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance is not None:
            self.fields["name"].disabled = True
            self.fields["name"].help_text = "HTTP tools name it: it cannot change."
            if secret_names(self.instance, "client"):
                self.fields["client_id"].help_text = ("A client is stored: leave both empty to keep it. "
                                                      + self.fields["client_id"].help_text)

    def initial_for(self, provider) -> dict:
        return {name: getattr(provider, name) for name in providers.FIELDS if name != "client"}

    def clean(self):
        data = super().clean()
        if data.get("client_secret") and not data.get("client_id"):
            self.add_error("client_id", "a client secret needs its client id")
        return data

    def _client(self, data: dict) -> dict | None:
        """The client the form sends, or None to keep the stored one."""
        if not data.get("client_id"):
            return None
        client = {"client_id": data["client_id"]}
        if data.get("client_secret"):
            client["client_secret"] = data["client_secret"]
        return client

    def service_values(self) -> dict:
        data = dict(self.cleaned_data)
        values = {name: data[name] for name in providers.FIELDS
                  if name not in ("name", "client") and name in data}
        if self.instance is None:
            values["name"] = data["name"]
        if (client := self._client(data)) is not None:
            values["client"] = client
        return values

    def service_check(self, values: dict) -> None:
        checked = {name: value for name, value in values.items() if name in providers.FIELDS}
        if (client := self._client(values)) is not None:
            checked["client"] = client
        providers.provider_check(self.tenant, checked, self.instance)


@tenant_view()
def provider_list(request):
    rows = [(provider, provider.endpoints.count()) for provider in OAuthProvider.objects.for_tenant(request.tenant)]
    return render(request, "console/oauth_provider_list.html", {"rows": rows})


provider_create = ObjectFormView.as_view(
    form_class=OAuthProviderForm, service=providers.provider_create,
    template_name="console/oauth_provider_form.html", success_url="console:oauth_provider_list",
    success_message="OAuth provider {object.name} saved.", read=ADMIN, write=ADMIN)
provider_edit = ObjectFormView.as_view(
    form_class=OAuthProviderForm, service=providers.provider_update,
    template_name="console/oauth_provider_form.html", success_url="console:oauth_provider_list",
    success_message="OAuth provider {object.name} saved.", read=ADMIN, write=ADMIN)
provider_delete = ObjectDeleteView.as_view(
    service=providers.provider_delete, template_name="console/oauth_provider_delete.html",
    success_url="console:oauth_provider_list", success_message="OAuth provider {object.name} deleted.",
    read=ADMIN, write=ADMIN)
