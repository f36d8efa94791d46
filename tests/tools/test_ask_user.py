"""A running Python tool asks its session's user (`ctx.ask_user`, docs/calls.md "Questions for the user"): the
call waits `awaiting_user` with the tool's own question, the app answers over REST and the tool runs on with the
answer; an unanswered question ends at its deadline (the tool hears `cancel`) or at the tool's timeout. Tools run
in a thread and in a process of their own (`isolation="process"`) alike."""
import pytest

from tests.tools import isolated_tools
from tests.tools.support import events_of, submit, wait_status, wait_terminal
from tools.catalog.services import session_create
from tools.models import CallStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("drain_calls")]

ISOLATIONS = ["thread", "process"]


@pytest.fixture
def session(world):
    return session_create(tenant=world.a.tenant, agent="asker", user="ada@example.com")


@pytest.fixture
def asking(make_tool):
    return lambda isolation, **options: make_tool(isolated_tools.ask_for_name, isolation=isolation, **options)


def asked(world, client, session, tool, **arguments) -> dict:
    """Submit a call of `tool` and return it as the API shows it once it waits for its user."""
    [call] = submit(client, session, {"name": tool.name, "input": {"greeting": "Hello", **arguments}, "wait": 30})
    if call["status"] != "awaiting_user":
        wait_status(call["id"], CallStatus.AWAITING_USER, tenant=world.a.tenant)
        call = client.get(f"/api/v1/calls/{call['id']}").json()
    return call


def answer(client, call: dict, action: str, **body):
    return client.post(f"/api/v1/calls/{call['id']}/answer", {"action": action, **body}, format="json")


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_tool_asks_and_gets_the_users_answer(world, session, asking, isolation):
    tool = asking(isolation)
    client = world.a.client("agent")
    call = asked(world, client, session, tool)
    assert call["status"] == "awaiting_user", call
    question = call["question"]
    assert question["kind"] == "tool" and question["tool"] == tool.name
    assert question["message"] == "Hello: what is your name?"
    assert question["requestedSchema"]["properties"]["name"]["type"] == "string" and question["expires_at"]
    response = answer(client, call, "accept", content={"name": "Ada"})
    assert response.status_code == 200, response.content
    assert response.json()["question"] is None
    done = wait_terminal(call["id"], tenant=world.a.tenant)
    assert done.status == CallStatus.SUCCEEDED, done.error
    assert done.result["structured"] == {"heard": "accept", "greeting": "Hello, Ada!"}
    assert answer(client, call, "accept", content={"name": "Bob"}).status_code == 409
    statuses = [e["data"]["status"] for e in events_of(client, call["id"]) if e["kind"] == "status"]
    assert statuses[-3:] == ["awaiting_user", "running", "succeeded"]


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("action", ["decline", "cancel"])
def test_the_tool_hears_a_decline_or_cancel(world, session, asking, isolation, action):
    tool = asking(isolation)
    client = world.a.client("agent")
    call = asked(world, client, session, tool)
    assert answer(client, call, action, content={"name": "never passed on"}).status_code == 200
    done = wait_terminal(call["id"], tenant=world.a.tenant)
    assert done.status == CallStatus.SUCCEEDED, done.error
    assert done.result["structured"] == {"heard": action, "content": None}


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_an_unanswered_question_ends_at_its_deadline(world, session, asking, isolation):
    tool = asking(isolation)
    client = world.a.client("agent")
    [call] = submit(client, session, {"name": tool.name, "input": {"greeting": "Hi", "wait_s": 0.5}, "wait": 30})
    done = wait_terminal(call["id"], tenant=world.a.tenant)
    assert done.status == CallStatus.SUCCEEDED, done.error
    assert done.result["structured"] == {"heard": "cancel", "content": None}
    assert answer(client, call, "accept", content={"name": "late"}).status_code == 409


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_tools_timeout_bounds_the_wait(world, session, asking, isolation):
    # The timeout also covers starting the tool (a process of its own, on a loaded machine): long enough that the
    # question is surely asked within it, so that it is the wait for the answer that the timeout ends.
    tool = asking(isolation, timeout=8.0)
    client = world.a.client("agent")
    call = asked(world, client, session, tool)
    done = wait_terminal(call["id"], tenant=world.a.tenant)
    assert done.status == CallStatus.TIMED_OUT and done.error["errorType"] == "TimedOut"
    body = client.get(f"/api/v1/calls/{call['id']}").json()
    assert body["status"] == "timed_out" and body["question"] is None
    assert answer(client, call, "accept", content={"name": "late"}).status_code == 409
