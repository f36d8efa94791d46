"""Approvals end to end through the API (docs/calls.md, docs/governance.md; docs/api.md): ask → awaiting_approval → a
reviewer's
decision, four-eyes, quorum, expiry, escalation, edits, reject and respond, suggested rules, audit.

Reviewers are console users calling the API with their session and the X-Tenant header. Tests that need
the approved call to really run (the local executor starts after commit) are transactional.
"""
import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest, PermissionRule, RequestStatus, Vote
from approvals.services import requests_expire_due
from audit.models import Event
from tenancy.models import Role
from tests.approvals.conftest import call_row, console_api, request_of, submit
from tests.tools.support import poll
from tools.api.serializers import call_data
from tools.calls.submit import calls_submit
from tools.catalog.services import binding_set
from tools.models import CallStatus, ToolCall

transactional = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("drain_calls")]


@pytest.fixture
def asking(world, gov_shell, gov_queue, gov_rule):
    """Tenant A asks before every `shell` call, in a queue of its own (no named reviewers)."""
    queue = gov_queue(name="ops")
    rule = gov_rule("ask", gov_shell.name, queue=queue, note="shell needs a human")
    return queue, rule


def ask_call(world, gov_shell, session=None, command: str = "git push", call_id: str | None = None) -> ToolCall:
    spec = {"name": gov_shell.name, "input": {"command": command}}
    if call_id:
        spec["id"] = call_id
    [call] = calls_submit(session=session or world.a.session, calls=[spec])
    assert call.status == CallStatus.AWAITING_APPROVAL, (call.status, call.error)
    return call


def decide(client, request_id, decision: str = "approve", **body):
    return client.post(f"/api/v1/approvals/{request_id}/decide", {"decision": decision, **body}, format="json")


def reviewer_client(user, world):
    return console_api(user, world.a.tenant)


def status_of(call) -> str:
    return ToolCall.objects.for_tenant(call.tenant_id).get(pk=call.pk).status


def error_fields(response) -> dict:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]["fields"]


# --- ask → approve → runs ----------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_ask_then_approve_runs_the_call_once(world, gov_shell, asking, gov_member, gov_session):
    queue, rule = asking
    session = gov_session()
    app = world.a.client("agent")
    call = submit(app, session, gov_shell.name, {"command": "git push"}, call_id="c1")
    assert call["status"] == "awaiting_approval"
    assert call["decision"] == {"behavior": "ask", "rule": rule.id, "reason": call["decision"]["reason"]}
    assert "shell needs a human" in call["decision"]["reason"]
    approval = call["approval"]
    assert approval["queue"] == "ops" and approval["status"] == "pending" and approval["votes"] == []
    assert gov_shell.counter.count == 0

    reviewer = gov_member()
    response = decide(reviewer_client(reviewer, world), approval["id"], "approve", message="fine")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "approved"
    assert [v["reviewer"] for v in response.json()["votes"]] == [reviewer.username]

    def finished():
        body = app.get(f"/api/v1/calls/{call['id']}").json()
        return body if body["status"] == "succeeded" else None

    done = poll(finished, message="the approved call to run")
    assert done["result"]["structured"]["ran"] == "git push"
    assert done["approval"]["status"] == "approved"
    assert done["approval"]["votes"][0]["decision"] == "approve"
    assert gov_shell.counter.count == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_an_app_waiting_on_a_call_gets_it_back_once_approved_and_run(world, gov_shell, asking, gov_member,
                                                                    gov_session):
    session = gov_session()
    app = world.a.client("agent")
    call = submit(app, session, gov_shell.name, {"command": "git push"})
    assert call["status"] == "awaiting_approval"
    reviewer = reviewer_client(gov_member(), world)
    approver = threading.Timer(0.5, lambda: decide(reviewer, call["approval"]["id"], "approve"))
    approver.start()
    waited = app.get(f"/api/v1/calls/{call['id']}?wait=20")
    approver.join()
    assert waited.status_code == 200, waited.content
    body = waited.json()
    assert body["status"] == "succeeded" and body["result"]["structured"]["ran"] == "git push"
    assert body["approval"]["status"] == "approved"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_edit_runs_the_edited_input_with_bound_arguments_applied(world, gov_shell, asking, gov_member,
                                                                  gov_session):
    binding_set(tenant=world.a.tenant, tool=gov_shell.tool, name="cwd", value="/srv/app")
    session = gov_session()
    app = world.a.client("agent")
    call = submit(app, session, gov_shell.name, {"command": "rm -rf /"})
    assert call["status"] == "awaiting_approval"
    response = decide(reviewer_client(gov_member(), world), call["approval"]["id"], "edit",
                      input={"command": "rm -rf /tmp/cache"})
    assert response.status_code == 200, response.content

    def finished():
        body = app.get(f"/api/v1/calls/{call['id']}").json()
        return body if body["status"] in ("succeeded", "failed") else None

    done = poll(finished, message="the edited call to run")
    assert done["status"] == "succeeded", done
    assert gov_shell.counter.inputs == [{"command": "rm -rf /tmp/cache", "cwd": "/srv/app"}]
    assert "/srv/app" not in str(done["input"])  # bound values are never echoed


