"""The shipped built-ins: current_time and todo_write."""
import pytest

from tests.tools.support import wait_terminal
from tools.catalog.services import session_create
from tools.models import AgentSession, CallStatus
from tools.python.decorators import ToolError, python_tool


def test_current_time_in_a_zone():
    value = python_tool("current_time")({"timezone": "UTC"})
    assert value["timezone"] == "UTC"
    assert value["utc_offset"] == "+0000"
    assert value["iso"].endswith("+00:00")
    assert python_tool("current_time")({})["timezone"] == "UTC"


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "../../etc/passwd", "", "Europe/", "/etc/localtime"])
def test_current_time_with_a_bad_zone_is_a_clear_tool_error(zone):
    with pytest.raises(ToolError) as raised:
        python_tool("current_time")({"timezone": zone})
    assert raised.value.error_type == "InvalidTimezone"
    assert "IANA" in str(raised.value)


def test_current_time_schema_from_the_decorator(world):
    tool = world.a.tools["current_time"]
    assert tool.source == "builtin"
    assert tool.read_only and tool.idempotent
    assert tool.description == "The current date and time in a time zone."
    prop = tool.input_schema["properties"]["timezone"]
    assert prop["type"] == "string" and prop["default"] == "UTC"
    assert "IANA" in prop["description"]
    assert "required" not in tool.input_schema


def test_todo_write_schema(world):
    tool = world.a.tools["todo_write"]
    assert not tool.concurrency_safe
    schema = tool.input_schema
    assert schema["required"] == ["todos"]
    assert "ctx" not in schema["properties"]
    assert "Args:" not in tool.description and "Send the whole list" in tool.description


def _submit(client, session, body):
    response = client.post(f"/api/v1/sessions/{session.pk}/calls", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()["calls"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_current_time_bad_zone_through_the_pipeline(world):
    session = session_create(tenant=world.a.tenant, agent="clock")  # no binding for this agent
    [call] = _submit(world.a.client(), session, {"id": "tz", "name": "current_time",
                                                 "input": {"timezone": "Nowhere/Land"}, "wait": 10})
    call = wait_terminal(call["id"], tenant=world.a.tenant)
    assert call.status == CallStatus.FAILED
    assert call.error["errorType"] == "InvalidTimezone"
    assert call.error["tool"] == "current_time" and call.error["callId"] == "tz"
    assert "Nowhere/Land" in call.error["error"]
    assert "Traceback" not in str(call.error)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_todo_write_replaces_the_whole_list(world):
    session = session_create(tenant=world.a.tenant, agent="planner")
    other = session_create(tenant=world.a.tenant, agent="planner")
    client = world.a.client()
    first = [{"content": "Read the ticket", "status": "completed"},
             {"content": "Draft a reply", "status": "in_progress"},
             {"content": "Send it", "status": "pending"}]
    [call] = _submit(client, session, {"name": "todo_write", "input": {"todos": first}, "wait": 10})
    call = wait_terminal(call["id"], tenant=world.a.tenant)
    assert call.status == CallStatus.SUCCEEDED, call.error
    assert call.result["structured"]["counts"] == {"pending": 1, "in_progress": 1, "completed": 1}
    stored = AgentSession.objects.for_tenant(world.a.tenant).get(pk=session.pk).state
    assert stored["todos"] == first

    second = [{"content": "Send it", "status": "in_progress"}]
    [call] = _submit(client, session, {"name": "todo_write", "input": {"todos": second}, "wait": 10})
    assert wait_terminal(call["id"], tenant=world.a.tenant).status == CallStatus.SUCCEEDED
    assert AgentSession.objects.for_tenant(world.a.tenant).get(pk=session.pk).state["todos"] == second

    [call] = _submit(client, session, {"name": "todo_write", "input": {"todos": []}, "wait": 10})
    assert wait_terminal(call["id"], tenant=world.a.tenant).status == CallStatus.SUCCEEDED
    assert AgentSession.objects.for_tenant(world.a.tenant).get(pk=session.pk).state["todos"] == []
    assert "todos" not in AgentSession.objects.for_tenant(world.a.tenant).get(pk=other.pk).state


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_todo_write_refuses_bad_lists_and_keeps_the_old_one(world):
    session = session_create(tenant=world.a.tenant, agent="planner")
    client = world.a.client()
    good = [{"content": "Only task", "status": "pending"}]
    [call] = _submit(client, session, {"name": "todo_write", "input": {"todos": good}, "wait": 10})
    assert wait_terminal(call["id"], tenant=world.a.tenant).status == CallStatus.SUCCEEDED
    bad_inputs = [
        {"todos": [{"content": "a", "status": "in_progress"}, {"content": "b", "status": "in_progress"}]},
        {"todos": [{"content": "a", "status": "someday"}]},
        {"todos": [{"content": "", "status": "pending"}]},
        {"todos": "not a list"},
    ]
    for bad in bad_inputs:
        [call] = _submit(client, session, {"name": "todo_write", "input": bad, "wait": 10})
        call = wait_terminal(call["id"], tenant=world.a.tenant)
        assert call.status == CallStatus.FAILED, bad
        assert call.error["errorType"] == "InvalidInput", call.error
    assert AgentSession.objects.for_tenant(world.a.tenant).get(pk=session.pk).state["todos"] == good
