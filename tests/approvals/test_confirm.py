"""Confirm rules and calls that wait for their own user (docs/governance.md#permission-rules, docs/calls.md
"Questions for the user", docs/api.md): the decision order, the question on the call, the answer endpoint
(accept, decline, cancel, 409, 400, 403 for a verified user's session), expiry, events and audit."""
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.engine import RuleIndex, decide
from approvals.models import ApprovalRequest
from approvals.services import requests_expire_due
from audit.models import Event
from tests.approvals.conftest import call_row, console_api, submit
from tests.tools.support import poll
from tools.api.serializers import call_data
from tools.calls.submit import calls_submit
from tools.catalog.services import binding_set
from tools.models import CallEvent, CallStatus

transactional = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("drain_calls")]


def held(session, name: str, call_input: dict) -> dict:
    """Submit one call through the service (the submit endpoint is async: its thread would not see this test's
    transaction) and return it as the API shows it."""
    [call] = calls_submit(session=session, calls=[{"name": name, "input": call_input}])
    return call_data(call)


def answer(client, call: dict, action: str, **body):
    return client.post(f"/api/v1/calls/{call['id']}/answer", {"action": action, **body}, format="json")


def verbs(tenant, call: dict) -> list[str]:
    return list(Event.objects.filter(tenant=tenant, target=f"call:{call['id']}").order_by("id")
                .values_list("verb", flat=True))


def statuses(tenant, call: dict) -> list[str]:
    return [event.data.get("status") for event in CallEvent.objects.for_tenant(tenant).filter(
        call_id=call["id"], kind="status").order_by("seq")]


# --- the engine's order ----------------------------------------------------------------------------

class Rule:
    def __init__(self, pk, behavior, queue_id=None, tool_pattern="shell"):
        self.id, self.behavior, self.tool_pattern, self.queue_id = pk, behavior, tool_pattern, queue_id
        self.priority, self.arg_match, self.agents, self.users, self.note, self.user_verified = 0, {}, [], [], "", None


def decided(*rules, read_only=False):
    return decide(RuleIndex(list(rules)), tool_name="shell", effective_input={}, agent="a", user="u",
                  read_only_trusted=read_only, auto_allow_read_only=True, default_behavior="allow")


def test_deny_and_ask_come_before_confirm_and_confirm_before_read_only_and_allow():
    assert decided(Rule(1, "confirm"), Rule(2, "deny")).behavior == "deny"
    assert decided(Rule(1, "confirm"), Rule(2, "ask")).behavior == "ask"
    confirm = decided(Rule(1, "allow"), Rule(2, "confirm", queue_id=7), read_only=True)
    assert (confirm.behavior, confirm.rule, confirm.queue) == ("confirm", 2, 7)
    assert "needs the user's confirmation by rule #2" in confirm.reason
    assert decided(Rule(1, "allow")).behavior == "allow"