def test_reviewer_role_may_decide_through_the_api(world, gov_shell, asking):
    """A member with the role `reviewer` (not operator) decides through the approvals API."""
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    response = decide(reviewer_client(world.a.users[Role.REVIEWER], world), request.pk, "approve")
    assert response.status_code == 200, response.content
    assert status_of(call) == CallStatus.QUEUED


def test_viewer_may_not_decide(world, gov_shell, asking):
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    response = decide(reviewer_client(world.a.users[Role.VIEWER], world), request.pk, "approve")
    assert response.status_code == 403
    assert status_of(call) == CallStatus.AWAITING_APPROVAL
    assert not Vote.objects.for_tenant(world.a.tenant).filter(request=request).exists()


def test_only_named_reviewers_decide_and_api_keys_only_in_open_queues(world, gov_shell, gov_queue, gov_rule,
                                                                        gov_member):
    named = gov_member()
    other = gov_member()
    queue = gov_queue(name="named", reviewers=[named])
    gov_rule("ask", gov_shell.name, queue=queue)
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    assert decide(reviewer_client(other, world), request.pk).status_code == 403
    assert decide(world.a.client("admin"), request.pk).status_code == 403
    assert status_of(call) == CallStatus.AWAITING_APPROVAL
    assert decide(reviewer_client(named, world), request.pk).status_code == 200
    assert status_of(call) == CallStatus.QUEUED


def test_admin_key_decides_in_a_queue_without_named_reviewers(world, gov_shell, asking):
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    response = decide(world.a.client("admin"), request.pk, "approve")
    assert response.status_code == 200, response.content
    assert response.json()["votes"][0]["reviewer"] == "apikey:admin"
    assert status_of(call) == CallStatus.QUEUED


def test_agent_and_external_keys_cannot_see_or_decide(world, gov_shell, asking):
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    for label in ("agent", "external", "locked"):
        client = world.a.client(label)
        assert client.get("/api/v1/approvals").status_code == 403
        assert decide(client, request.pk).status_code == 403
    assert status_of(call) == CallStatus.AWAITING_APPROVAL


# --- four eyes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("identity", ["username", "email"])
def test_four_eyes_refuses_the_sessions_own_user(world, gov_shell, gov_queue, gov_rule, gov_member, gov_session,
                                                 identity):
    reviewer = gov_member(email="dora@example.com")
    queue = gov_queue(name="four-eyes", four_eyes=True)
    gov_rule("ask", gov_shell.name, queue=queue)
    own = reviewer.username if identity == "username" else "Dora@Example.com"
    call = ask_call(world, gov_shell, session=gov_session(user=own))
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    response = decide(reviewer_client(reviewer, world), request.pk, "approve")
    assert response.status_code == 403, response.content
    assert response.json()["error"]["message"] == "four-eyes: you cannot decide a call made in your own session"
    assert status_of(call) == CallStatus.AWAITING_APPROVAL
    assert not Vote.objects.for_tenant(world.a.tenant).filter(request=request).exists()
    # anyone else may decide
    assert decide(reviewer_client(gov_member(), world), request.pk, "approve").status_code == 200
    assert status_of(call) == CallStatus.QUEUED


