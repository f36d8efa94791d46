"""Results that do not come from the executor — an external system's, a reviewer's answer — pass through the
redaction and cap steps before the model sees them."""
import json

import pytest
from django.test import override_settings

from tests.approvals.test_external import open_ticket, post_result, ticket_tool  # noqa: F401  (fixture)
from tests.tools.test_result_steps import RefuseSecret
from tools.calls import aftercare
from tools.calls.submit import calls_submit
from tools.models import CallStatus, EventKind, ToolCall
from tools.redaction.rules import redaction_rule_create

pytestmark = pytest.mark.django_db

PHONE = "+49 30 1234567"


@pytest.fixture
def phone_rule(world):
    return redaction_rule_create(tenant=world.a.tenant, name="phones", pattern=r"\+\d{2} \d{2} \d{7}",
                                 replacement="[phone]", tool_pattern="open_*")


def log_events(call) -> list[dict]:
    return [e.data for e in call.events.filter(kind=EventKind.LOG).order_by("seq")]


def test_an_external_result_is_redacted_before_the_model_sees_it(world, ticket_tool, phone_rule):  # noqa: F811
    call = open_ticket(world)
    response = post_result(world.a.client("external"), call, {
        "state": "success", "content": [{"type": "text", "text": f"Ticket #7, caller {PHONE}"}],
        "structured": {"ticket": 7, "caller": PHONE}})
    assert response.status_code == 200, response.content
    body = response.json()
    assert PHONE not in json.dumps(body)
    assert body["result"]["structured"] == {"ticket": 7, "caller": "[phone]"}
    stored = ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk)
    assert stored.status == CallStatus.SUCCEEDED and stored.unredacted_result is None
    assert log_events(stored) == [{"step": "redact", "rules": [{"rule": "phones", "replacements": 2}],
                                   "original_kept": False}]


def test_an_external_error_message_is_redacted(world, ticket_tool, phone_rule):  # noqa: F811
    call = open_ticket(world)
    post_result(world.a.client("external"), call, {"state": "error",
                                                    "content": [{"type": "text", "text": f"no line {PHONE}"}]})
    stored = ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk)
    assert stored.status == CallStatus.FAILED
    assert stored.error["error"] == "no line [phone]" and PHONE not in json.dumps(stored.result)


@override_settings(TOOLKEEPER_MAX_RESULT_CHARS=100)
def test_a_reviewers_long_answer_is_capped(world, ticket_tool):  # noqa: F811
    from approvals.services import call_respond

    call = open_ticket(world)
    call_respond(call=call, actor=world.a.users["admin"], message="y" * 250)
    stored = ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk)
    assert stored.result["content"][0]["text"] == ("y" * 100 + "\n[truncated: the result had 250 characters; "
                                                   "the first 100 are shown]")
    assert log_events(stored) == [{"step": "cap", "cap": 100, "chars": 250}]


def test_no_rules_and_a_small_result_add_no_events(world, ticket_tool):  # noqa: F811
    [call] = calls_submit(session=world.a.session, calls=[{"name": "open_ticket", "input": {"title": "t"}}])
    post_result(world.a.client("external"), call, {"state": "success", "content": [{"type": "text", "text": "ok"}]})
    assert log_events(ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk)) == []


@pytest.mark.parametrize(("state", "status"), [("success", CallStatus.SUCCEEDED), ("error", CallStatus.FAILED)])
def test_an_external_answer_keeps_its_original_where_every_rule_allows(world, ticket_tool, state, status):  # noqa: F811
    redaction_rule_create(tenant=world.a.tenant, name="phones-kept", pattern=r"\+\d{2} \d{2} \d{7}",
                          replacement="[phone]", tool_pattern="open_*", keep_original=True)
    call = open_ticket(world)
    posted = {"state": state, "content": [{"type": "text", "text": f"caller {PHONE}"}], "structured": None}
    assert post_result(world.a.client("external"), call, posted).status_code == 200
    stored = ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk)
    assert (stored.status, stored.result["content"]) == (status, [{"type": "text", "text": "caller [phone]"}])
    assert stored.unredacted_result == posted


def test_a_successful_answer_that_a_step_refuses_fails_the_call(world, ticket_tool):  # noqa: F811
    from approvals.services import call_respond

    call = open_ticket(world)
    with aftercare.RESULT_STEPS.replaced([RefuseSecret]):
        call_respond(call=call, actor=world.a.users["operator"], message="the SECRET is out")
    stored = ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk)
    assert stored.status == CallStatus.FAILED
    assert stored.result == {"state": "error", "content": [
        {"type": "text", "text": "Refused: the result said a secret"}], "structured": None}
    assert stored.error["errorType"] == "ExternalError"