@pytest.mark.django_db
def test_rules_api_takes_confirm_and_evaluate_shows_it(world, gov_shell):
    admin = world.a.client("admin")
    created = admin.post("/api/v1/rules", {"behavior": "confirm", "tool_pattern": gov_shell.name}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["behavior"] == "confirm"
    evaluated = admin.post("/api/v1/rules/evaluate", {"tool": gov_shell.name, "input": {"command": "ls"}},
                           format="json").json()
    assert evaluated["behavior"] == "confirm" and evaluated["rule"] == created.json()["id"]
    assert admin.post("/api/v1/rules", {"behavior": "maybe", "tool_pattern": "x"}, format="json").status_code == 400


# --- the question on the call ----------------------------------------------------------------------

@pytest.fixture
def confirming(world, gov_shell, gov_rule):
    return gov_rule("confirm", gov_shell.name, note="the user says yes first")


@pytest.mark.django_db
def test_a_confirm_holds_the_call_with_its_question_bound_values_left_out(world, gov_shell, confirming,
                                                                           gov_session):
    binding_set(tenant=world.a.tenant, tool=gov_shell.tool, name="cwd", value="/srv/secret-place")
    session = gov_session()
    call = held(session, gov_shell.name, {"command": "rm -r build"})
    assert call["status"] == "awaiting_user"
    assert call["decision"]["behavior"] == "confirm" and call["decision"]["rule"] == confirming.id
    question = call["question"]
    assert question["kind"] == "confirm" and question["tool"] == gov_shell.name
    assert question["input"] == {"command": "rm -r build"} and question["fixed"] == ["cwd"]
    assert "/srv/secret-place" not in str(question)
    assert "rm -r build" in question["message"] and "Run a shell command" in question["description"]
    schema = question["requestedSchema"]
    assert schema["type"] == "object" and schema["properties"]["confirm"]["type"] == "boolean"
    expires = timezone.datetime.fromisoformat(question["expires_at"].replace("Z", "+00:00"))
    assert timedelta(seconds=590) < expires - timezone.now() <= timedelta(seconds=600)
    assert gov_shell.counter.count == 0
    assert "confirmation.asked" in verbs(world.a.tenant, call)
    assert statuses(world.a.tenant, call)[-1] == "awaiting_user"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_accept_runs_the_call_once_and_a_second_answer_is_409(world, gov_shell, confirming, gov_session):
    app = world.a.client("agent")
    call = submit(app, gov_session(), gov_shell.name, {"command": "ls"})
    accepted = answer(app, call, "accept", content={"confirm": True})
    assert accepted.status_code == 200, accepted.content
    assert accepted.json()["question"] is None
    poll(lambda: call_row(call, world.a.tenant).status == CallStatus.SUCCEEDED)
    assert gov_shell.counter.count == 1
    again = answer(app, call, "decline")
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
    assert "confirmation.accept" in verbs(world.a.tenant, call)
    logs = CallEvent.objects.for_tenant(world.a.tenant).filter(call_id=call["id"], kind="log")
    assert [event.data["answer"] for event in logs] == ["accept"]


@pytest.mark.django_db
@pytest.mark.parametrize(("action", "status", "error_type"), [
    ("decline", "rejected", "UserDeclined"), ("cancel", "cancelled", "UserCancelled")])
def test_decline_and_cancel_settle_the_call(world, gov_shell, confirming, gov_session, action, status, error_type):
    app = world.a.client("agent")
    call = held(gov_session(), gov_shell.name, {"command": "ls"})
    response = answer(app, call, action)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == status and body["error"]["errorType"] == error_type and body["question"] is None
    assert statuses(world.a.tenant, call)[-1] == status
    assert f"confirmation.{action}" in verbs(world.a.tenant, call)
    assert gov_shell.counter.count == 0


@pytest.mark.django_db
def test_an_unticked_form_is_a_decline(world, gov_shell, confirming, gov_session):
    app = world.a.client("agent")
    call = held(gov_session(), gov_shell.name, {"command": "ls"})
    body = answer(app, call, "accept", content={"confirm": False}).json()
    assert body["status"] == "rejected" and body["error"]["errorType"] == "UserDeclined"


@pytest.mark.django_db
def test_answer_refusals(world, gov_shell, confirming, gov_session):
    app = world.a.client("agent")
    call = held(gov_session(), gov_shell.name, {"command": "ls"})
    assert answer(app, call, "maybe").status_code == 400
    assert answer(app, call, "accept", content=[1]).status_code == 400
    assert call_row(call, world.a.tenant).status == CallStatus.AWAITING_USER
    foreign = world.b.client("agent")
    assert answer(foreign, call, "accept").status_code == 404
    ran = held(gov_session(), "no_such_tool", {})
    assert answer(app, ran, "accept").status_code == 409


@pytest.mark.django_db
def test_a_verified_users_question_is_theirs_to_answer(world, gov_shell, confirming, gov_member):
    from tools.catalog.services import session_create

    person = gov_member(email="pat@example.com")
    session = session_create(tenant=world.a.tenant, agent="ops-bot", user="pat@example.com", user_verified=True,
                             person=person, api_key=world.a.key_objects["agent"])
    app = world.a.client("agent")
    call = held(session, gov_shell.name, {"command": "ls"})
    refused = answer(app, call, "accept")
    assert refused.status_code == 403, refused.content
    other = gov_member()
    assert answer(console_api(other, world.a.tenant), call, "accept").status_code == 403
    assert call_row(call, world.a.tenant).status == CallStatus.AWAITING_USER
    accepted = answer(console_api(person, world.a.tenant), call, "decline")
    assert accepted.status_code == 200 and accepted.json()["status"] == "rejected"


@pytest.mark.django_db
def test_an_unanswered_question_expires(world, gov_shell, confirming, gov_session):
    app = world.a.client("agent")
    call = held(gov_session(), gov_shell.name, {"command": "ls"})
    assert requests_expire_due() == 0
    assert requests_expire_due(now=timezone.now() + timedelta(seconds=601)) == 1
    row = call_row(call, world.a.tenant)
    assert row.status == CallStatus.EXPIRED and row.error["errorType"] == "ConfirmationExpired"
    assert "confirmation.expired" in verbs(world.a.tenant, call)
    assert answer(app, call, "accept").status_code == 409


@pytest.mark.django_db
def test_a_cancel_takes_a_waiting_call(world, gov_shell, confirming, gov_session):
    app = world.a.client("agent")
    call = held(gov_session(), gov_shell.name, {"command": "ls"})
    assert app.post(f"/api/v1/calls/{call['id']}/cancel").json()["status"] == "cancelled"
    assert requests_expire_due(now=timezone.now() + timedelta(days=1)) == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_wait_returns_at_the_question(world, gov_shell, confirming, gov_session):
    call = submit(world.a.client("agent"), gov_session(), gov_shell.name, {"command": "ls"}, wait=5)
    assert call["status"] == "awaiting_user"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_confirm_with_a_queue_asks_the_reviewers_after_the_user(world, gov_shell, gov_rule, gov_queue, gov_member,
                                                                gov_session):
    queue = gov_queue(name="after-user")
    rule = gov_rule("confirm", gov_shell.name, queue=queue)
    app = world.a.client("agent")
    call = submit(app, gov_session(), gov_shell.name, {"command": "ls"})
    assert call["status"] == "awaiting_user" and call["approval"] is None
    assert not ApprovalRequest.objects.for_tenant(world.a.tenant).filter(call_id=call["id"]).exists()
    body = answer(app, call, "accept").json()
    assert body["status"] == "awaiting_approval" and body["approval"]["queue"] == "after-user"
    assert body["decision"]["rule"] == rule.id
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call_id=call["id"])
    reviewer = console_api(gov_member(), world.a.tenant)
    decided = reviewer.post(f"/api/v1/approvals/{request.pk}/decide", {"decision": "approve"}, format="json")
    assert decided.status_code == 200, decided.content
    poll(lambda: call_row(call, world.a.tenant).status == CallStatus.SUCCEEDED)
    assert gov_shell.counter.count == 1
    assert statuses(world.a.tenant, call)[:3] == ["awaiting_user", "awaiting_approval", "queued"]