def test_four_eyes_off_lets_a_reviewer_approve_their_own_session(world, gov_shell, asking, gov_member, gov_session):
    reviewer = gov_member()
    call = ask_call(world, gov_shell, session=gov_session(user=reviewer.username))
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    assert decide(reviewer_client(reviewer, world), request.pk, "approve").status_code == 200


# --- quorum ------------------------------------------------------------------------------------

def test_quorum_of_two_distinct_reviewers(world, gov_shell, gov_queue, gov_rule, gov_member):
    queue = gov_queue(name="quorum", required_approvals=2)
    gov_rule("ask", gov_shell.name, queue=queue)
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    first, second = gov_member(), gov_member()

    response = decide(reviewer_client(first, world), request.pk, "approve")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "pending"
    assert status_of(call) == CallStatus.AWAITING_APPROVAL

    again = decide(reviewer_client(first, world), request.pk, "approve")
    assert again.status_code == 409, again.content
    assert again.json()["error"]["code"] == "conflict"
    assert status_of(call) == CallStatus.AWAITING_APPROVAL
    assert Vote.objects.for_tenant(world.a.tenant).filter(request=request).count() == 1

    response = decide(reviewer_client(second, world), request.pk, "approve")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "approved"
    assert [v["reviewer"] for v in response.json()["votes"]] == [first.username, second.username]
    assert status_of(call) == CallStatus.QUEUED

    late = decide(reviewer_client(gov_member(), world), request.pk, "approve")
    assert late.status_code == 409


def test_one_reject_settles_a_quorum_request(world, gov_shell, gov_queue, gov_rule, gov_member):
    queue = gov_queue(name="quorum", required_approvals=2)
    gov_rule("ask", gov_shell.name, queue=queue)
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    assert decide(reviewer_client(gov_member(), world), request.pk, "approve").status_code == 200
    response = decide(reviewer_client(gov_member(), world), request.pk, "reject", message="no")
    assert response.status_code == 200
    assert status_of(call) == CallStatus.REJECTED


def test_deciding_a_settled_request_is_a_conflict(world, gov_shell, asking, gov_member):
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    assert decide(reviewer_client(gov_member(), world), request.pk, "reject").status_code == 200
    for decision in ("approve", "reject", "respond", "edit"):
        response = decide(reviewer_client(gov_member(), world), request.pk, decision, message="late",
                          input={"command": "ls"})
        assert response.status_code == 409, (decision, response.content)
    assert status_of(call) == CallStatus.REJECTED


# --- expiry ------------------------------------------------------------------------------------

def test_expiry_gives_the_model_approval_expired(world, gov_shell, gov_queue, gov_rule, gov_member):
    queue = gov_queue(name="fast", expires_after=timedelta(minutes=5))
    gov_rule("ask", gov_shell.name, queue=queue)
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    assert request.expires_at is not None
    assert requests_expire_due() == 0  # not yet due
    ApprovalRequest.objects.for_tenant(world.a.tenant).filter(pk=request.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1))
    assert requests_expire_due() == 1
    request.refresh_from_db()
    assert request.status == RequestStatus.EXPIRED
    row = call_row({"id": call.pk}, world.a.tenant)
    assert row.status == CallStatus.EXPIRED
    assert row.error == {"errorType": "ApprovalExpired", "error": row.error["error"], "tool": gov_shell.name,
                         "callId": call.call_id}
    shown = call_data(row)
    assert shown["status"] == "expired" and shown["error"]["errorType"] == "ApprovalExpired"
    assert shown["approval"]["status"] == "expired"
    assert shown["result"]["state"] == "error"
    response = decide(reviewer_client(gov_member(), world), request.pk, "approve")
    assert response.status_code == 409, response.content
    assert status_of(call) == CallStatus.EXPIRED


