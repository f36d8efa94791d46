"""External tools (docs/calls.md, docs/governance.md; docs/api.md): operators define schema-only tools; their calls
wait in
`awaiting_external` until a system posts the result with an `external`-scoped key (or a person answers)."""
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest, Queue
from approvals.services import call_respond, queue_save, requests_expire_due
from audit.models import Event
from tenancy.models import Role
from tests.approvals.conftest import console_api
from tests.tools.support import poll
from tools.api.serializers import call_data
from tools.calls.submit import calls_submit
from tools.models import CallStatus, Tool, ToolCall, ToolGroup, ToolSource

TICKET_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string", "minLength": 1}, "priority": {"enum": ["low", "high"]}},
    "required": ["title"],
    "additionalProperties": False,
}


@pytest.fixture
def ticket_tool(world):
    """`open_ticket`, defined through the API by an admin key and put in the basic group."""
    admin = world.a.client("admin")
    response = admin.post("/api/v1/tools", {"name": "open_ticket", "description": "Open a ticket in the helpdesk.",
                                            "input_schema": TICKET_SCHEMA}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["source"] == "external" and body["name"] == "open_ticket"
    basic = ToolGroup.objects.for_tenant(world.a.tenant).get(name="basic")
    tools = [t.name for t in basic.tools.all()] + ["open_ticket"]
    patched = admin.patch(f"/api/v1/groups/{basic.pk}", {"tools": tools}, format="json")
    assert patched.status_code == 200, patched.content
    return Tool.objects.for_tenant(world.a.tenant).get(name="open_ticket")


def open_ticket(world, title: str = "Printer on fire", session=None) -> ToolCall:
    [call] = calls_submit(session=session or world.a.session,
                          calls=[{"name": "open_ticket", "input": {"title": title, "priority": "high"}}])
    return call


def post_result(client, call, body):
    return client.post(f"/api/v1/calls/{call.pk}/result", body, format="json")


def fresh(call) -> ToolCall:
    return ToolCall.objects.for_tenant(call.tenant_id).get(pk=call.pk)


def assert_error(response, status: int) -> dict:
    assert response.status_code == status, (response.status_code, response.content)
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "fields"}, body
    return body["error"]


# --- defining external tools -------------------------------------------------------------------

def test_defined_tool_is_in_the_catalog_with_its_schema(world, ticket_tool):
    assert ticket_tool.source == ToolSource.EXTERNAL
    assert ticket_tool.input_schema["required"] == ["title"]
    session_tools = world.a.client("agent").get(f"/api/v1/sessions/{world.a.session.pk}/tools",
                                                {"format": "anthropic"}).json()["tools"]
    [shown] = [t for t in session_tools if t["name"] == "open_ticket"]
    assert shown["description"] == "Open a ticket in the helpdesk."
    assert shown["input_schema"]["properties"]["priority"] == {"enum": ["low", "high"]}


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "bad name!", "input_schema": {"type": "object"}}, "name"),
    ({"name": "calculate", "input_schema": {"type": "object"}}, "name"),
    ({"name": "x", "input_schema": {"type": "array"}}, "input_schema"),
    ({"name": "x", "input_schema": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}},
     "input_schema"),
    ({"name": "x"}, "input_schema"),
    ({"input_schema": {"type": "object"}}, "name"),
])
def test_invalid_definitions_are_field_errors(world, body, field):
    response = world.a.client("admin").post("/api/v1/tools", body, format="json")
    error = assert_error(response, 400)
    assert field in error["fields"], error


def test_only_admins_define_tools(world):
    for label in ("agent", "external"):
        response = world.a.client(label).post("/api/v1/tools", {"name": "x", "input_schema": {"type": "object"}},
                                              format="json")
        assert_error(response, 403)
    assert not Tool.objects.for_tenant(world.a.tenant).filter(name="x").exists()


# --- awaiting_external and the result ------------------------------------------------------------

def test_call_waits_for_an_external_result(world, ticket_tool):
    call = open_ticket(world)
    assert call.status == CallStatus.AWAITING_EXTERNAL
    assert call.decision["behavior"] == "allow"
    response = post_result(world.a.client("external"), call, {
        "state": "success", "content": [{"type": "text", "text": "Ticket #42 opened"}], "structured": {"ticket": 42}})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "succeeded"
    assert body["result"] == {"state": "success", "content": [{"type": "text", "text": "Ticket #42 opened"}],
                              "structured": {"ticket": 42}}
    assert body["error"] is None
    assert fresh(call).status == CallStatus.SUCCEEDED
    assert Event.objects.for_tenant(world.a.tenant).filter(target=f"call:{call.pk}", verb="call.responded").exists()


