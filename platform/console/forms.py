"""Forms of the console's own pages. Querysets are always the tenant's (`for_tenant`): a choice from another
tenant is invalid. Page forms are `TenantForm`s, built by the generic views of `tenancy.editing`."""
from django import forms

from tenancy.models import Scope, Tenant
from tenancy.services import LIMIT_FIELDS, LIMIT_MAX
from tenancy.web import TenantForm
from toolkeeper.json_values import JSONValueField
from tools.models import CallStatus, Tool, ToolCall


def _tools_of(tenant):
    return Tool.objects.for_tenant(tenant).order_by("name")


class ToolStateForm(TenantForm):
    enabled = forms.BooleanField(required=False)

    def initial_for(self, tool) -> dict:
        return {"enabled": tool.enabled}


class GroupForm(TenantForm):
    name = forms.SlugField(max_length=64, help_text="Letters, digits, - and _. The model sees this name.")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                                  help_text="Shown next to the group in reset_tools.")
    notes = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 4}),
                            help_text="Instructions given to the model while the group is active.")
    default_active = forms.BooleanField(required=False, help_text="Active in new sessions.")
    switchable = forms.BooleanField(required=False, initial=True,
                                    help_text="The model may switch it with reset_tools. Off: operators decide.")
    tools = forms.ModelMultipleChoiceField(queryset=Tool.objects.none(), required=False,
                                           widget=forms.CheckboxSelectMultiple)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["tools"].queryset = _tools_of(self.tenant)

    def initial_for(self, group) -> dict:
        return {
            "name": group.name, "description": group.description, "notes": group.notes,
            "default_active": group.default_active, "switchable": group.switchable, "tools": list(group.tools.all()),
        }


class BindingForm(TenantForm):
    tool = forms.ModelChoiceField(queryset=Tool.objects.none())
    agent = forms.CharField(max_length=100, required=False,
                            help_text="Empty: every agent. An agent's own binding beats the tenant-wide one.")
    name = forms.CharField(max_length=128, label="Argument name")
    value = JSONValueField(widget=forms.Textarea(attrs={"rows": 3}),
                            help_text='JSON, e.g. "Europe/Berlin" (with quotes), 42, ["a", "b"] or {"k": 1}.')

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["tool"].queryset = _tools_of(self.tenant)

    def clean_agent(self):
        return self.cleaned_data["agent"].strip()

    def clean_name(self):
        return self.cleaned_data["name"].strip()


class ApiKeyForm(TenantForm):
    name = forms.CharField(max_length=100)
    scopes = forms.MultipleChoiceField(
        choices=Scope.choices, widget=forms.CheckboxSelectMultiple,
        help_text="agent: sessions and calls · external: post results of external tools · admin: governance API.",
    )
    agent = forms.CharField(max_length=100, required=False,
                            help_text="Optional: lock the key to one agent name.")

    def clean_agent(self):
        return self.cleaned_data["agent"].strip()


class LimitsForm(TenantForm):
    """The tenant's rate limits, labelled and explained by the model's own fields."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in LIMIT_FIELDS:
            field = Tenant._meta.get_field(name)
            self.fields[name] = forms.IntegerField(min_value=0, max_value=LIMIT_MAX, help_text=field.help_text,
                                                   label=field.verbose_name.capitalize())

    def initial_for(self, tenant) -> dict:
        return {name: getattr(tenant, name) for name in LIMIT_FIELDS}


class CallFilterForm(forms.Form):
    status = forms.ChoiceField(required=False, choices=[("", "any status"), *CallStatus.choices])
    tool = forms.ChoiceField(required=False, choices=[("", "any tool")])

    def __init__(self, *args, tenant, **kwargs):
        super().__init__(*args, **kwargs)
        names = (ToolCall.objects.for_tenant(tenant).order_by("tool_name")
                 .values_list("tool_name", flat=True).distinct())
        self.fields["tool"].choices = [("", "any tool"), *((name, name) for name in names)]