def test_deciding_after_the_deadline_expires_instead(world, gov_shell, gov_queue, gov_rule, gov_member):
    """The periodic sweep has not run yet: a late decision still loses, and the call expires."""
    queue = gov_queue(name="fast", expires_after=timedelta(minutes=5))
    gov_rule("ask", gov_shell.name, queue=queue)
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    ApprovalRequest.objects.for_tenant(world.a.tenant).filter(pk=request.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1))
    response = decide(reviewer_client(gov_member(), world), request.pk, "approve")
    assert response.status_code == 409, response.content
    assert status_of(call) == CallStatus.EXPIRED
    assert call_row({"id": call.pk}, world.a.tenant).error["errorType"] == "ApprovalExpired"


def test_requests_without_a_deadline_never_expire(world, gov_shell, asking):
    call = ask_call(world, gov_shell)
    assert requests_expire_due(now=timezone.now() + timedelta(days=3650)) == 0
    assert status_of(call) == CallStatus.AWAITING_APPROVAL


# --- escalation --------------------------------------------------------------------------------

def test_escalation_widens_the_reviewer_set(world, gov_shell, gov_queue, gov_rule, gov_member):
    first, escalation = gov_member(), gov_member()
    queue = gov_queue(name="escalating", reviewers=[first], escalation_reviewers=[escalation],
                      escalate_after=timedelta(minutes=10))
    gov_rule("ask", gov_shell.name, queue=queue)
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    response = decide(reviewer_client(escalation, world), request.pk, "approve")
    assert response.status_code == 403, response.content
    requests_expire_due(now=timezone.now() + timedelta(minutes=5))
    assert decide(reviewer_client(escalation, world), request.pk, "approve").status_code == 403

    requests_expire_due(now=timezone.now() + timedelta(minutes=11))
    request.refresh_from_db()
    assert request.escalated_at is not None and request.status == RequestStatus.PENDING
    response = decide(reviewer_client(escalation, world), request.pk, "approve")
    assert response.status_code == 200, response.content
    assert status_of(call) == CallStatus.QUEUED


def test_escalation_keeps_the_first_reviewers(world, gov_shell, gov_queue, gov_rule, gov_member):
    first, escalation = gov_member(), gov_member()
    queue = gov_queue(name="escalating", reviewers=[first], escalation_reviewers=[escalation],
                      escalate_after=timedelta(minutes=10))
    gov_rule("ask", gov_shell.name, queue=queue)
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    requests_expire_due(now=timezone.now() + timedelta(minutes=11))
    assert decide(reviewer_client(first, world), request.pk, "reject").status_code == 200


def test_escalating_a_queue_without_named_reviewers_narrows_nobody(world, gov_shell, gov_queue, gov_rule,
                                                                   gov_member):
    """A queue that names no reviewers is open to every member who reviews (and to admin keys); escalation
    adds its reviewers, so after it the same people may still decide."""
    escalation = gov_member()
    queue = gov_queue(name="open-escalating", escalation_reviewers=[escalation], escalate_after=timedelta(minutes=10))
    gov_rule("ask", gov_shell.name, queue=queue)
    calls = [ask_call(world, gov_shell, command=f"git push {n}") for n in range(3)]
    requests = [ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call) for call in calls]
    requests_expire_due(now=timezone.now() + timedelta(minutes=11))
    for request in requests:
        request.refresh_from_db()
        assert request.escalated_at is not None and request.status == RequestStatus.PENDING

    deciders = [reviewer_client(world.a.users[Role.REVIEWER], world), reviewer_client(gov_member(), world),
                world.a.client("admin")]
    for client, request in zip(deciders, requests, strict=True):
        response = decide(client, request.pk, "reject", message="not now")
        assert response.status_code == 200, response.content
        assert response.json()["status"] == RequestStatus.REJECTED


# --- edit re-validation ------------------------------------------------------------------------

