"""The app-facing session API (docs/api.md): shapes apps depend on."""
import pytest

from tools.calls.submit import calls_submit
from tools.catalog.services import group_update, session_create
from tools.models import ToolGroup


def test_create_and_read_a_session(world):
    client = world.a.client()
    response = client.post("/api/v1/sessions", {"agent": "support-bot", "user": "alice@example.com",
                                                "context": {"ticket": 42}}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert {"id", "agent", "user", "active_groups", "created_at"} <= set(body)
    assert body["agent"] == "support-bot" and body["user"] == "alice@example.com"
    assert body["active_groups"] == []
    detail = client.get(f"/api/v1/sessions/{body['id']}")
    assert detail.status_code == 200
    assert detail.json() == body


def test_default_active_switchable_groups_start_active(world):
    group_update(group=world.a.groups["math"], default_active=True)
    body = world.a.client().post("/api/v1/sessions", {"agent": "x"}, format="json").json()
    assert body["active_groups"] == ["math"]


def _tools(client, session, fmt=None):
    params = {"format": fmt} if fmt else {}
    response = client.get(f"/api/v1/sessions/{session.pk}/tools", params)
    assert response.status_code == 200
    return response.json()["tools"]


def test_tool_formats(world):
    session = session_create(tenant=world.a.tenant, agent="fmt")
    client = world.a.client()
    default = _tools(client, session)
    openai = _tools(client, session, "openai")
    assert default == openai
    assert all(set(t) == {"type", "function"} and set(t["function"]) == {"name", "description", "parameters"}
               for t in openai)
    names = [t["function"]["name"] for t in openai]
    assert {"current_time", "todo_write", "reset_tools"} <= set(names)
    assert "calculate" not in names  # the math group is off
    anthropic = _tools(client, session, "anthropic")
    assert all(set(t) == {"name", "description", "input_schema"} for t in anthropic)
    mcp = _tools(client, session, "mcp")
    assert all(set(t) == {"name", "description", "inputSchema", "annotations"} for t in mcp)
    by_name = {t["name"]: t for t in mcp}
    assert by_name["current_time"]["annotations"]["readOnlyHint"] is True
    assert [t["name"] for t in anthropic] == [t["name"] for t in mcp] == names
    schemas = {t["name"]: t["input_schema"] for t in anthropic}
    assert schemas["current_time"] == by_name["current_time"]["inputSchema"]


def test_disabled_tools_disappear(world):
    session = session_create(tenant=world.a.tenant, agent="fmt")
    tool = world.a.tools["todo_write"]
    response = world.a.client("admin").patch(f"/api/v1/tools/{tool.pk}", {"enabled": False}, format="json")
    assert response.status_code == 200
    assert "todo_write" not in {t["name"] for t in _tools(world.a.client(), session, "mcp")}
    [call] = calls_submit(session=session, calls=[{"name": "todo_write", "input": {"todos": []}}])
    assert call.error["errorType"] == "ToolNotAvailable"


def test_prompt(world):
    session = session_create(tenant=world.a.tenant, agent="p")
    client = world.a.client()
    text = client.get(f"/api/v1/sessions/{session.pk}/prompt").json()["text"]
    assert "reset_tools" in text and "math" in text
    assert "Use calculate for arithmetic." not in text  # notes only for active groups
    calls_submit(session=session, calls=[{"name": "reset_tools", "input": {"math": True}}])
    text = client.get(f"/api/v1/sessions/{session.pk}/prompt").json()["text"]
    assert "Use calculate for arithmetic." in text


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_call_shape(world):
    client = world.a.client()
    response = client.post(f"/api/v1/sessions/{world.a.session.pk}/calls",
                           {"id": "shape", "name": "current_time", "input": {}, "wait": 10}, format="json")
    assert response.status_code == 200
    [call] = response.json()["calls"]
    assert set(call) == {"id", "call_id", "session", "tool", "input", "status", "decision", "result", "error",
                         "approval", "question", "created_at", "finished_at", "trace_id"}
    assert call["question"] is None  # only a call awaiting its user carries one (docs/api.md)
    assert call["call_id"] == "shape" and call["tool"] == "current_time" and call["input"] == {}
    assert call["status"] == "succeeded" and call["trace_id"] is None  # tracing is off here
    assert set(call["decision"]) >= {"behavior", "rule", "reason"}
    assert call["result"]["state"] == "success"
    assert call["result"]["structured"]["timezone"] == "Asia/Tokyo"  # the world's binding for support-bot
    assert call["error"] is None
    detail = client.get(f"/api/v1/calls/{call['id']}")
    assert detail.status_code == 200
    assert detail.json()["id"] == call["id"] and detail.json()["status"] == "succeeded"


def test_group_listing_is_paginated(world):
    for i in range(3):
        ToolGroup.objects.create(tenant=world.a.tenant, name=f"g{i}")
    body = world.a.client("admin").get("/api/v1/groups", {"limit": 2}).json()
    assert body["count"] == len(world.a.groups) + 3
    assert len(body["results"]) == 2