def test_an_error_result_fails_the_call_with_a_structured_error(world, ticket_tool):
    call = open_ticket(world)
    response = post_result(world.a.client("external"), call, {
        "state": "error", "content": [{"type": "text", "text": "helpdesk is down"}]})
    assert response.status_code == 200, response.content
    shown = response.json()
    assert shown["status"] == "failed"
    assert shown["error"] == {"errorType": "ExternalError", "error": "helpdesk is down", "tool": "open_ticket",
                              "callId": call.call_id}


def test_an_error_results_status_event_carries_the_error_beside_the_responder(world, ticket_tool):
    """As for every failed call: the status event that settles it tells watchers why."""
    call = open_ticket(world)
    post_result(world.a.client("external"), call, {"state": "error", "content": [{"type": "text", "text": "down"}]})
    events = world.a.client().get(f"/api/v1/calls/{call.pk}/events").json()["events"]
    settled = [event for event in events if event["kind"] == "status"][-1]
    assert settled["data"] == {"status": "failed", "error": fresh(call).error, "responder": "apikey:external"}


@pytest.mark.parametrize("label", ["agent", "admin", "locked"])
def test_a_key_without_the_external_scope_is_refused(world, ticket_tool, label):
    call = open_ticket(world)
    response = post_result(world.a.client(label), call, {"state": "success", "content": []})
    assert_error(response, 403)
    assert fresh(call).status == CallStatus.AWAITING_EXTERNAL


def test_console_viewer_cannot_post_results(world, ticket_tool):
    call = open_ticket(world)
    response = post_result(console_api(world.a.users[Role.VIEWER], world.a.tenant), call,
                           {"state": "success", "content": []})
    assert_error(response, 403)
    assert fresh(call).status == CallStatus.AWAITING_EXTERNAL


def test_posting_to_a_call_not_awaiting_a_result_is_a_conflict(world, ticket_tool):
    external = world.a.client("external")
    call = open_ticket(world)
    assert post_result(external, call, {"state": "success", "content": []}).status_code == 200
    again = post_result(external, call, {"state": "success", "content": [{"type": "text", "text": "again"}]})
    assert assert_error(again, 409)["code"] == "conflict"
    assert fresh(call).result["content"] == []
    # a python tool's call is never awaiting a result
    [calc] = calls_submit(session=world.a.session, calls=[{"name": "calculate", "input": {"expression": "1+1"}}])
    assert_error(post_result(external, calc, {"state": "success", "content": []}), 409)
    # nor is a call still waiting for approval
    world.a.tenant.default_behavior = "ask"
    world.a.tenant.save()
    waiting = open_ticket(world)
    assert waiting.status == CallStatus.AWAITING_APPROVAL
    assert_error(post_result(external, waiting, {"state": "success", "content": []}), 409)
    assert fresh(waiting).status == CallStatus.AWAITING_APPROVAL


def test_posting_to_an_unknown_call_is_404(world):
    response = world.a.client("external").post("/api/v1/calls/not-a-uuid/result", {"state": "success"},
                                               format="json")
    assert_error(response, 404)
    response = world.a.client("external").post("/api/v1/calls/00000000-0000-0000-0000-000000000000/result",
                                               {"state": "success"}, format="json")
    assert_error(response, 404)


@pytest.mark.parametrize(("body", "field"), [
    ({}, "state"),
    ({"state": "maybe"}, "state"),
    ({"state": "success", "content": "done"}, "content"),
    ({"state": "success", "content": [{"type": "image", "data": "x"}]}, "content"),
    ({"state": "success", "content": [{"type": "text", "text": 5}]}, "content"),
    ({"state": "success", "content": ["done"]}, "content"),
])
def test_bad_result_bodies_are_400_in_the_envelope(world, ticket_tool, body, field):
    call = open_ticket(world)
    error = assert_error(post_result(world.a.client("external"), call, body), 400)
    assert field in error["fields"], error
    assert fresh(call).status == CallStatus.AWAITING_EXTERNAL


def test_malformed_json_result_is_400(world, ticket_tool):
    call = open_ticket(world)
    response = world.a.client("external").generic("POST", f"/api/v1/calls/{call.pk}/result", b"{not json",
                                                   content_type="application/json")
    assert_error(response, 400)
    response = world.a.client("external").post(f"/api/v1/calls/{call.pk}/result", ["a", "list"], format="json")
    assert response.status_code == 400, response.content
    assert fresh(call).status == CallStatus.AWAITING_EXTERNAL


def test_schema_invalid_calls_never_wait(world, ticket_tool):
    [call] = calls_submit(session=world.a.session, calls=[{"name": "open_ticket", "input": {"priority": "urgent"}}])
    assert call.status == CallStatus.FAILED
    assert call.error["errorType"] == "InvalidInput"


# --- a person answers ----------------------------------------------------------------------------