def test_schema_invalid_edit_is_refused_with_field_errors(world, gov_shell, asking, gov_member):
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    client = reviewer_client(gov_member(), world)
    for bad in ({"command": 42}, {}, {"command": "ls", "unexpected": True}, ["not", "an", "object"]):
        response = decide(client, request.pk, "edit", input=bad)
        assert response.status_code == 400, (bad, response.content)
        fields = error_fields(response)
        assert "input" in fields, fields
    request.refresh_from_db()
    assert request.status == RequestStatus.PENDING
    assert not Vote.objects.for_tenant(world.a.tenant).filter(request=request).exists()
    row = call_row({"id": call.pk}, world.a.tenant)
    assert row.status == CallStatus.AWAITING_APPROVAL
    assert row.input == {"command": "git push"}
    # a valid edit from the same reviewer still works afterwards
    assert decide(client, request.pk, "edit", input={"command": "git status"}).status_code == 200


def test_edit_naming_a_bound_argument_is_refused(world, gov_shell, asking, gov_member):
    binding_set(tenant=world.a.tenant, tool=gov_shell.tool, name="cwd", value="/srv/app")
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    response = decide(reviewer_client(gov_member(), world), request.pk, "edit",
                      input={"command": "ls", "cwd": "/"})
    assert response.status_code == 400, response.content
    assert "cwd" in str(error_fields(response)["input"])
    assert status_of(call) == CallStatus.AWAITING_APPROVAL
    assert not Vote.objects.for_tenant(world.a.tenant).filter(request=request).exists()


# --- reject and respond reach the app ----------------------------------------------------------

def test_reject_message_reaches_the_model(world, gov_shell, asking, gov_member):
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    reviewer = gov_member()
    response = decide(reviewer_client(reviewer, world), request.pk, "reject",
                      message="Do not push on Fridays; open a PR instead.")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "rejected"
    shown = call_data(call_row({"id": call.pk}, world.a.tenant))
    assert shown["status"] == "rejected"
    assert shown["error"] == {"errorType": "Rejected", "error": "Do not push on Fridays; open a PR instead.",
                              "tool": gov_shell.name, "callId": call.call_id}
    assert "Do not push on Fridays" in shown["result"]["content"][0]["text"]
    assert shown["approval"]["votes"][0]["message"] == "Do not push on Fridays; open a PR instead."
    assert gov_shell.counter.count == 0


def test_respond_answer_becomes_the_result(world, gov_shell, asking, gov_member):
    call = ask_call(world, gov_shell, command="git log -1")
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    response = decide(reviewer_client(gov_member(), world), request.pk, "respond",
                      message="The last commit is abc123.", input={"commit": "abc123"})
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "responded"
    shown = call_data(call_row({"id": call.pk}, world.a.tenant))
    assert shown["status"] == "succeeded"
    assert shown["error"] is None
    assert shown["result"]["state"] == "success"
    assert shown["result"]["content"] == [{"type": "text", "text": "The last commit is abc123."}]
    assert shown["result"]["structured"] == {"commit": "abc123"}
    assert gov_shell.counter.count == 0


def test_respond_needs_an_answer(world, gov_shell, asking, gov_member):
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    response = decide(reviewer_client(gov_member(), world), request.pk, "respond")
    assert response.status_code == 400
    assert "message" in error_fields(response)
    assert status_of(call) == CallStatus.AWAITING_APPROVAL


def test_unknown_decision_is_a_field_error(world, gov_shell, asking, gov_member):
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    response = decide(reviewer_client(gov_member(), world), request.pk, "maybe")
    assert response.status_code == 400
    assert "decision" in error_fields(response)


# --- the suggested rule ------------------------------------------------------------------------

@pytest.fixture
def default_asks(world):
    """Tenant A asks for every call no rule decides (its default), in the default queue."""
    tenant = world.a.tenant
    tenant.default_behavior = "ask"
    tenant.auto_allow_read_only = False
    tenant.save()
    return tenant


