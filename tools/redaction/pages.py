"""Console pages of the after-execution steps: the tenant's redaction rules, and a tool's retries and result cap
(a form on the tool's page)."""
from django import forms
from django.shortcuts import render

from tenancy.editing import ObjectDeleteView, ObjectFormView
from tenancy.web import ADMIN, TenantForm, tenant_view
from tools.catalog import services as tool_services
from tools.models import RedactionRule
from tools.redaction import rules as redaction


class RedactionRuleForm(TenantForm):
    name = forms.CharField(max_length=64)
    pattern = forms.CharField(
        max_length=redaction.MAX_PATTERN_CHARS, strip=False,
        help_text="A regular expression (RE2: no back-references or look-around), e.g. [\\w.+-]+@[\\w-]+\\.[\\w.]+")
    replacement = forms.CharField(max_length=redaction.MAX_REPLACEMENT_CHARS, required=False, strip=False,
                                  initial="[redacted]", help_text="What each match becomes, literally.")
    tool_pattern = forms.CharField(max_length=redaction.MAX_TOOL_PATTERN_CHARS, initial="*",
                                   help_text="A tool name, or a pattern with *, e.g. mcp__crm__*.")
    keep_original = forms.BooleanField(
        required=False, help_text="Keep the unredacted result (encrypted, shown to admins) when only rules that "
                                  "allow it matched.")
    enabled = forms.BooleanField(required=False, initial=True)

    def initial_for(self, rule) -> dict:
        return {name: getattr(rule, name) for name in redaction.FIELDS}


class ToolResultStepsForm(TenantForm):
    retry_max = forms.IntegerField(min_value=0, max_value=10, label="Retries",
                                   help_text="Runs again after a transient error (idempotent tools only).")
    retry_backoff_s = forms.FloatField(min_value=0, max_value=300, label="First wait (s)",
                                       help_text="Doubled before each next retry.")
    max_result_chars = forms.IntegerField(min_value=100, max_value=10_000_000, required=False,
                                          label="Result cap (characters)",
                                          help_text="Empty: the platform's cap. Longer text is cut with a note.")

    def initial_for(self, tool) -> dict:
        return {"retry_max": tool.retry_max, "retry_backoff_s": tool.retry_backoff_s,
                "max_result_chars": tool.max_result_chars}


@tenant_view()
def redaction_rule_list(request):
    rules = RedactionRule.objects.for_tenant(request.tenant)
    return render(request, "console/redaction_rule_list.html", {"rules": rules})


redaction_rule_create = ObjectFormView.as_view(
    form_class=RedactionRuleForm, service=redaction.redaction_rule_create,
    template_name="console/redaction_rule_form.html", success_url="console:redaction_rule_list",
    success_message="Redaction rule {object.name} created.", read=ADMIN, write=ADMIN)
redaction_rule_edit = ObjectFormView.as_view(
    form_class=RedactionRuleForm, service=redaction.redaction_rule_update,
    template_name="console/redaction_rule_form.html", success_url="console:redaction_rule_list",
    success_message="Redaction rule {object.name} saved.", read=ADMIN, write=ADMIN)
redaction_rule_delete = ObjectDeleteView.as_view(
    service=redaction.redaction_rule_delete, template_name="console/redaction_rule_delete.html",
    success_url="console:redaction_rule_list", success_message="Redaction rule {object.name} deleted.",
    read=ADMIN, write=ADMIN)
tool_result_steps = ObjectFormView.as_view(
    form_class=ToolResultStepsForm, service=tool_services.tool_update,
    template_name="console/redaction_tool_steps.html", success_url="console:tool_detail",
    success_params=(("tool_id", "pk"),), success_message="Retries and result cap of {object.name} saved.")
