"""Bound arguments (docs/governance.md, docs/api.md): hidden from every schema, merged last, never overridable."""
import pytest

from tests.tools.support import wait_terminal
from tools.calls.pipeline import CALL_STEPS, Validate
from tools.calls.submit import calls_submit
from tools.catalog.schemas import with_bound
from tools.catalog.services import binding_set, session_create
from tools.models import CallStatus

FORMATS = ("openai", "anthropic", "mcp")


def _schemas(client, session, fmt: str) -> dict:
    response = client.get(f"/api/v1/sessions/{session.pk}/tools", {"format": fmt})
    assert response.status_code == 200, response.content
    tools = response.json()["tools"]
    if fmt == "openai":
        assert all(t["type"] == "function" for t in tools)
        return {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    key = "input_schema" if fmt == "anthropic" else "inputSchema"
    return {t["name"]: t[key] for t in tools}


@pytest.mark.parametrize("fmt", FORMATS)
def test_bound_argument_is_absent_from_every_format_including_required(world, echo_tool, fmt):
    binding_set(tenant=world.a.tenant, tool=echo_tool, name="scope", value="tenant-42")
    session = session_create(tenant=world.a.tenant, agent="any-agent")
    schema = _schemas(world.a.client(), session, fmt)[echo_tool.name]
    assert "scope" not in schema["properties"]
    assert "city" in schema["properties"] and "limit" in schema["properties"]
    assert schema["required"] == ["city"]
    assert "tenant-42" not in str(schema)


@pytest.mark.parametrize("fmt", FORMATS)
def test_required_disappears_when_every_required_argument_is_bound(world, echo_tool, fmt):
    binding_set(tenant=world.a.tenant, tool=echo_tool, name="scope", value="s")
    binding_set(tenant=world.a.tenant, tool=echo_tool, name="city", value="Paris")
    session = session_create(tenant=world.a.tenant, agent="any-agent")
    schema = _schemas(world.a.client(), session, fmt)[echo_tool.name]
    assert set(schema["properties"]) == {"limit"}
    assert "required" not in schema or schema["required"] == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_agent_specific_binding_applies_only_to_that_agent(world, fmt):
    # The world binds current_time.timezone for the agent support-bot only.
    bound = session_create(tenant=world.a.tenant, agent="support-bot")
    other = session_create(tenant=world.a.tenant, agent="sales-bot")
    client = world.a.client()
    assert "timezone" not in _schemas(client, bound, fmt)["current_time"]["properties"]
    assert "timezone" in _schemas(client, other, fmt)["current_time"]["properties"]


def test_tool_schema_unchanged_in_the_catalog(world, echo_tool):
    binding_set(tenant=world.a.tenant, tool=echo_tool, name="scope", value="s")
    echo_tool.refresh_from_db()
    assert "scope" in echo_tool.input_schema["properties"]  # only the exposed schema loses it


def _call(client, session, body):
    response = client.post(f"/api/v1/sessions/{session.pk}/calls", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()["calls"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_override_attempt_fails_with_bound_argument_override(world, echo_tool):
    binding_set(tenant=world.a.tenant, tool=echo_tool, name="scope", value="tenant-42")
    session = session_create(tenant=world.a.tenant, agent="any-agent")
    [call] = _call(world.a.client(), session,
                   {"id": "c1", "name": echo_tool.name, "input": {"city": "Paris", "scope": "everything"}})
    assert call["status"] == CallStatus.FAILED
    assert call["error"]["errorType"] == "BoundArgumentOverride"
    assert call["error"]["tool"] == echo_tool.name and call["error"]["callId"] == "c1"
    assert "scope" in call["error"]["error"]
    assert "tenant-42" not in str(call)
    assert call["result"]["state"] == "error"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_tool_receives_the_server_value_and_input_is_not_echoed(world, echo_tool):
    binding_set(tenant=world.a.tenant, tool=echo_tool, name="scope", value="tenant-42")
    binding_set(tenant=world.a.tenant, tool=echo_tool, name="scope", value="agent-only", agent="special")
    plain = session_create(tenant=world.a.tenant, agent="any-agent")
    special = session_create(tenant=world.a.tenant, agent="special")
    client = world.a.client()
    [first] = _call(client, plain, {"name": echo_tool.name, "input": {"city": "Paris"}, "wait": 10})
    [second] = _call(client, special, {"name": echo_tool.name, "input": {"city": "Rome", "limit": 1}, "wait": 10})
    first = wait_terminal(first["id"], tenant=world.a.tenant)
    second = wait_terminal(second["id"], tenant=world.a.tenant)
    assert first.status == CallStatus.SUCCEEDED, first.error
    assert first.result["structured"] == {"city": "Paris", "scope": "tenant-42", "limit": 3, "agent": "any-agent"}
    assert second.result["structured"] == {"city": "Rome", "scope": "agent-only", "limit": 1, "agent": "special"}
    assert first.input == {"city": "Paris"}
    assert first.effective_input == {"city": "Paris", "scope": "tenant-42"}
    detail = client.get(f"/api/v1/calls/{first.pk}")
    assert detail.status_code == 200
    assert detail.json()["input"] == {"city": "Paris"}
    assert "effective_input" not in detail.json()


# --- "server values are merged last", on its own ------------------------------------------------------
# The validate step refuses input that names a bound argument, which would hide a merge done the wrong way
# round; these hold the merge itself.

def test_a_bound_value_wins_over_the_same_name_in_any_case_or_composition():
    sent = {"TimeZone": "Mars/Olympus", "ＴＩＭＥＺＯＮＥ": "x", "city": "Paris"}
    merged = with_bound(sent, {"timezone": "Asia/Tokyo"})
    assert merged == {"city": "Paris", "timezone": "Asia/Tokyo"}
    assert with_bound({"timezone": "Europe/Paris"}, {"timezone": "Asia/Tokyo"}) == {"timezone": "Asia/Tokyo"}
    assert with_bound({"city": "Paris"}, {}) == {"city": "Paris"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_server_values_are_merged_last_with_the_validate_step_taken_out(world, settings, request):
    without_validate = CALL_STEPS.replaced([s for s in CALL_STEPS.classes() if s is not Validate])
    without_validate.__enter__()
    request.addfinalizer(lambda: without_validate.__exit__(None, None, None))
    [call] = calls_submit(session=world.a.session, calls=[  # support-bot's current_time has timezone bound
        {"name": "current_time", "input": {"timezone": "Europe/Paris"}}])
    assert call.effective_input == {"timezone": "Asia/Tokyo"}, (call.status, call.error)
    finished = wait_terminal(call.pk, tenant=world.a.tenant)
    assert finished.status == CallStatus.SUCCEEDED and "Asia/Tokyo" in str(finished.result)
    assert "Europe/Paris" not in str(finished.result)
