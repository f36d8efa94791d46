"""The meta tool reset_tools (docs/governance.md): final-state semantics, all-or-nothing, notes, per-session."""
import pytest

from tools.calls.submit import calls_submit
from tools.catalog.selectors import session_tools, visible_tools
from tools.catalog.services import group_create, group_delete, session_create
from tools.models import AgentSession, CallStatus, ToolGroup


def _reset(session, choices, call_id=None):
    spec = {"name": "reset_tools", "input": choices}
    if call_id:
        spec["id"] = call_id
    [call] = calls_submit(session=session, calls=[spec])
    call.refresh_from_db()
    return call


def _active(session) -> list:
    return AgentSession.objects.for_tenant(session.tenant).get(pk=session.pk).active_groups


def _visible(session) -> set:
    session = AgentSession.objects.for_tenant(session.tenant).get(pk=session.pk)
    return {t.name for t in visible_tools(session)}


@pytest.fixture
def session(world):
    return session_create(tenant=world.a.tenant, agent="planner", user="u@example.com")


def test_final_state_semantics(session):
    assert _active(session) == []
    call = _reset(session, {"math": True, "ops": True})
    assert call.status == CallStatus.SUCCEEDED
    assert sorted(_active(session)) == ["math", "ops"]
    assert {"calculate", "countdown"} <= _visible(session)

    call = _reset(session, {"math": True})  # ops not named: deactivated
    assert call.status == CallStatus.SUCCEEDED
    assert _active(session) == ["math"]
    assert call.result["structured"]["deactivated"] == ["ops"]
    assert "countdown" not in _visible(session) and "calculate" in _visible(session)

    call = _reset(session, {"math": False, "ops": False})
    assert _active(session) == []
    assert {"calculate", "countdown"}.isdisjoint(_visible(session))

    _reset(session, {"ops": True})
    _reset(session, {})
    assert _active(session) == []


def test_notes_of_newly_activated_groups_are_returned(session):
    call = _reset(session, {"math": True})
    structured = call.result["structured"]
    assert structured["activated"] == ["math"]
    assert structured["notes"] == {"math": "Use calculate for arithmetic."}
    assert "Use calculate for arithmetic." in call.result["content"][0]["text"]
    again = _reset(session, {"math": True, "ops": True})  # math was already on: no notes again
    assert again.result["structured"]["activated"] == ["ops"]
    assert "math" not in again.result["structured"]["notes"]


@pytest.mark.parametrize("choices, mentioned", [
    ({"math": False, "nope": True}, "nope"),
    ({"math": "yes"}, "math"),
    ({"math": 1}, "math"),
    ({"math": None}, "math"),
])
def test_invalid_input_changes_nothing_and_says_why(session, choices, mentioned):
    _reset(session, {"math": True})
    call = _reset(session, choices)
    assert call.status == CallStatus.FAILED
    assert call.error["errorType"] == "InvalidInput"
    assert mentioned in call.error["error"]
    assert call.error["tool"] == "reset_tools"
    assert call.result["state"] == "error"
    assert _active(session) == ["math"]


def test_non_object_input_is_refused(world, session):
    from rest_framework.exceptions import ValidationError

    from tools.api.serializers import CallSpecSerializer

    spec = CallSpecSerializer(data={"name": "reset_tools", "input": ["math"]})
    with pytest.raises(ValidationError):
        spec.is_valid(raise_exception=True)
    assert _active(session) == []


def test_two_sessions_of_one_agent_never_share_activation(world):
    first = session_create(tenant=world.a.tenant, agent="twin")
    second = session_create(tenant=world.a.tenant, agent="twin")
    _reset(first, {"math": True})
    assert _active(first) == ["math"]
    assert _active(second) == []
    assert "calculate" in _visible(first)
    assert "calculate" not in _visible(second)
    _reset(second, {"ops": True})
    assert _active(first) == ["math"]
    assert _active(second) == ["ops"]