# --- a reviewer's edit into input the user must confirm ---------------------------------------------

def edit(world, reviewer, request, new_input):
    return console_api(reviewer, world.a.tenant).post(f"/api/v1/approvals/{request.pk}/decide",
                                                      {"decision": "edit", "input": new_input}, format="json")


@pytest.mark.django_db
def test_an_edit_the_rules_send_to_the_user_is_refused(world, gov_shell, gov_rule, gov_member, gov_session):
    gov_rule("ask", gov_shell.name, arg_match={"command": "ls*"}, note="listing needs a reviewer")
    confirm = gov_rule("confirm", gov_shell.name, note="the user confirms the rest")
    call = held(gov_session(), gov_shell.name, {"command": "ls"})
    assert call["status"] == "awaiting_approval"
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call_id=call["id"])
    response = edit(world, gov_member(), request, {"command": "rm -r build"})
    assert response.status_code == 400, response.content
    [problem] = response.json()["error"]["fields"]["input"]
    assert f"rule #{confirm.id}" in problem and "confirmation of the session's user" in problem
    assert call_row(call, world.a.tenant).status == CallStatus.AWAITING_APPROVAL
    assert not request.votes.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_after_the_users_confirmation_only_their_input_may_be_approved(world, gov_shell, gov_rule, gov_queue,
                                                                       gov_member, gov_session):
    confirm = gov_rule("confirm", gov_shell.name, queue=gov_queue(name="after-user"))
    app = world.a.client("agent")
    call = submit(app, gov_session(), gov_shell.name, {"command": "ls"})
    assert answer(app, call, "accept").json()["status"] == "awaiting_approval"
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call_id=call["id"])
    reviewer = gov_member()
    refused = edit(world, reviewer, request, {"command": "rm -r /"})
    assert refused.status_code == 400 and f"rule #{confirm.id}" in str(refused.json()["error"]["fields"]["input"])
    same = edit(world, reviewer, request, {"command": "ls"})
    assert same.status_code == 200, same.content
    poll(lambda: call_row(call, world.a.tenant).status == CallStatus.SUCCEEDED)
    assert gov_shell.counter.inputs == [{"command": "ls", "cwd": "/"}]


def test_over_mcp_only_the_persons_own_client_answers_their_question(world, gov_shell, confirming, gov_member):
    """An app key that may name a verified person's session over /mcp/ cannot answer for them there either."""
    from types import SimpleNamespace

    from tenancy.models import ApiKey
    from tools.catalog.services import session_create
    from tools.gateway import elicitation

    person = gov_member(email="pat@example.com")
    app_key = world.a.key_objects["agent"]
    session = session_create(tenant=world.a.tenant, agent="ops-bot", user="pat@example.com", user_verified=True,
                             person=person, api_key=app_key)
    call = held(session, gov_shell.name, {"command": "ls"})
    row = call_row(call, world.a.tenant)
    key = elicitation.question_key(row)
    accept = {"action": "accept", "content": {"confirm": True}}
    app = SimpleNamespace(session=session, api_key=ApiKey.objects.for_tenant(world.a.tenant).get(pk=app_key.pk))
    assert elicitation.answer_apply(app, key, accept, actor="apikey:app") is False
    assert call_row(call, world.a.tenant).status == CallStatus.AWAITING_USER
    persons_key = ApiKey.objects.for_tenant(world.a.tenant).get(pk=app_key.pk)
    persons_key.acting_for = person  # as an OAuth grant's key stands for its person (docs/identity.md)
    own_client = SimpleNamespace(session=session, api_key=persons_key)
    assert elicitation.answer_apply(own_client, key, {"action": "decline"}, actor="apikey:pat") is True
    assert call_row(call, world.a.tenant).status == CallStatus.REJECTED