def test_approve_with_add_rule_allows_the_next_identical_call(world, gov_shell, default_asks, gov_member,
                                                              gov_session):
    session = gov_session(agent="ops-bot")
    call = ask_call(world, gov_shell, session=session)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    response = decide(reviewer_client(gov_member(Role.OPERATOR), world), request.pk, "approve", add_rule=True)
    assert response.status_code == 200, response.content
    added = PermissionRule.objects.for_tenant(world.a.tenant).get(behavior="allow", tool_pattern=gov_shell.name)
    assert added.agents == ["ops-bot"]
    [again] = calls_submit(session=session, calls=[{"name": gov_shell.name, "input": {"command": "git push"}}])
    assert again.status == CallStatus.QUEUED, again.decision
    assert again.decision["behavior"] == "allow"
    assert again.decision["rule"] == added.id
    # another agent still asks
    [other] = calls_submit(session=gov_session(agent="other-bot"),
                           calls=[{"name": gov_shell.name, "input": {"command": "git push"}}])
    assert other.status == CallStatus.AWAITING_APPROVAL


def test_add_rule_narrowed_to_the_input(world, gov_shell, default_asks, gov_member, gov_session):
    session = gov_session(agent="ops-bot")
    call = ask_call(world, gov_shell, session=session, command="git status")
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    response = decide(reviewer_client(gov_member(Role.OPERATOR), world), request.pk, "approve", add_rule=True,
                      narrow_to_input=True)
    assert response.status_code == 200, response.content
    [same] = calls_submit(session=session, calls=[{"name": gov_shell.name, "input": {"command": "git status"}}])
    [different] = calls_submit(session=session, calls=[{"name": gov_shell.name, "input": {"command": "git push"}}])
    assert same.status == CallStatus.QUEUED
    assert different.status == CallStatus.AWAITING_APPROVAL


def test_add_rule_is_never_silently_ineffective(world, gov_shell, asking, gov_member, gov_session):
    """The ask came from an ask rule, and ask beats allow (docs/governance.md): an added allow rule could never take
    effect. Approving with add_rule must then either make the next identical call run without asking, or
    refuse the suggestion with a clear 4xx, not add a rule that does nothing."""
    session = gov_session(agent="ops-bot")
    call = ask_call(world, gov_shell, session=session)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    response = decide(reviewer_client(gov_member(Role.OPERATOR), world), request.pk, "approve", add_rule=True)
    assert response.status_code == 400, response.content
    assert "asks for every such call" in response.json()["error"]["fields"]["add_rule"][0]
    # Refused before the vote: nothing changed, the request still waits for a decision.
    assert not PermissionRule.objects.for_tenant(world.a.tenant).filter(behavior="allow").exists()
    request.refresh_from_db()
    assert request.status == RequestStatus.PENDING and not request.votes.exists()


def test_only_operators_add_rules_while_approving(world, gov_shell, default_asks, gov_member, gov_session):
    call = ask_call(world, gov_shell, session=gov_session(agent="ops-bot"))
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    response = decide(reviewer_client(gov_member(), world), request.pk, "approve", add_rule=True)
    assert response.status_code == 403, response.content
    assert not PermissionRule.objects.for_tenant(world.a.tenant).exists()
    request.refresh_from_db()
    assert request.status == RequestStatus.PENDING


def test_the_added_rule_does_not_beat_a_deny(world, gov_shell, default_asks, gov_rule, gov_member, gov_session):
    session = gov_session(agent="ops-bot")
    call = ask_call(world, gov_shell, session=session)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    response = decide(reviewer_client(gov_member(Role.OPERATOR), world), request.pk, "approve", add_rule=True)
    assert response.status_code == 200, response.content
    assert PermissionRule.objects.for_tenant(world.a.tenant).filter(behavior="allow").exists()
    gov_rule("deny", gov_shell.name, arg_match={"command": "* --force"})
    [forced] = calls_submit(session=session, calls=[{"name": gov_shell.name, "input": {"command": "git push --force"}}])
    assert forced.status == CallStatus.DENIED


# --- audit and the timeline --------------------------------------------------------------------