def _reset_schema(session) -> dict:
    session = AgentSession.objects.for_tenant(session.tenant).get(pk=session.pk)
    [tool] = [t for t in session_tools(session, "anthropic") if t["name"] == "reset_tools"]
    return tool["input_schema"]


def test_non_switchable_groups_are_not_in_its_schema(world, session):
    managed = group_create(tenant=world.a.tenant, name="managed", switchable=False, default_active=True,
                           tools=[world.a.tools["countdown"]])
    group_create(tenant=world.a.tenant, name="managed-off", switchable=False, default_active=False,
                 tools=[world.a.tools["calculate"]])
    schema = _reset_schema(session)
    switchable = set(ToolGroup.objects.for_tenant(world.a.tenant).filter(switchable=True).exclude(name="basic")
                     .values_list("name", flat=True))
    assert {"math", "ops"} <= switchable
    assert set(schema["properties"]) == switchable
    assert {"managed", "managed-off", "basic"}.isdisjoint(schema["properties"])
    assert all(p["type"] == "boolean" for p in schema["properties"].values())
    assert schema.get("additionalProperties") is False
    assert "countdown" in _visible(session)  # operator-managed and on
    assert "calculate" not in _visible(session)  # operator-managed and off
    call = _reset(session, {managed.name: False})
    assert call.status == CallStatus.FAILED
    assert call.error["errorType"] == "InvalidInput"
    assert "countdown" in _visible(session)


def test_reset_tools_hidden_without_switchable_groups(world, session):
    for group in ToolGroup.objects.for_tenant(world.a.tenant).filter(switchable=True).exclude(name="basic"):
        group_delete(group=group)
    assert "reset_tools" not in _visible(session)
    call = _reset(session, {})
    assert call.status == CallStatus.FAILED
    assert call.error["errorType"] == "ToolNotAvailable"


def test_a_tool_of_an_inactive_group_is_not_available(session):
    [call] = calls_submit(session=session, calls=[{"name": "calculate", "input": {"expression": "1+1"}}])
    assert call.status == CallStatus.FAILED
    assert call.error["errorType"] == "ToolNotAvailable"
    assert call.error["tool"] == "calculate"
    _reset(session, {"math": True})
    session.refresh_from_db()
    [call] = calls_submit(session=session, calls=[{"name": "calculate", "input": {"expression": "1+1"}}])
    assert call.status == CallStatus.QUEUED  # visible now: dispatched to the executor
    _reset(session, {})
    session.refresh_from_db()
    [call] = calls_submit(session=session, calls=[{"name": "calculate", "input": {"expression": "2+2"}}])
    assert call.status == CallStatus.FAILED
    assert call.error["errorType"] == "ToolNotAvailable"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_reset_tools_through_the_api(world):
    client = world.a.client()
    created = client.post("/api/v1/sessions", {"agent": "planner"}, format="json")
    assert created.status_code == 201
    sid = created.json()["id"]
    tools = client.get(f"/api/v1/sessions/{sid}/tools").json()["tools"]
    assert "reset_tools" in {t["function"]["name"] for t in tools}
    response = client.post(f"/api/v1/sessions/{sid}/calls", {"name": "reset_tools", "input": {"math": True}},
                           format="json")
    assert response.status_code == 200
    [call] = response.json()["calls"]
    assert call["status"] == "succeeded"
    assert call["result"]["structured"]["notes"] == {"math": "Use calculate for arithmetic."}
    assert client.get(f"/api/v1/sessions/{sid}").json()["active_groups"] == ["math"]
    prompt = client.get(f"/api/v1/sessions/{sid}/prompt").json()["text"]
    assert "Use calculate for arithmetic." in prompt
    bad = client.post(f"/api/v1/sessions/{sid}/calls", {"name": "reset_tools", "input": {"nope": True}},
                      format="json").json()["calls"][0]
    assert bad["status"] == "failed" and bad["error"]["errorType"] == "InvalidInput"
    assert client.get(f"/api/v1/sessions/{sid}").json()["active_groups"] == ["math"]