def test_a_person_completes_the_task(world, ticket_tool):
    call = open_ticket(world)
    person = world.a.users[Role.REVIEWER]
    call_respond(call=fresh(call), actor=person, message="Opened as HD-7")
    shown = call_data(fresh(call))
    assert shown["status"] == "succeeded"
    assert shown["result"]["content"] == [{"type": "text", "text": "Opened as HD-7"}]
    event = Event.objects.for_tenant(world.a.tenant).get(target=f"call:{call.pk}", verb="call.responded")
    assert event.actor_label == person.username


# --- with approval ---------------------------------------------------------------------------------

def test_external_call_that_needs_approval_waits_for_the_result_after_approval(world, ticket_tool, gov_rule):
    rule = gov_rule("ask", "open_ticket", arg_match={"priority": "high"})
    call = open_ticket(world)
    assert call.status == CallStatus.AWAITING_APPROVAL
    assert call.decision["rule"] == rule.id
    external = world.a.client("external")
    assert_error(post_result(external, call, {"state": "success", "content": []}), 409)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    response = world.a.client("admin").post(f"/api/v1/approvals/{request.pk}/decide", {"decision": "approve"},
                                            format="json")
    assert response.status_code == 200, response.content
    assert fresh(call).status == CallStatus.AWAITING_EXTERNAL
    response = post_result(external, call, {"state": "success", "content": [{"type": "text", "text": "HD-8"}]})
    assert response.status_code == 200, response.content
    assert fresh(call).status == CallStatus.SUCCEEDED
    statuses = [e["data"]["status"] for e in
                world.a.client("agent").get(f"/api/v1/calls/{call.pk}/events").json()["events"]
                if e["kind"] == "status"]
    assert statuses == ["awaiting_approval", "awaiting_external", "succeeded"]


def test_denied_external_calls_never_wait(world, ticket_tool, gov_rule):
    gov_rule("deny", "open_ticket")
    call = open_ticket(world)
    assert call.status == CallStatus.DENIED


# --- expiry ----------------------------------------------------------------------------------------

def test_external_calls_expire_after_the_default_queues_deadline(world, ticket_tool):
    default = Queue.objects.for_tenant(world.a.tenant).get(is_default=True)
    queue_save(tenant=world.a.tenant, queue=default, expires_after=timedelta(hours=1))
    call = open_ticket(world)
    assert requests_expire_due(now=timezone.now() + timedelta(minutes=30)) == 0
    assert fresh(call).status == CallStatus.AWAITING_EXTERNAL
    assert requests_expire_due(now=timezone.now() + timedelta(hours=2)) == 1
    expired = fresh(call)
    assert expired.status == CallStatus.EXPIRED
    assert expired.error["errorType"] == "ExternalExpired"
    assert expired.error["callId"] == call.call_id and expired.error["tool"] == "open_ticket"
    assert_error(post_result(world.a.client("external"), call, {"state": "success", "content": []}), 409)


def test_external_expiry_is_on_the_record(world, ticket_tool):
    """Every transition is audited (docs/governance.md), the expiry of an external call too."""
    default = Queue.objects.for_tenant(world.a.tenant).get(is_default=True)
    queue_save(tenant=world.a.tenant, queue=default, expires_after=timedelta(hours=1))
    call = open_ticket(world)
    requests_expire_due(now=timezone.now() + timedelta(hours=2))
    assert fresh(call).status == CallStatus.EXPIRED
    verbs = list(Event.objects.for_tenant(world.a.tenant).filter(target=f"call:{call.pk}")
                 .values_list("verb", flat=True))
    assert any("expire" in verb for verb in verbs), verbs


def test_external_calls_of_other_tenants_keep_their_own_deadline(world, ticket_tool):
    default_b = Queue.objects.for_tenant(world.b.tenant).get(is_default=True)
    queue_save(tenant=world.b.tenant, queue=default_b, expires_after=timedelta(minutes=1))
    call = open_ticket(world)  # tenant A's default queue has no deadline
    requests_expire_due(now=timezone.now() + timedelta(days=30))
    assert fresh(call).status == CallStatus.AWAITING_EXTERNAL


# --- end to end through the app-facing API -------------------------------------------------------

@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_app_sees_the_external_result(world, ticket_tool):
    app = world.a.client("agent")
    response = app.post(f"/api/v1/sessions/{world.a.session.pk}/calls",
                        {"id": "t1", "name": "open_ticket", "input": {"title": "VPN down"}}, format="json")
    assert response.status_code == 200, response.content
    call = response.json()["calls"][0]
    assert call["status"] == "awaiting_external"
    posted = world.a.client("external").post(f"/api/v1/calls/{call['id']}/result",
                                             {"state": "success", "content": [{"type": "text", "text": "HD-9"}]},
                                             format="json")
    assert posted.status_code == 200, posted.content

    def seen():
        body = app.get(f"/api/v1/calls/{call['id']}").json()
        return body if body["status"] == "succeeded" else None

    body = poll(seen, message="the app to see the result")
    assert body["result"]["content"] == [{"type": "text", "text": "HD-9"}]