def test_every_vote_and_transition_is_audited_and_on_the_timeline(world, gov_shell, gov_queue, gov_rule,
                                                                  gov_member):
    queue = gov_queue(name="quorum", required_approvals=2)
    gov_rule("ask", gov_shell.name, queue=queue)
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    first, second = gov_member(), gov_member()
    decide(reviewer_client(first, world), request.pk, "approve", message="looks fine")
    decide(reviewer_client(second, world), request.pk, "edit", input={"command": "git status"})
    # The edit restarted the count: the first reviewer approves the edited input too.
    decide(reviewer_client(first, world), request.pk, "approve", message="the edit too")

    target = f"call:{call.pk}"
    events = list(Event.objects.for_tenant(world.a.tenant).filter(target=target).order_by("id"))
    verbs = [e.verb for e in events]
    assert verbs[:4] == ["call.received", "approval.opened", "approval.approve", "approval.edit"], verbs
    assert events[2].actor_label == first.username and events[2].data["message"] == "looks fine"
    assert events[3].actor_label == second.username and events[3].data["edited"] is True

    audit = world.a.client("admin").get("/api/v1/audit", {"target": target})
    assert audit.status_code == 200
    assert [e["verb"] for e in audit.json()["results"]][::-1][:4] == verbs[:4]

    timeline = world.a.client("agent").get(f"/api/v1/calls/{call.pk}/events")
    assert timeline.status_code == 200
    statuses = [e["data"]["status"] for e in timeline.json()["events"] if e["kind"] == "status"]
    assert statuses == ["awaiting_approval", "queued"], statuses
    seqs = [e["seq"] for e in timeline.json()["events"]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


@pytest.mark.parametrize("outcome", ["reject", "respond", "expire"])
def test_settling_transitions_are_audited(world, gov_shell, gov_queue, gov_rule, gov_member, outcome):
    queue = gov_queue(name="q", expires_after=timedelta(hours=1))
    gov_rule("ask", gov_shell.name, queue=queue)
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    if outcome == "expire":
        requests_expire_due(now=timezone.now() + timedelta(hours=2))
        expected_verbs, expected_status = ["approval.expired"], "expired"
    elif outcome == "reject":
        decide(reviewer_client(gov_member(), world), request.pk, "reject", message="no")
        expected_verbs, expected_status = ["approval.reject"], "rejected"
    else:
        decide(reviewer_client(gov_member(), world), request.pk, "respond", message="42")
        expected_verbs, expected_status = ["approval.respond", "call.responded"], "succeeded"
    verbs = list(Event.objects.for_tenant(world.a.tenant).filter(target=f"call:{call.pk}").order_by("id")
                 .values_list("verb", flat=True))
    assert verbs[:2] == ["call.received", "approval.opened"]
    for verb in expected_verbs:
        assert verb in verbs, verbs
    timeline = world.a.client("agent").get(f"/api/v1/calls/{call.pk}/events").json()["events"]
    statuses = [e["data"]["status"] for e in timeline if e["kind"] == "status"]
    assert statuses == ["awaiting_approval", expected_status]


def test_refused_votes_leave_no_trace(world, gov_shell, gov_queue, gov_rule, gov_member, gov_session):
    reviewer = gov_member()
    queue = gov_queue(name="four-eyes", four_eyes=True)
    gov_rule("ask", gov_shell.name, queue=queue)
    call = ask_call(world, gov_shell, session=gov_session(user=reviewer.username))
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    before = Event.objects.for_tenant(world.a.tenant).filter(target=f"call:{call.pk}").count()
    assert decide(reviewer_client(reviewer, world), request.pk, "approve").status_code == 403
    assert Event.objects.for_tenant(world.a.tenant).filter(target=f"call:{call.pk}").count() == before


# --- the approval object in the app's view of a call --------------------------------------------

def test_approval_object_shape_in_calls(world, gov_shell, gov_queue, gov_rule):
    queue = gov_queue(name="shaped", expires_after=timedelta(minutes=30))
    rule = gov_rule("ask", gov_shell.name, queue=queue)
    call = ask_call(world, gov_shell)
    shown = call_data(call_row({"id": call.pk}, world.a.tenant))
    assert shown["status"] == "awaiting_approval"
    assert shown["decision"]["rule"] == rule.id and shown["decision"]["behavior"] == "ask"
    approval = shown["approval"]
    assert set(approval) >= {"id", "queue", "status", "expires_at", "votes"}
    assert approval["queue"] == "shaped" and approval["expires_at"].endswith("Z")
    assert approval["id"] == request_of({"id": call.pk}, world.a.tenant).pk
    # a call that never asked has no approval
    [allowed] = calls_submit(session=world.a.session, calls=[{"name": "calculate", "input": {"expression": "1+1"}}])
    assert call_data(allowed)["approval"] is None


def test_default_queue_takes_asks_without_a_queue(world, gov_shell, gov_rule):
    gov_rule("ask", gov_shell.name)
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    assert request.queue.is_default and request.queue.name == "default"


def test_tenant_default_ask_opens_a_request(world, gov_shell):
    tenant = world.a.tenant
    tenant.default_behavior = "ask"
    tenant.save()
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(tenant).get(call=call)
    assert request.rule is None and "default" in request.reason


# --- edits under a quorum, cancelled calls, escalation on the record ------------------------------

def test_an_edit_in_a_quorum_is_what_runs(world, gov_shell, gov_queue, gov_rule, gov_member):
    """First reviewer edits, second approves: the edited input is what the call runs with."""
    queue = gov_queue(name="quorum", required_approvals=2)
    gov_rule("ask", gov_shell.name, queue=queue)
    call = ask_call(world, gov_shell, command="git push --force")
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    assert decide(reviewer_client(gov_member(), world), request.pk, "edit",
                  input={"command": "git push"}).status_code == 200
    assert decide(reviewer_client(gov_member(), world), request.pk, "approve").status_code == 200
    row = call_row({"id": call.pk}, world.a.tenant)
    assert row.status == CallStatus.QUEUED
    assert row.effective_input == {"command": "git push"}


def test_a_cancelled_call_leaves_the_pending_inbox(world, gov_shell, asking):
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    cancelled = world.a.client("agent").post(f"/api/v1/calls/{call.pk}/cancel")
    assert cancelled.status_code == 200, cancelled.content
    assert cancelled.json()["status"] == "cancelled"
    pending = world.a.client("admin").get("/api/v1/approvals").json()
    assert request.pk not in [r["id"] for r in pending["results"]]


def test_a_cancelled_call_never_runs_when_approved_later(world, gov_shell, asking, gov_member):
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    assert world.a.client("agent").post(f"/api/v1/calls/{call.pk}/cancel").status_code == 200
    response = decide(reviewer_client(gov_member(), world), request.pk, "approve")
    assert response.status_code in (404, 409), response.content
    assert status_of(call) == CallStatus.CANCELLED


def test_a_cancelled_call_is_not_rejected_or_answered_later(world, gov_shell, asking, gov_member):
    call = ask_call(world, gov_shell)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    assert world.a.client("agent").post(f"/api/v1/calls/{call.pk}/cancel").status_code == 200
    for decision in ("reject", "respond"):
        decide(reviewer_client(gov_member(), world), request.pk, decision, message="late")
        assert status_of(call) == CallStatus.CANCELLED, decision


def test_escalation_is_on_the_record(world, gov_shell, gov_queue, gov_rule, gov_member):
    queue = gov_queue(name="escalating", reviewers=[gov_member()], escalation_reviewers=[gov_member()],
                      escalate_after=timedelta(minutes=10))
    gov_rule("ask", gov_shell.name, queue=queue)
    call = ask_call(world, gov_shell)
    requests_expire_due(now=timezone.now() + timedelta(minutes=11))
    verbs = list(Event.objects.for_tenant(world.a.tenant).filter(target=f"call:{call.pk}")
                 .values_list("verb", flat=True))
    assert any("escalat" in verb for verb in verbs), verbs
