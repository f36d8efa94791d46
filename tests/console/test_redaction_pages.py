"""Console pages of the after-execution steps: redaction rules (admins change them) and a tool's retries and
result cap (a form on the tool's page)."""
import pytest

from audit.models import Event
from tools.models import RedactionRule, Tool

pytestmark = pytest.mark.django_db


def url(world, path: str = "") -> str:
    return f"/t/{world.a.tenant.slug}/redaction-rules/{path}"


def test_an_admin_adds_edits_and_deletes_a_rule(world):
    admin = world.a.console("admin")
    created = admin.post(url(world, "new/"), {"name": "cards", "pattern": r"\d{4}(?: \d{4}){3}",
                                              "replacement": "[card]", "tool_pattern": "*", "enabled": "on"})
    assert created.status_code == 302, created.content.decode()
    rule = RedactionRule.objects.for_tenant(world.a.tenant).get(name="cards")
    listing = admin.get(url(world)).content.decode()
    assert "cards" in listing and "[card]" in listing
    edited = admin.post(url(world, f"{rule.pk}/"), {"name": "cards", "pattern": r"\d{16}", "replacement": "[card]",
                                                    "tool_pattern": "pay_*", "keep_original": "on"})
    assert edited.status_code == 302
    rule.refresh_from_db()
    assert (rule.pattern, rule.tool_pattern, rule.keep_original, rule.enabled) == (r"\d{16}", "pay_*", True, False)
    assert admin.post(url(world, f"{rule.pk}/delete/")).status_code == 302
    assert not RedactionRule.objects.for_tenant(world.a.tenant).exists()
    verbs = list(Event.objects.for_tenant(world.a.tenant).filter(target="redaction_rule:cards").order_by(
        "id").values_list("verb", flat=True))
    assert verbs == ["redaction_rule.created", "redaction_rule.updated", "redaction_rule.deleted"]


def test_an_invalid_pattern_is_shown_on_the_form(world):
    page = world.a.console("admin").post(url(world, "new/"), {"name": "bad", "pattern": r"(a)\1",
                                                              "replacement": "x", "tool_pattern": "*"})
    assert page.status_code == 400
    assert "back-references" in page.content.decode()
    assert not RedactionRule.objects.for_tenant(world.a.tenant).exists()


def test_operators_read_rules_but_do_not_change_them(world):
    operator = world.a.console("operator")
    assert operator.get(url(world)).status_code == 200
    refused = operator.post(url(world, "new/"), {"name": "x", "pattern": "x", "replacement": "", "tool_pattern": "*"})
    assert refused.status_code == 403
    assert not RedactionRule.objects.for_tenant(world.a.tenant).exists()


def test_the_tool_page_sets_retries_and_the_result_cap(world):
    tool = world.a.tools["current_time"]
    Tool.objects.for_tenant(world.a.tenant).filter(pk=tool.pk).update(idempotent=True)
    operator = world.a.console("operator")
    page = operator.get(f"/t/{world.a.tenant.slug}/tools/{tool.pk}/").content.decode()
    assert 'data-form="result-steps"' in page and 'name="retry_max"' in page
    target = f"/t/{world.a.tenant.slug}/tools/{tool.pk}/result-steps/"
    saved = operator.post(target, {"retry_max": "2", "retry_backoff_s": "0.25", "max_result_chars": "5000"})
    assert saved.status_code == 302 and saved["Location"] == f"/t/{world.a.tenant.slug}/tools/{tool.pk}/"
    tool.refresh_from_db()
    assert (tool.retry_max, tool.retry_backoff_s, tool.max_result_chars) == (2, 0.25, 5000)
    refused = operator.post(target, {"retry_max": "99", "retry_backoff_s": "0.25", "max_result_chars": ""})
    assert refused.status_code == 400
    cleared = operator.post(target, {"retry_max": "0", "retry_backoff_s": "0.5", "max_result_chars": ""})
    assert cleared.status_code == 302
    tool.refresh_from_db()
    assert tool.max_result_chars is None


def test_a_tool_that_is_not_idempotent_gets_no_retries(world):
    tool = world.a.tools["current_time"]
    Tool.objects.for_tenant(world.a.tenant).filter(pk=tool.pk).update(idempotent=False)
    page = world.a.console("operator").post(f"/t/{world.a.tenant.slug}/tools/{tool.pk}/result-steps/",
                                            {"retry_max": "1", "retry_backoff_s": "1", "max_result_chars": ""})
    assert page.status_code == 400 and "only an idempotent tool" in page.content.decode()
