"""Request-scoped tools: an app declares schema-only tools for its session or for one request, added to the
session's surface or replacing it. Their calls are governed like any (an ask asks, a deny denies) and come back
to the app as external calls it completes with its agent key.

`POST …/calls` has an async front that reads committed data only, so the tests through it are transactional
(and few); the others submit with the services that endpoint calls (`request_declarations`, `calls_submit`).
"""
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.services import default_queue, external_calls_expire, rule_create
from tenancy.models import Role
from tests.approvals.conftest import console_api
from tools.api.serializers import calls_data
from tools.calls.submit import calls_submit
from tools.catalog.declared import request_declarations
from tools.models import AgentSession, CallStatus, ToolCall

ORDER_TOOL = {
    "name": "lookup_order",
    "description": "Look an order up in the shop's back office.",
    "input_schema": {"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]},
}
pytestmark = pytest.mark.usefixtures("fresh_rule_index")

REFUND_TOOL = {"name": "refund_order", "description": "Refund an order.",
               "input_schema": {"properties": {"order": {"type": "string"}, "cents": {"type": "integer"}}}}


def create_session(client, **body) -> dict:
    response = client.post("/api/v1/sessions", {"agent": "shop-bot", **body}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def tool_names(client, session_id, fmt="openai") -> list[str]:
    response = client.get(f"/api/v1/sessions/{session_id}/tools", {"format": fmt})
    assert response.status_code == 200, response.content
    return [t["function"]["name"] if fmt == "openai" else t["name"] for t in response.json()["tools"]]


def submit(world, session_id, calls: list[dict], tools=None, mode="add") -> list[dict]:
    """A request of calls as `POST …/calls` makes it, answered as the endpoint answers."""
    session = AgentSession.objects.for_tenant(world.a.tenant).get(pk=session_id)
    declared = request_declarations(session=session, tools=tools, mode=mode) if tools is not None else None
    return calls_data(calls_submit(session=session, calls=calls, declared=declared))


def http_submit(client, session_id, body) -> list[dict]:
    response = client.post(f"/api/v1/sessions/{session_id}/calls", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()["calls"]


def approve(world, call: dict):
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call_id=call["id"])
    reviewer = console_api(world.a.users[Role.REVIEWER], world.a.tenant)
    response = reviewer.post(f"/api/v1/approvals/{request.pk}/decide", {"decision": "approve"}, format="json")
    assert response.status_code == 200, response.content


def post_result(client, call: dict, text: str = "order 42: shipped"):
    return client.post(f"/api/v1/calls/{call['id']}/result",
                       {"state": "success", "content": [{"type": "text", "text": text}],
                        "structured": {"status": "shipped"}}, format="json")


def fields_of(response) -> dict:
    assert response.status_code == 400, (response.status_code, response.content)
    return response.json()["error"]["fields"]


def row(call: dict, world) -> ToolCall:
    return ToolCall.objects.for_tenant(world.a.tenant).get(pk=call["id"])


def ask_for(world, name: str):
    rule_create(tenant=world.a.tenant, behavior="ask", tool_pattern=name, note="a person checks it")


def completed_after_approval(world, client, call: dict) -> dict:
    """An asked call of a declared tool: approved, then waiting for the app, which posts the result."""
    assert call["status"] == "awaiting_approval" and call["decision"]["behavior"] == "ask"
    approve(world, call)
    assert row(call, world).status == CallStatus.AWAITING_EXTERNAL
    response = post_result(client, call)  # the app's own key: scope `agent`
    assert response.status_code == 200, response.content
    done = response.json()
    assert done["status"] == "succeeded"
    assert done["result"]["content"] == [{"type": "text", "text": "order 42: shipped"}]
    assert done["result"]["structured"] == {"status": "shipped"}
    return done


# --- session level ---------------------------------------------------------------------------------

def test_session_tools_are_added_to_the_surface_in_every_format(world):
    client = world.a.client()
    session = create_session(client, tools=[ORDER_TOOL])
    assert session["tools_mode"] == "add"
    assert [t["name"] for t in session["tools"]] == ["lookup_order"]
    assert client.get(f"/api/v1/sessions/{session['id']}").json() == session
    for fmt in ("openai", "anthropic", "mcp"):
        names = tool_names(client, session["id"], fmt)
        assert "current_time" in names and names[-1] == "lookup_order", fmt
    [anthropic] = [t for t in client.get(f"/api/v1/sessions/{session['id']}/tools", {"format": "anthropic"})
                   .json()["tools"] if t["name"] == "lookup_order"]
    assert anthropic["description"] == ORDER_TOOL["description"]
    assert anthropic["input_schema"]["required"] == ["order"]
    assert anthropic["input_schema"]["additionalProperties"] is False  # takes what it declares, as external tools


def test_session_add_mode_with_an_ask_rule(world):
    ask_for(world, "lookup_order")
    client = world.a.client()
    session = create_session(client, tools=[ORDER_TOOL])
    [call] = submit(world, session["id"], [{"name": "lookup_order", "input": {"order": "42"}}])
    completed_after_approval(world, client, call)
    stored = row(call, world)
    assert stored.tool_id is None
    assert stored.declared_tool["name"] == "lookup_order" and stored.declared_tool["scope"] == "session"
    [clock] = submit(world, session["id"], [{"name": "current_time", "input": {}}])
    assert clock["status"] == "queued"  # the catalog's tools still run beside it


def test_session_replace_mode_hides_the_catalog(world):
    client = world.a.client()
    session = create_session(client, tools=[ORDER_TOOL, REFUND_TOOL], tools_mode="replace")
    for fmt in ("openai", "anthropic", "mcp"):
        assert tool_names(client, session["id"], fmt) == ["lookup_order", "refund_order"]
    assert client.get(f"/api/v1/sessions/{session['id']}/prompt").json() == {"text": ""}
    clock, meta, order = submit(world, session["id"], [
        {"name": "current_time", "input": {}}, {"name": "reset_tools", "input": {"math": True}},
        {"name": "lookup_order", "input": {"order": "42"}}])
    assert clock["status"] == meta["status"] == "failed"
    assert clock["error"]["errorType"] == meta["error"]["errorType"] == "ToolNotAvailable"
    assert order["status"] == "awaiting_external"  # the tenant allows by default
    assert AgentSession.objects.for_tenant(world.a.tenant).get(pk=session["id"]).active_groups == []


def test_the_declared_schema_is_checked(world):
    session = create_session(world.a.client(), tools=[ORDER_TOOL])
    bad, extra = submit(world, session["id"], [{"name": "lookup_order", "input": {"order": 42}},
                                                {"name": "lookup_order", "input": {"order": "42", "note": "x"}}])
    assert bad["status"] == extra["status"] == "failed"
    assert bad["error"]["errorType"] == extra["error"]["errorType"] == "InvalidInput"


def test_a_session_changes_its_declarations_with_patch(world):
    client = world.a.client()
    session = create_session(client)
    assert session["tools"] == [] and "lookup_order" not in tool_names(client, session["id"])
    response = client.patch(f"/api/v1/sessions/{session['id']}", {"tools": [ORDER_TOOL]}, format="json")
    assert response.status_code == 200, response.content
    assert [t["name"] for t in response.json()["tools"]] == ["lookup_order"]
    assert "lookup_order" in tool_names(client, session["id"])
    response = client.patch(f"/api/v1/sessions/{session['id']}", {"tools_mode": "replace"}, format="json")
    assert response.status_code == 200 and response.json()["tools_mode"] == "replace"
    assert tool_names(client, session["id"]) == ["lookup_order"]
    response = client.patch(f"/api/v1/sessions/{session['id']}", {"tools": [], "tools_mode": "add"}, format="json")
    assert response.json()["tools"] == []
    names = tool_names(client, session["id"])
    assert "lookup_order" not in names and "current_time" in names


def test_an_approved_call_needs_its_session_declaration_still(world):
    """Resumed after approval, a session-level call needs its tool still declared, as a catalog call needs its
    tool still visible."""
    ask_for(world, "lookup_order")
    client = world.a.client()
    session = create_session(client, tools=[ORDER_TOOL])
    kept, dropped = submit(world, session["id"], [{"name": "lookup_order", "input": {"order": "1"}},
                                                  {"name": "lookup_order", "input": {"order": "2"}}])
    approve(world, kept)
    client.patch(f"/api/v1/sessions/{session['id']}", {"tools": []}, format="json")
    approve(world, dropped)
    assert row(kept, world).status == CallStatus.AWAITING_EXTERNAL
    assert row(dropped, world).status == CallStatus.FAILED
    assert row(dropped, world).error["errorType"] == "ToolNotAvailable"


# --- request level ---------------------------------------------------------------------------------

def test_request_add_mode_with_an_ask_rule_applies_to_that_request_only(world):
    ask_for(world, "refund_order")
    client = world.a.client()
    session = world.a.session
    refund, clock = submit(world, session.pk, [{"name": "refund_order", "input": {"order": "42", "cents": 500}},
                                               {"name": "current_time", "input": {}}], tools=[REFUND_TOOL])
    assert clock["status"] == "queued"  # the session's own tools stay
    stored = row(refund, world)
    assert stored.declared_tool["scope"] == "request" and stored.declared_tool["name"] == "refund_order"
    completed_after_approval(world, client, refund)
    # The next request did not declare it: neither listed nor callable.
    assert "refund_order" not in tool_names(client, session.pk)
    [later] = submit(world, session.pk, [{"name": "refund_order", "input": {"order": "43"}}])
    assert later["status"] == "failed" and later["error"]["errorType"] == "ToolNotAvailable"


def test_request_replace_mode_with_an_ask_rule(world):
    ask_for(world, "lookup_order")
    client = world.a.client()
    session = world.a.session
    order, clock = submit(world, session.pk, [{"name": "lookup_order", "input": {"order": "42"}},
                                              {"name": "current_time", "input": {}}],
                          tools=[ORDER_TOOL], mode="replace")
    assert clock["status"] == "failed" and clock["error"]["errorType"] == "ToolNotAvailable"
    completed_after_approval(world, client, order)


def test_a_request_adds_to_the_sessions_own_declarations(world):
    client = world.a.client()
    session = create_session(client, tools=[ORDER_TOOL])
    order, refund = submit(world, session["id"], [{"name": "lookup_order", "input": {"order": "1"}},
                                                  {"name": "refund_order", "input": {"order": "1", "cents": 1}}],
                           tools=[REFUND_TOOL])
    assert order["status"] == refund["status"] == "awaiting_external"
    assert row(order, world).declared_tool["scope"] == "session"
    assert row(refund, world).declared_tool["scope"] == "request"


def test_a_replaced_surface_does_not_borrow_a_catalog_namesakes_flags(world):
    """`current_time` is read-only and trusted, so the tenant lets its calls through without asking; a declared
    tool of the same name (replace mode) is the app's own tool and asks like any other."""
    tenant = world.a.tenant
    tenant.default_behavior, tenant.auto_allow_read_only = "ask", True
    tenant.save()
    [clock] = submit(world, world.a.session.pk, [{"name": "current_time", "input": {}}])
    assert clock["status"] == "queued"
    [declared] = submit(world, world.a.session.pk, [{"name": "current_time", "input": {}}],
                        tools=[{"name": "current_time"}], mode="replace")
    assert declared["status"] == "awaiting_approval"
    assert row(declared, world).tool_id is None


def test_replace_mode_may_reuse_a_catalog_name(world):
    session = create_session(world.a.client(), tools=[{"name": "current_time"}], tools_mode="replace")
    [call] = submit(world, session["id"], [{"name": "current_time", "input": {}}])
    assert call["status"] == "awaiting_external"  # the app's tool, not the catalog's
    assert row(call, world).tool_id is None


# --- rules -------------------------------------------------------------------------------------------

def test_a_deny_rule_denies_declared_tools_and_keeps_them_off_the_list(world):
    rule_create(tenant=world.a.tenant, behavior="deny", tool_pattern="refund_*", note="no refunds by bots")
    client = world.a.client()
    session = create_session(client, tools=[ORDER_TOOL, REFUND_TOOL])
    names = tool_names(client, session["id"])
    assert "refund_order" not in names and "lookup_order" in names
    [denied] = submit(world, session["id"], [{"name": "refund_order", "input": {"order": "1"}}])
    assert denied["status"] == "denied" and denied["decision"]["behavior"] == "deny"
    [denied] = submit(world, world.a.session.pk, [{"name": "refund_order", "input": {"order": "1"}}],
                      tools=[REFUND_TOOL])
    assert denied["status"] == "denied"
    assert post_result(client, denied).status_code == 409


# --- declarations refused ----------------------------------------------------------------------------

BAD = [
    ({"tools": "lookup_order"}, "tools"),
    ({"tools": ["lookup_order"]}, "tools[0]"),
    ({"tools": [{"name": "bad name", "input_schema": {}}]}, "tools[0].name"),
    ({"tools": [{"name": "", "input_schema": {}}]}, "tools[0].name"),
    ({"tools": [{"input_schema": {}}]}, "tools[0].name"),
    ({"tools": [{"name": "reset_tools"}]}, "tools[0].name"),
    ({"tools": [ORDER_TOOL, ORDER_TOOL]}, "tools[1].name"),
    ({"tools": [{"name": "x", "input_schema": {"type": "array"}}]}, "tools[0].input_schema"),
    ({"tools": [{"name": "x", "input_schema": {"properties": {"a": {"type": "no-such-type"}}}}]},
     "tools[0].input_schema"),
    ({"tools": [{"name": "x", "input_schema": {"$ref": "https://example.com/s.json"}}]}, "tools[0].input_schema"),
    ({"tools": [{"name": "x", "input_schema": []}]}, "tools[0].input_schema"),
    ({"tools": [{"name": "x", "input_schema": {}, "parameters": {}}]}, "tools[0].input_schema"),
    ({"tools": [{"name": "x", "description": 7}]}, "tools[0].description"),
    ({"tools": [{"name": "x", "description": "d" * 4001}]}, "tools[0].description"),
    ({"tools": [{"name": "x", "run": "rm -rf /"}]}, "tools[0]"),
    ({"tools": [{"name": f"t{i}"} for i in range(65)]}, "tools"),
    ({"tools": [ORDER_TOOL], "tools_mode": "merge"}, "tools_mode"),
    ({"tools": [{"name": "current_time"}]}, "tools[0].name"),  # add mode: a tool of the session
]


@pytest.mark.parametrize(("body", "field"), BAD)
def test_bad_declarations_are_400_with_their_field(world, body, field):
    client = world.a.client()
    before = AgentSession.objects.for_tenant(world.a.tenant).count()
    assert field in fields_of(client.post("/api/v1/sessions", {"agent": "shop-bot", **body}, format="json"))
    assert AgentSession.objects.for_tenant(world.a.tenant).count() == before  # nothing half made
    session = world.a.session
    assert field in fields_of(client.patch(f"/api/v1/sessions/{session.pk}", body, format="json"))
    assert AgentSession.objects.for_tenant(world.a.tenant).get(pk=session.pk).declared_tools == []


def test_openai_style_declarations_are_taken(world):
    session = create_session(world.a.client(), tools=[
        {"type": "function", "function": {"name": "lookup_order", "description": "Find it.",
                                          "parameters": ORDER_TOOL["input_schema"]}},
        {"name": "ping", "parameters": {"type": "object"}}, {"name": "pong"}])
    assert [t["name"] for t in session["tools"]] == ["lookup_order", "ping", "pong"]
    assert session["tools"][0]["input_schema"]["required"] == ["order"]
    [call] = submit(world, session["id"], [{"name": "pong", "input": {}}])
    assert call["status"] == "awaiting_external"


# --- who completes the calls -------------------------------------------------------------------------

def test_an_agent_key_completes_declared_calls_only(world):
    client = world.a.client()
    session = create_session(client)
    declared, other = submit(world, session["id"], [{"name": "lookup_order", "input": {"order": "1"}},
                                                    {"name": "lookup_order", "input": {"order": "2"}}],
                             tools=[ORDER_TOOL])
    # A key locked to another agent does not see the session's calls; an admin key posts no results.
    assert post_result(world.a.client("locked"), declared).status_code == 404
    assert post_result(world.a.client("admin"), declared).status_code == 403
    assert post_result(client, declared).status_code == 200
    assert post_result(client, declared).status_code == 409  # once
    assert post_result(world.a.client("external"), other).status_code == 200  # an external system's key may too
    # A catalog external tool's calls stay the external scope's.
    client_admin = world.a.client("admin")
    assert client_admin.post("/api/v1/tools", {"name": "open_ticket", "input_schema": {}},
                             format="json").status_code == 201
    basic = world.a.groups["basic"]
    client_admin.patch(f"/api/v1/groups/{basic.pk}", {"tools": [*basic.tools.values_list("name", flat=True),
                                                                "open_ticket"]}, format="json")
    [ticket] = submit(world, session["id"], [{"name": "open_ticket", "input": {}}])
    assert ticket["status"] == "awaiting_external"
    assert post_result(client, ticket).status_code == 403
    assert row(ticket, world).status == CallStatus.AWAITING_EXTERNAL


def test_another_tenant_sees_nothing(world):
    [call] = submit(world, world.a.session.pk, [{"name": "lookup_order", "input": {"order": "1"}}],
                    tools=[ORDER_TOOL])
    for label in ("agent", "external"):
        assert post_result(world.b.client(label), call).status_code == 404
    b = world.b.client()
    assert b.patch(f"/api/v1/sessions/{world.a.session.pk}", {"tools": [ORDER_TOOL]},
                   format="json").status_code == 404
    assert row(call, world).status == CallStatus.AWAITING_EXTERNAL
    assert AgentSession.objects.for_tenant(world.a.tenant).get(pk=world.a.session.pk).declared_tools == []


def test_sessions_without_declarations_read_nothing_more(world):
    """The declarations live on the session row every call reads anyway, so a call costs the same statements
    whether its session declares tools or not."""
    client = world.a.client()
    plain = create_session(client)
    declaring = create_session(client, tools=[ORDER_TOOL])
    for session in (plain, declaring):  # warm the catalog snapshot and the rule index
        submit(world, session["id"], [{"name": "todo_write", "input": {"todos": []}}])
    counts = []
    for session in (plain, declaring):
        with CaptureQueriesContext(connection) as captured:
            submit(world, session["id"], [{"name": "todo_write", "input": {"todos": []}}])
        counts.append(len(captured))
    assert counts[0] == counts[1]


# --- through the endpoint (transactional: its async front reads committed data) ------------------------

@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_the_calls_endpoint_takes_declarations_in_both_forms(world):
    ask_for(world, "refund_order")
    client = world.a.client()
    session = world.a.session.pk
    refund, clock = http_submit(client, session, {
        "calls": [{"name": "refund_order", "input": {"order": "42", "cents": 500}},
                  {"name": "current_time", "input": {}}],
        "tools": [REFUND_TOOL], "tools_mode": "add", "wait": 10})
    assert clock["status"] == "succeeded"
    completed_after_approval(world, client, refund)
    assert client.get(f"/api/v1/calls/{refund['id']}").json()["status"] == "succeeded"
    [order] = http_submit(client, session, {"name": "lookup_order", "input": {"order": "1"},
                                            "tools": [ORDER_TOOL], "tools_mode": "replace"})
    assert order["status"] == "awaiting_external"
    [later] = http_submit(client, session, {"name": "lookup_order", "input": {"order": "1"}})
    assert later["error"]["errorType"] == "ToolNotAvailable"
    # Refused declarations: 400 naming the field, and no call recorded.
    calls_before = ToolCall.objects.for_tenant(world.a.tenant).count()
    for body, field in [*BAD, ({"tools_mode": "replace"}, "tools_mode")]:
        for call in ({"name": "x", "input": {}}, {"calls": [{"name": "x", "input": {}}]}):
            response = client.post(f"/api/v1/sessions/{session}/calls", {**call, **body}, format="json")
            assert field in fields_of(response), (body, response.content)
    assert ToolCall.objects.for_tenant(world.a.tenant).count() == calls_before
    # Another tenant's key finds no such session.
    response = world.b.client().post(f"/api/v1/sessions/{session}/calls", {
        "name": "lookup_order", "input": {"order": "1"}, "tools": [ORDER_TOOL]}, format="json")
    assert response.status_code == 404


def test_a_reviewer_edits_a_request_level_call_against_its_declaration(world):
    ask_for(world, "refund_order")
    [refund] = submit(world, world.a.session.pk, [{"name": "refund_order", "input": {"order": "42", "cents": 500}}],
                      tools=[REFUND_TOOL])
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call_id=refund["id"])
    reviewer = console_api(world.a.users[Role.REVIEWER], world.a.tenant)
    refused = reviewer.post(f"/api/v1/approvals/{request.pk}/decide",
                            {"decision": "edit", "input": {"order": "42", "cents": "a lot"}}, format="json")
    assert refused.status_code == 400, refused.content  # checked against the request's declaration
    edited = reviewer.post(f"/api/v1/approvals/{request.pk}/decide",
                           {"decision": "edit", "input": {"order": "42", "cents": 250}}, format="json")
    assert edited.status_code == 200, edited.content
    stored = row(refund, world)
    assert stored.status == CallStatus.AWAITING_EXTERNAL
    assert stored.effective_input == {"order": "42", "cents": 250}


def test_a_declared_call_nobody_completes_expires_like_an_external_one(world):
    queue = default_queue(world.a.tenant)
    queue.expires_after = timedelta(minutes=5)
    queue.save()
    [refund] = submit(world, world.a.session.pk, [{"name": "refund_order", "input": {"order": "42"}}],
                      tools=[REFUND_TOOL])
    assert refund["status"] == "awaiting_external"
    assert external_calls_expire(now=timezone.now()) == 0
    assert external_calls_expire(now=timezone.now() + timedelta(minutes=6)) == 1
    stored = row(refund, world)
    assert stored.status == CallStatus.EXPIRED and stored.error["errorType"] == "ExternalExpired"
