"""The approval services called directly, each observable effect compared exactly: error payloads, the call's
status and error, audit entries (verb, target, data), which rows an update touches."""
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import services as approval_services
from approvals.models import ApprovalRequest, PermissionRule, Queue, RequestStatus, Vote
from approvals.services import (
    _exact_arg_spec,
    call_respond,
    default_queue,
    external_result_post,
    queue_delete,
    queue_save,
    request_decide,
    request_escalate,
    request_expire,
    requests_expire_due,
    reviewer_may_decide,
    rule_from_approval,
    rule_update,
)
from audit.models import Event
from common.errors import Conflict, NotPermitted, ServiceError
from tests.approvals.test_external import open_ticket, ticket_tool  # noqa: F401 - ticket_tool: a fixture
from tools.calls.submit import call_cancel, calls_submit
from tools.models import CallEvent, CallStatus, ToolCall, ToolGroup

pytestmark = pytest.mark.django_db


@pytest.fixture
def ask(world, gov_shell, gov_rule, gov_session):
    """Submit calls of the counting tool that an ask rule (routed to `queue`, if given) sends to a reviewer;
    returns the pending requests."""
    rules = {}

    def make(n: int = 1, *, queue=None, agent: str = "ops-bot", user: str = "carol@example.com", **call_input):
        key = queue.pk if queue is not None else None
        if key not in rules:
            rules[key] = gov_rule("ask", gov_shell.name, queue=queue, agents=[agent] if queue else [],
                                  priority=10 if queue else 0)
        calls = calls_submit(session=gov_session(agent=agent, user=user), calls=[
            {"name": gov_shell.name, "input": {"command": f"deploy {i}", **call_input}} for i in range(n)])
        assert [c.status for c in calls] == [CallStatus.AWAITING_APPROVAL] * n
        return [ApprovalRequest.objects.for_tenant(world.a.tenant).select_related("call", "queue", "tenant")
                .get(call=c) for c in calls]

    return make


def events(world, verb: str) -> list[tuple]:
    return [(e.verb, e.target, e.data, e.actor_id)
            for e in Event.objects.for_tenant(world.a.tenant).filter(verb=verb).order_by("id")]


def call_now(world, call) -> ToolCall:
    return ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk)


# --- queue_delete ---------------------------------------------------------------------------------

def test_the_default_queue_cannot_be_deleted(world):
    queue = default_queue(world.a.tenant)
    with pytest.raises(ServiceError) as refused:
        queue_delete(queue=queue, actor=world.a.users["admin"])
    assert refused.value.detail == {"is_default": ["make another queue the default first"]}
    assert Queue.objects.for_tenant(world.a.tenant).filter(pk=queue.pk).exists()
    assert events(world, "queue.deleted") == []


def test_a_tenant_without_a_default_queue_gets_one_that_says_what_it_is_for(world):
    Queue.objects.for_tenant(world.a.tenant).filter(is_default=True).delete()
    queue = default_queue(world.a.tenant)
    assert (queue.tenant_id, queue.name, queue.is_default, queue.description) == (
        world.a.tenant.pk, "default", True, "Requests no rule routes elsewhere.")
    assert Queue.objects.for_tenant(world.a.tenant).get(is_default=True).pk == queue.pk


def test_an_existing_default_queue_is_read_in_one_statement(world, django_assert_num_queries):
    """Never an attempt to create one that the unique constraint then refuses."""
    existing = Queue.objects.for_tenant(world.a.tenant).get(is_default=True)
    with django_assert_num_queries(1):
        assert default_queue(world.a.tenant).pk == existing.pk


def test_a_default_queue_made_elsewhere_between_the_read_and_the_create_is_the_one_returned(world):
    """The stale read written out: another process creates the default queue right after ours found none."""
    from django.db import connection

    tenant = world.a.tenant
    Queue.objects.for_tenant(tenant).filter(is_default=True).delete()
    Queue.objects.create(tenant=tenant, name="night-shift")  # not the default: a lookup that lost its filter finds it
    Queue.objects.create(tenant=world.b.tenant, name="elsewhere")
    made = {}

    def create_after_first_read(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not made and sql.startswith("SELECT") and '"approvals_queue"' in sql:
            made["queue"] = Queue.objects.create(tenant=tenant, name="made-elsewhere", is_default=True)
        return result

    with connection.execute_wrapper(create_after_first_read):
        queue = default_queue(tenant)
    assert queue.pk == made["queue"].pk
    assert list(Queue.objects.for_tenant(tenant).filter(is_default=True).values_list("name", flat=True)) == [
        "made-elsewhere"]


def test_deleting_a_queue_audits_it_by_name(world, gov_queue):
    queue = gov_queue(name="night-shift")
    admin = world.a.users["admin"]
    queue_delete(queue=queue, actor=admin)
    assert not Queue.objects.for_tenant(world.a.tenant).filter(name="night-shift").exists()
    assert events(world, "queue.deleted") == [("queue.deleted", "queue:night-shift", {}, admin.pk)]


# --- request_expire -------------------------------------------------------------------------------

def test_an_expired_request_fails_its_call_with_the_expiry_error(world, ask):
    [request] = ask()
    call = request.call
    assert request_expire(request=request) is True
    call = call_now(world, call)
    assert call.status == CallStatus.EXPIRED
    assert call.error == {"errorType": "ApprovalExpired", "error": "no reviewer decided before the request expired",
                          "tool": call.tool_name, "callId": call.call_id}
    assert ApprovalRequest.objects.for_tenant(world.a.tenant).get(pk=request.pk).status == RequestStatus.EXPIRED
    assert events(world, "approval.expired") == [("approval.expired", f"call:{call.pk}", {}, None)]


def test_expiring_a_request_leaves_a_call_that_moved_on_alone(world, ask):
    """Only a call still awaiting approval expires with its request."""
    [request] = ask()
    call = request.call
    ToolCall.objects.for_tenant(world.a.tenant).filter(pk=call.pk).update(status=CallStatus.CANCELLED)
    assert request_expire(request=request) is True
    assert call_now(world, call).status == CallStatus.CANCELLED
    assert call_now(world, call).error is None
    assert ApprovalRequest.objects.for_tenant(world.a.tenant).get(pk=request.pk).status == RequestStatus.EXPIRED


# --- request_escalate -----------------------------------------------------------------------------

def test_escalating_one_request_leaves_the_others_pending_as_they_were(world, ask, gov_queue):
    queue = gov_queue(name="oncall", escalate_after=timedelta(minutes=5))
    first, second = ask(2, queue=queue)
    now = timezone.now()
    assert request_escalate(request=first, now=now) is True
    assert first.escalated_at == now
    escalated = dict(ApprovalRequest.objects.for_tenant(world.a.tenant).filter(pk__in=[first.pk, second.pk])
                     .values_list("pk", "escalated_at"))
    assert escalated == {first.pk: now, second.pk: None}
    assert events(world, "approval.escalated") == [
        ("approval.escalated", f"call:{first.call_id}", {"queue": "oncall"}, None)]


def test_escalating_a_request_whose_queue_was_deleted_audits_no_queue(world, ask, gov_queue):
    queue = gov_queue(name="temporary")
    [request] = ask(queue=queue)
    queue_delete(queue=queue)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).select_related("queue", "tenant").get(pk=request.pk)
    assert request.queue is None
    assert request_escalate(request=request, now=timezone.now()) is True
    assert events(world, "approval.escalated") == [
        ("approval.escalated", f"call:{request.call_id}", {"queue": None}, None)]


# --- requests_expire_due and external_calls_expire -----------------------------------------------

def pending_state(world, requests) -> list[tuple]:
    rows = ApprovalRequest.objects.for_tenant(world.a.tenant).in_bulk([r.pk for r in requests])
    return [(rows[r.pk].status, rows[r.pk].escalated_at, rows[r.pk].call.status) for r in requests]


@pytest.mark.usefixtures("ticket_tool")
def test_the_periodic_job_expires_and_escalates_exactly_what_is_due(world, ask, gov_queue):
    """Approval requests and external calls each against their own deadline; the count is what expired."""
    start = timezone.now()
    queue_save(tenant=world.a.tenant, queue=default_queue(world.a.tenant), expires_after=timedelta(hours=1))
    default_queue(world.b.tenant)  # a default queue without a deadline: its tenant's external calls never expire
    expiring = ask(2, queue=gov_queue(name="expiring", expires_after=timedelta(minutes=10)))
    [escalating] = ask(queue=gov_queue(name="escalating", escalate_after=timedelta(minutes=10)), agent="night-bot")
    [later] = ask(queue=gov_queue(name="later", expires_after=timedelta(hours=2), escalate_after=timedelta(hours=2)),
                  agent="late-bot")
    tickets = [open_ticket(world, title=f"ticket {n}") for n in range(2)]
    assert [t.status for t in tickets] == [CallStatus.AWAITING_EXTERNAL] * 2

    first = start + timedelta(minutes=30)
    assert requests_expire_due(now=first) == 2
    assert pending_state(world, [*expiring, escalating, later]) == [
        (RequestStatus.EXPIRED, None, CallStatus.EXPIRED), (RequestStatus.EXPIRED, None, CallStatus.EXPIRED),
        (RequestStatus.PENDING, first, CallStatus.AWAITING_APPROVAL),
        (RequestStatus.PENDING, None, CallStatus.AWAITING_APPROVAL)]
    assert [call_now(world, t).status for t in tickets] == [CallStatus.AWAITING_EXTERNAL] * 2
    assert sorted(events(world, "approval.expired")) == sorted(
        ("approval.expired", f"call:{r.call_id}", {}, None) for r in expiring)
    assert events(world, "approval.escalated") == [
        ("approval.escalated", f"call:{escalating.call_id}", {"queue": "escalating"}, None)]

    second = start + timedelta(minutes=61)
    assert requests_expire_due(now=second) == 2
    for ticket in tickets:
        ticket = call_now(world, ticket)
        assert ticket.status == CallStatus.EXPIRED
        assert ticket.error == {"errorType": "ExternalExpired", "error": "no result arrived before the deadline",
                                "tool": "open_ticket", "callId": ticket.call_id}
    assert sorted(events(world, "call.expired")) == sorted(
        ("call.expired", f"call:{t.pk}", {"reason": "no external result before the deadline"}, None) for t in tickets)
    assert pending_state(world, [escalating, later]) == [
        (RequestStatus.PENDING, first, CallStatus.AWAITING_APPROVAL),
        (RequestStatus.PENDING, None, CallStatus.AWAITING_APPROVAL)]
    assert requests_expire_due(now=second) == 0


def test_the_periodic_job_runs_at_the_time_it_is_given(world, ask, gov_queue):
    [request] = ask(queue=gov_queue(name="hourly", expires_after=timedelta(hours=1)))
    assert requests_expire_due() == 0
    assert requests_expire_due(now=timezone.now() + timedelta(hours=2)) == 1
    assert pending_state(world, [request]) == [(RequestStatus.EXPIRED, None, CallStatus.EXPIRED)]



@pytest.mark.usefixtures("ticket_tool")
def test_a_pass_of_the_periodic_job_is_not_filled_by_what_is_settled_already(world, ask, gov_queue, monkeypatch):
    """Like the reaper: settled rows keep their deadlines, and a batch that took them would leave the due ones
    (most overdue first) behind for ever once there are as many settled as the batch holds."""
    monkeypatch.setattr(approval_services, "EXPIRE_BATCH", 1)
    start = timezone.now()
    queue_save(tenant=world.a.tenant, queue=default_queue(world.a.tenant), expires_after=timedelta(hours=1))
    decided, expiring = ask(2, queue=gov_queue(name="expiring", expires_after=timedelta(minutes=10)))
    settled, escalated, escalating = ask(3, queue=gov_queue(name="escalating", escalate_after=timedelta(minutes=10)),
                                         agent="night-bot")
    requests = ApprovalRequest.objects.for_tenant(world.a.tenant)
    requests.filter(pk__in=[decided.pk, settled.pk]).update(status=RequestStatus.APPROVED)
    requests.filter(pk=escalated.pk).update(escalated_at=start)
    answered, waiting = (open_ticket(world, title=f"ticket {n}") for n in range(2))
    ToolCall.objects.for_tenant(world.a.tenant).filter(pk=answered.pk).update(status=CallStatus.SUCCEEDED)

    assert requests_expire_due(now=start + timedelta(minutes=61)) == 2  # one request, one external call
    assert pending_state(world, [expiring, escalating]) == [
        (RequestStatus.EXPIRED, None, CallStatus.EXPIRED),
        (RequestStatus.PENDING, start + timedelta(minutes=61), CallStatus.AWAITING_APPROVAL)]
    assert call_now(world, waiting).status == CallStatus.EXPIRED
    assert call_now(world, answered).status == CallStatus.SUCCEEDED


@pytest.mark.usefixtures("ticket_tool")
def test_an_external_call_answered_while_the_job_runs_keeps_its_answer(world, monkeypatch):
    """The job reads the overdue calls first and settles them one by one: one answered in between (by the app,
    from another process) is left with its answer, not expired from the job's stale copy."""
    start = timezone.now()
    queue_save(tenant=world.a.tenant, queue=default_queue(world.a.tenant), expires_after=timedelta(hours=1))
    first, answered = (open_ticket(world, title=f"ticket {n}") for n in range(2))
    audit = approval_services.audit_record

    def answer_the_other(**kwargs):
        ToolCall.objects.for_tenant(world.a.tenant).filter(pk=answered.pk).update(status=CallStatus.SUCCEEDED)
        return audit(**kwargs)

    monkeypatch.setattr(approval_services, "audit_record", answer_the_other)
    assert requests_expire_due(now=start + timedelta(minutes=61)) == 1
    assert call_now(world, first).status == CallStatus.EXPIRED
    assert call_now(world, answered).status == CallStatus.SUCCEEDED
    assert events(world, "call.expired") == [
        ("call.expired", f"call:{first.pk}", {"reason": "no external result before the deadline"}, None)]


def test_a_cancelled_call_takes_its_own_request_out_of_the_inbox_and_no_other(world, ask):
    earlier, cancelled = ask(2)
    call_cancel(call=call_now(world, cancelled.call))
    assert pending_state(world, [earlier, cancelled]) == [
        (RequestStatus.PENDING, None, CallStatus.AWAITING_APPROVAL),
        (RequestStatus.CANCELLED, None, CallStatus.CANCELLED)]


def heard_in_inbox(world, capture_on_commit, act):
    """Run `act`, its on-commit work included, with a listener on tenant A's inbox group; returns what `act` returned
    and the first message the listener heard."""
    import asyncio

    from channels.layers import get_channel_layer

    from realtime.groups import inbox_group

    layer, group = get_channel_layer(), inbox_group(world.a.tenant.pk)
    channel = "specific.inprocess!inboxwatch"  # no inbox yet: what the group is sent waits for the receive below
    asyncio.run(layer.group_add(group, channel))
    try:
        with capture_on_commit(execute=True):
            returned = act()
        return returned, asyncio.run(asyncio.wait_for(layer.receive(channel), timeout=5))
    finally:
        asyncio.run(layer.group_discard(group, channel))


# --- who may decide, and what a decision leaves behind -----------------------------------------

@pytest.mark.parametrize("who", ["viewer", "other tenant's viewer", "other tenant's reviewer", "no member"])
def test_only_a_member_who_reviews_this_tenant_may_decide(world, ask, gov_member, who):
    """Checked by the service itself, whatever the view in front of it checked."""
    from django.contrib.auth import get_user_model

    from tenancy.models import Role

    [request] = ask()
    gov_member()  # a reviewer of the tenant exists: a lookup that lost its user would find them
    user = {
        "viewer": lambda: world.a.users[Role.VIEWER],
        "other tenant's viewer": lambda: gov_member(role=Role.VIEWER, tenant=world.b.tenant),
        "other tenant's reviewer": lambda: world.b.users[Role.REVIEWER],
        "no member": lambda: get_user_model().objects.create_user(username="drifter", password="x" * 12),
    }[who]()
    assert reviewer_may_decide(request=request, user=user) is False
    with pytest.raises(NotPermitted) as refused:
        request_decide(request=request, reviewer=user, decision="approve")
    assert refused.value.detail == "you are not a reviewer of this request's queue"
    assert ApprovalRequest.objects.for_tenant(world.a.tenant).get(pk=request.pk).status == RequestStatus.PENDING
    assert reviewer_may_decide(request=request, user=world.a.users[Role.REVIEWER]) is True


def test_escalation_adds_its_reviewers_to_the_named_ones_and_no_one_else(world, ask, gov_queue, gov_member):
    named, escalation, bystander = gov_member(), gov_member(), gov_member()
    queue = gov_queue(name="oncall", reviewers=[named], escalation_reviewers=[escalation],
                      escalate_after=timedelta(minutes=5))
    [request] = ask(queue=queue)
    may = {user.username: reviewer_may_decide(request=request, user=user) for user in (named, escalation, bystander)}
    assert may == {named.username: True, escalation.username: False, bystander.username: False}
    assert request_escalate(request=request, now=timezone.now()) is True
    may = {user.username: reviewer_may_decide(request=request, user=user) for user in (named, escalation, bystander)}
    assert may == {named.username: True, escalation.username: True, bystander.username: False}


def test_an_unknown_decision_is_refused_naming_the_choices(world, ask, gov_member):
    [request] = ask()
    with pytest.raises(ServiceError) as refused:
        request_decide(request=request, reviewer=gov_member(), decision="maybe")
    assert refused.value.detail == {"decision": ["one of approve, edit, reject, respond"]}


def test_a_decision_is_stamped_and_announced_to_open_inboxes_with_the_new_status(
        world, ask, gov_member, django_capture_on_commit_callbacks):
    [request] = ask()
    before = timezone.now()
    _, message = heard_in_inbox(world, django_capture_on_commit_callbacks, lambda: request_decide(
        request=request, reviewer=gov_member(), decision="reject", message="not today"))
    stored = ApprovalRequest.objects.for_tenant(world.a.tenant).get(pk=request.pk)
    assert stored.status == RequestStatus.REJECTED
    assert before <= stored.decided_at <= timezone.now()
    assert (message["type"], message["change"], message["status"], message["request"]) == (
        "inbox.event", "rejected", "rejected", request.pk)


def test_a_request_is_expired_from_the_instant_its_deadline_is_reached(world, ask, gov_member, monkeypatch):
    [request] = ask()
    instant = timezone.now()
    ApprovalRequest.objects.for_tenant(world.a.tenant).filter(pk=request.pk).update(expires_at=instant)
    request.expires_at = instant
    monkeypatch.setattr(approval_services.timezone, "now", lambda: instant)
    with pytest.raises(Conflict) as refused:
        request_decide(request=request, reviewer=gov_member(), decision="approve")
    assert refused.value.detail == "the request has expired"
    assert ApprovalRequest.objects.for_tenant(world.a.tenant).get(pk=request.pk).status == RequestStatus.EXPIRED
    assert call_now(world, request.call).status == CallStatus.EXPIRED


def test_a_decision_on_a_call_that_moved_on_takes_the_moot_request_out_of_the_inbox(world, ask, gov_member):
    """The call left its wait without the request hearing of it (another process cancelled it)."""
    [request] = ask()
    ToolCall.objects.for_tenant(world.a.tenant).filter(pk=request.call_id).update(status=CallStatus.CANCELLED)
    with pytest.raises(Conflict) as refused:
        request_decide(request=request, reviewer=gov_member(), decision="approve")
    assert refused.value.detail == "the call is already cancelled"
    assert ApprovalRequest.objects.for_tenant(world.a.tenant).get(pk=request.pk).status == RequestStatus.CANCELLED
    assert not Vote.objects.for_tenant(world.a.tenant).filter(request=request).exists()


def test_an_edit_of_a_call_whose_tool_left_the_session_is_refused_naming_the_tool(world, gov_shell, gov_member, ask):
    [request] = ask()
    ToolGroup.objects.for_tenant(world.a.tenant).get(name="basic").tools.remove(gov_shell.tool)
    with pytest.raises(ServiceError) as refused:
        request_decide(request=request, reviewer=gov_member(), decision="edit", new_input={"command": "ls"})
    assert refused.value.detail == {"input": [f"{gov_shell.name!r} is no longer available in this session"]}
    assert not Vote.objects.for_tenant(world.a.tenant).filter(request=request).exists()


def test_a_response_needs_a_message_or_a_structured_answer(world, ask, gov_member):
    [request] = ask()
    with pytest.raises(ServiceError) as refused:
        request_decide(request=request, reviewer=gov_member(), decision="respond", message="")
    assert refused.value.detail == {"message": ["respond with a message or a structured answer"]}
    assert ApprovalRequest.objects.for_tenant(world.a.tenant).get(pk=request.pk).status == RequestStatus.PENDING


@pytest.mark.parametrize(("decision", "given", "kept"), [
    ("respond", {"ticket": 42}, {"ticket": 42}),  # a response's vote keeps its structured answer
    ("reject", {"ticket": 42}, None),  # a rejection has no input, whatever came with it
])
def test_a_vote_keeps_the_input_its_decision_gives(world, ask, gov_member, decision, given, kept):
    [request] = ask()
    request_decide(request=request, reviewer=gov_member(), decision=decision, new_input=given, message="done")
    assert Vote.objects.for_tenant(world.a.tenant).get(request=request).input == kept


def test_a_request_whose_queue_was_deleted_needs_one_approval(world, ask, gov_queue, gov_member):
    queue = gov_queue(name="pairs", required_approvals=2)
    [request] = ask(queue=queue)
    Queue.objects.for_tenant(world.a.tenant).filter(pk=queue.pk).delete()
    request.refresh_from_db()
    assert request.queue is None
    assert request_decide(request=request, reviewer=gov_member(), decision="approve").status == RequestStatus.APPROVED
    assert call_now(world, request.call).status != CallStatus.AWAITING_APPROVAL


@pytest.mark.parametrize(("message", "error"), [("too risky", "too risky"), ("", "a reviewer rejected this call")])
def test_a_rejection_names_its_reviewer_in_the_calls_status_event(world, ask, gov_member, message, error):
    [request] = ask()
    reviewer = gov_member()
    request_decide(request=request, reviewer=reviewer, decision="reject", message=message)
    data = last_status_event(request.call)
    assert (data["status"], data["reviewer"], data["error"]["errorType"], data["error"]["error"]) == (
        "rejected", reviewer.username, "Rejected", error)


def test_a_rejection_never_overwrites_a_call_cancelled_after_the_request_was_read(world, ask, gov_member):
    """The stale copy written out: the call is cancelled by another process right after the decision locked the
    request; the rejection settles the request but leaves the call as the cancel left it."""
    from django.db import connection

    [request] = ask()
    cancelled = []

    def cancel_after_the_lock(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not cancelled and "FOR UPDATE" in sql and '"approvals_approvalrequest"' in sql:
            cancelled.append(ToolCall.objects.for_tenant(world.a.tenant).filter(pk=request.call_id).update(
                status=CallStatus.CANCELLED))
        return result

    with connection.execute_wrapper(cancel_after_the_lock):
        request_decide(request=request, reviewer=gov_member(), decision="reject")
    assert cancelled == [1]
    assert call_now(world, request.call).status == CallStatus.CANCELLED
    assert not CallEvent.objects.for_tenant(world.a.tenant).filter(call_id=request.call_id,
                                                                   data__status="rejected").exists()


# --- a reviewer's edit: how the rules decide it ---------------------------------------------------

def refusal(request, reviewer, new_input) -> dict:
    with pytest.raises(ServiceError) as refused:
        request_decide(request=request, reviewer=reviewer, decision="edit", new_input=new_input)
    assert not Vote.objects.for_tenant(request.tenant_id).filter(request=request).exists()
    assert ApprovalRequest.objects.for_tenant(request.tenant_id).get(pk=request.pk).status == RequestStatus.PENDING
    return refused.value.detail


def test_an_edit_into_input_a_deny_rule_matches_is_refused_naming_the_rule(world, gov_shell, gov_rule, gov_member,
                                                                            ask):
    [request] = ask()
    deny = gov_rule("deny", gov_shell.name, arg_match={"command": "rm *"}, agents=["ops-bot"],
                    users=["carol@example.com"], note="no deletions")
    assert refusal(request, gov_member(), {"command": "rm -rf /data"}) == {"input": [
        f"the rules refuse this input: denied by rule #{deny.id} (tool matches {gov_shell.name!r}, command matches "
        "'rm *', agent is ops-bot, user is carol@example.com): no deletions"]}


def test_an_edit_that_another_queue_must_approve_is_refused_naming_both_queues(world, gov_shell, gov_rule, gov_queue,
                                                                                gov_member, ask):
    [request] = ask()
    payments = gov_queue(name="payments")
    other = gov_rule("ask", gov_shell.name, arg_match={"command": "pay *"}, queue=payments, priority=10)
    assert refusal(request, gov_member(), {"command": "pay 100"}) == {"input": [
        f"this input needs the approval of queue 'payments' (needs approval by rule #{other.id} (tool matches "
        f"{gov_shell.name!r}, command matches 'pay *')), and this request is in queue 'default': reject the call, or "
        "edit it into input this queue may approve"]}


def test_an_edit_of_a_request_whose_queue_was_deleted_needs_the_default_queue(world, gov_shell, gov_queue,
                                                                              gov_member, ask):
    queue = gov_queue(name="gone")
    [request] = ask(queue=queue)
    queue_delete(queue=queue)
    rule = PermissionRule.objects.for_tenant(world.a.tenant).get(tool_pattern=gov_shell.name)
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(pk=request.pk)
    assert refusal(request, gov_member(), {"command": "ls"}) == {"input": [
        f"this input needs the approval of queue 'default' (needs approval by rule #{rule.id} (tool matches "
        f"{gov_shell.name!r}, agent is ops-bot)), and this request is in queue 'none': reject the call, or edit it "
        "into input this queue may approve"]}


def test_an_edit_approved_in_its_own_queue_records_how_the_rules_decided_it(world, gov_shell, gov_rule, gov_queue,
                                                                             gov_member, ask):
    first, second = gov_member(), gov_member()
    queue = gov_queue(name="pairs", required_approvals=2)
    [request] = ask(queue=queue)
    asking = PermissionRule.objects.for_tenant(world.a.tenant).get(tool_pattern=gov_shell.name)
    gov_rule("ask", gov_shell.name, arg_match={"command": "git *"}, queue=queue, priority=20)
    decided = request_decide(request=request, reviewer=first, decision="edit", new_input={"command": "git push"})
    assert decided.status == RequestStatus.PENDING
    git = PermissionRule.objects.for_tenant(world.a.tenant).get(tool_pattern=gov_shell.name, priority=20)
    reason = f"needs approval by rule #{git.id} (tool matches {gov_shell.name!r}, command matches 'git *')"
    edited = Event.objects.for_tenant(world.a.tenant).get(verb="approval.edit")
    assert (edited.target, edited.actor_id, edited.data) == (f"call:{request.call_id}", first.pk, {
        "message": "", "edited": True, "edited_input_decision": {"behavior": "ask", "rule": git.id, "reason": reason}})
    assert call_now(world, request.call).decision["rule"] == asking.id  # not approved yet: the model's decision

    decided = request_decide(request=request, reviewer=second, decision="approve", message="fine")
    assert decided.status == RequestStatus.APPROVED
    call = call_now(world, request.call)
    assert call.decision == {"behavior": "ask", "rule": git.id, "reason": (
        f"a reviewer's edit, approved by {first.username}, {second.username}; the edited input: {reason}")}
    assert call.effective_input == {"command": "git push"}


def test_an_opened_request_is_audited_and_announced_to_open_inboxes(world, ask, gov_queue,
                                                                      django_capture_on_commit_callbacks):
    queue = gov_queue(name="night-shift")
    [request], message = heard_in_inbox(world, django_capture_on_commit_callbacks, lambda: ask(queue=queue))
    assert message == {"type": "inbox.event", "change": "opened", "request": request.pk, "status": "pending",
                       "tool": request.tool_name, "agent": "ops-bot", "queue": "night-shift",
                       "call": str(request.call_id)}
    [opened] = events(world, "approval.opened")
    assert opened == ("approval.opened", f"call:{request.call_id}",
                      {"queue": "night-shift", "rule": request.rule_id, "reason": request.reason}, None)
    assert request.rule_id is not None and request.reason


# --- a rule's values, checked by the service whatever the form or the API checked -----------------

ARG_MATCH_SHAPE = ('an object of argument name → glob, → list of globs, → {"equals": exact value} '
                   'or → {"absent": true}')


@pytest.mark.parametrize(("values", "errors"), [
    ({"arg_match": "git *"}, {"arg_match": [ARG_MATCH_SHAPE]}),
    ({"arg_match": {"command": 7}}, {"arg_match": [ARG_MATCH_SHAPE]}),
    ({"agents": "ops-bot"}, {"agents": ["a list of names"]}),
    ({"agents": [7]}, {"agents": ["a list of names"]}),
    ({"users": ["alice", ""]}, {"users": ["a list of names"]}),
    ({"users": "alice", "agents": [""]}, {"users": ["a list of names"], "agents": ["a list of names"]}),
    ({"tool_pattern": "  "}, {"tool_pattern": ["name a tool, or a pattern such as mcp__github__*"]}),
    ({"tool_pattern": ""}, {"tool_pattern": ["name a tool, or a pattern such as mcp__github__*"]}),
    ({"tool_pattern": None}, {"tool_pattern": ["name a tool, or a pattern such as mcp__github__*"]}),
])
def test_a_rule_with_malformed_values_is_refused_naming_each_field(world, values, errors):
    before = PermissionRule.objects.for_tenant(world.a.tenant).count()
    with pytest.raises(ServiceError) as refused:
        approval_services.rule_create(tenant=world.a.tenant, **{"behavior": "ask", "tool_pattern": "calculate",
                                                                 **values})
    assert refused.value.detail == errors
    assert PermissionRule.objects.for_tenant(world.a.tenant).count() == before


def test_a_rule_may_name_agents_and_users(world):
    rule = approval_services.rule_create(tenant=world.a.tenant, behavior="ask", tool_pattern="calculate",
                                         agents=["ops-bot"], users=["alice@example.com"], arg_match={"x": "1 *"})
    stored = PermissionRule.objects.for_tenant(world.a.tenant).get(pk=rule.pk)
    assert (stored.agents, stored.users, stored.arg_match) == (["ops-bot"], ["alice@example.com"], {"x": "1 *"})


# --- rule_from_approval -------------------------------------------------------------------------

@pytest.mark.parametrize("value,spec", [
    ("ls -la", "ls -la"),
    ("git push *", {"equals": "git push *"}),
    ("ls  -la", {"equals": "ls  -la"}),
    (" ls", {"equals": " ls"}),
    (5, {"equals": 5}),
    (["a", "b"], {"equals": ["a", "b"]}),
])
def test_an_exact_argument_spec_is_the_value_as_a_glob_only_when_it_reads_as_one(value, spec):
    assert _exact_arg_spec(value) == spec


def test_a_suggested_rule_is_refused_while_the_ask_rule_that_opened_the_request_stands(world, ask):
    [request] = ask()
    with pytest.raises(ServiceError) as refused:
        rule_from_approval(request=request, actor=world.a.users["admin"])
    assert refused.value.detail == {"add_rule": [
        f"rule #{request.rule_id} asks for every such call and ask beats allow: change that rule instead"]}
    assert list(PermissionRule.objects.for_tenant(world.a.tenant).values_list("behavior", flat=True)) == ["ask"]


@pytest.fixture
def asks_by_default(world):
    world.a.tenant.default_behavior = "ask"
    world.a.tenant.auto_allow_read_only = False
    world.a.tenant.save()


@pytest.mark.usefixtures("asks_by_default")
def test_a_suggested_rule_allows_the_tool_for_the_agent(world, gov_shell, gov_session):
    [call] = calls_submit(session=gov_session(agent="ops-bot"), calls=[{"name": gov_shell.name, "input": {
        "command": "ls  -la"}}])
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).select_related("call").get(call=call)
    assert request.rule_id is None
    admin = world.a.users["admin"]
    rule = rule_from_approval(request=request, actor=admin)
    rule = PermissionRule.objects.for_tenant(world.a.tenant).get(pk=rule.pk)
    assert (rule.behavior, rule.tool_pattern, rule.agents, rule.users, rule.arg_match, rule.priority, rule.note,
            rule.created_by_id) == ("allow", gov_shell.name, ["ops-bot"], [], {}, 0,
                                    f"added while approving call {call.call_id}", admin.pk)
    assert events(world, "rule.created") == [
        ("rule.created", f"rule:{rule.pk}", {"behavior": "allow", "tool_pattern": gov_shell.name}, admin.pk)]


@pytest.mark.usefixtures("asks_by_default")
def test_a_suggested_rule_narrowed_to_the_input_matches_it_exactly(world, gov_shell, gov_session):
    [call] = calls_submit(session=gov_session(agent="ops-bot"), calls=[{"name": gov_shell.name, "input": {
        "command": "ls  -la"}}])
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).select_related("call").get(call=call)
    rule = rule_from_approval(request=request, actor=world.a.users["admin"], narrow_to_input=True)
    assert PermissionRule.objects.for_tenant(world.a.tenant).get(pk=rule.pk).arg_match == {
        "command": {"equals": "ls  -la"}, "cwd": {"absent": True}}


@pytest.mark.usefixtures("asks_by_default")
def test_a_suggested_rule_narrowed_to_the_input_takes_the_edit_that_stands(world, gov_shell, gov_session, gov_member):
    queue = default_queue(world.a.tenant)
    queue_save(tenant=world.a.tenant, queue=queue, required_approvals=2)
    [call] = calls_submit(session=gov_session(agent="ops-bot"), calls=[{"name": gov_shell.name, "input": {
        "command": "rm -rf /"}}])
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).select_related("call").get(call=call)
    request_decide(request=request, reviewer=gov_member(), decision="edit", new_input={"command": "ls", "cwd": "/tmp"})
    rule = rule_from_approval(request=request, actor=world.a.users["admin"], narrow_to_input=True)
    assert PermissionRule.objects.for_tenant(world.a.tenant).get(pk=rule.pk).arg_match == {
        "command": "ls", "cwd": "/tmp"}


# --- answers: call_respond and external_result_post ------------------------------------------------

def audited_answers(world) -> list[tuple]:
    return [(e.verb, e.target, e.data, e.actor_id, e.actor_label)
            for e in Event.objects.for_tenant(world.a.tenant).filter(verb="call.responded").order_by("id")]


def last_status_event(call) -> dict:
    return CallEvent.objects.for_tenant(call.tenant_id).filter(call_id=call.pk, kind="status").order_by("-seq")[0].data


@pytest.mark.usefixtures("ticket_tool")
def test_a_persons_answer_becomes_the_calls_successful_result(world):
    ticket = open_ticket(world)
    operator = world.a.users["operator"]
    call_respond(call=ticket, actor=operator, message="done", structured={"ticket": 12})
    ticket = call_now(world, ticket)
    assert (ticket.status, ticket.error) == (CallStatus.SUCCEEDED, None)
    assert ticket.result == {"state": "success", "content": [{"type": "text", "text": "done"}],
                             "structured": {"ticket": 12}}
    assert last_status_event(ticket) == {"status": "succeeded", "responder": operator.username}
    assert audited_answers(world) == [
        ("call.responded", f"call:{ticket.pk}", {"state": "success"}, operator.pk, operator.username)]


@pytest.mark.usefixtures("ticket_tool")
def test_an_answer_without_a_message_has_no_content(world):
    ticket = open_ticket(world)
    call_respond(call=ticket, actor=world.a.users["operator"])
    assert call_now(world, ticket).result == {"state": "success", "content": [], "structured": None}


@pytest.mark.usefixtures("ticket_tool")
def test_an_external_error_fails_the_call_with_its_text(world):
    ticket = open_ticket(world)
    key = "helpdesk"  # an external system, named
    content = [{"type": "text", "text": "printer"}, "noise", {"type": "image"}, {"type": "text", "text": "jammed"}]
    external_result_post(call=ticket, actor=key, state="error", content=content)
    ticket = call_now(world, ticket)
    error = {"errorType": "ExternalError", "error": "printer  jammed", "tool": "open_ticket", "callId": ticket.call_id}
    assert (ticket.status, ticket.error) == (CallStatus.FAILED, error)
    assert ticket.result["state"] == "error"
    assert last_status_event(ticket) == {"status": "failed", "error": error, "responder": "helpdesk"}
    assert audited_answers(world) == [("call.responded", f"call:{ticket.pk}", {"state": "error"}, None, "helpdesk")]


@pytest.mark.usefixtures("ticket_tool")
def test_an_external_error_without_text_says_failed(world):
    ticket = open_ticket(world)
    external_result_post(call=ticket, actor="helpdesk", state="error", content=[],
                         structured={"code": 7})
    ticket = call_now(world, ticket)
    assert ticket.error["error"] == "failed"
    assert ticket.result["structured"] == {"code": 7}


@pytest.mark.usefixtures("ticket_tool")
def test_an_external_success_keeps_the_content_it_was_given(world):
    ticket = open_ticket(world)
    content = [{"type": "text", "text": "opened #12"}]
    assert external_result_post(call=ticket, actor="helpdesk", state="success", content=content,
                                structured={"id": 12}) is ticket
    ticket = call_now(world, ticket)
    assert (ticket.status, ticket.result) == (CallStatus.SUCCEEDED, {"state": "success", "content": content,
                                                                     "structured": {"id": 12}})


def test_only_a_call_awaiting_an_external_result_takes_one(world, ask):
    [request] = ask()
    with pytest.raises(Conflict) as refused:
        external_result_post(call=request.call, actor="helpdesk", state="success", content=[])
    assert refused.value.detail == "the call is awaiting_approval, not awaiting an external result"
    assert call_now(world, request.call).status == CallStatus.AWAITING_APPROVAL


@pytest.mark.usefixtures("ticket_tool")
def test_a_settled_call_takes_no_answer(world):
    ticket = open_ticket(world)
    call_respond(call=ticket, actor=world.a.users["operator"], message="done")
    with pytest.raises(Conflict) as refused:
        call_respond(call=ToolCall.objects.for_tenant(world.a.tenant).get(pk=ticket.pk), actor="someone",
                     message="again")
    assert refused.value.detail == "the call is succeeded, not waiting for a result"
    assert len(audited_answers(world)) == 1


def test_a_second_vote_of_the_same_reviewer_is_refused_and_says_why(world, gov_queue, gov_member, ask):
    queue = gov_queue(name="pairs", required_approvals=2)
    [request] = ask(queue=queue)
    reviewer = gov_member()
    request_decide(request=request, reviewer=reviewer, decision="approve")
    with pytest.raises(Conflict) as refused:
        request_decide(request=request, reviewer=reviewer, decision="approve")
    assert refused.value.detail == "you have already voted on this request"
    assert list(Vote.objects.for_tenant(world.a.tenant).filter(request=request).values_list("decision", flat=True)) == [
        "approve"]


def test_an_approval_of_a_standing_edit_is_decided_even_after_the_tool_left_the_sessions_surface(
        world, gov_shell, gov_member, ask, gov_queue):
    """No exposed tool: no bound values, and the rules look the tool up by name."""
    queue = gov_queue(name="pairs", required_approvals=2)
    [request] = ask(queue=queue)
    asking = PermissionRule.objects.for_tenant(world.a.tenant).get(tool_pattern=gov_shell.name)
    first, second = gov_member(), gov_member()
    request_decide(request=request, reviewer=first, decision="edit", new_input={"command": "ls"})
    ToolGroup.objects.for_tenant(world.a.tenant).get(name="basic").tools.remove(gov_shell.tool)
    assert request_decide(request=request, reviewer=second, decision="approve").status == RequestStatus.APPROVED
    reason = f"needs approval by rule #{asking.id} (tool matches {gov_shell.name!r}, agent is ops-bot)"
    assert call_now(world, request.call).decision == {"behavior": "ask", "rule": asking.id, "reason": (
        f"a reviewer's edit, approved by {first.username}, {second.username}; the edited input: {reason}")}


def test_a_suggested_rule_is_allowed_once_the_rule_that_asked_no_longer_asks(world, gov_rule, ask):
    [request] = ask()
    gov_rule("ask", "some_other_tool")
    rule_update(rule=PermissionRule.objects.for_tenant(world.a.tenant).get(pk=request.rule_id), behavior="allow")
    rule = rule_from_approval(request=request, actor=world.a.users["admin"])
    assert (rule.behavior, rule.tool_pattern, rule.agents) == ("allow", request.call.tool_name, ["ops-bot"])


@pytest.mark.usefixtures("asks_by_default")
def test_a_suggested_rule_for_a_tool_no_longer_shown_narrows_to_the_input_alone(world, gov_shell, gov_session):
    [call] = calls_submit(session=gov_session(agent="ops-bot"), calls=[{"name": gov_shell.name, "input": {
        "command": "ls"}}])
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).select_related("call").get(call=call)
    ToolGroup.objects.for_tenant(world.a.tenant).get(name="basic").tools.remove(gov_shell.tool)
    rule = rule_from_approval(request=request, actor=world.a.users["admin"], narrow_to_input=True)
    assert PermissionRule.objects.for_tenant(world.a.tenant).get(pk=rule.pk).arg_match == {"command": "ls"}


@pytest.mark.usefixtures("ticket_tool")
def test_an_error_answer_from_a_stale_copy_leaves_a_cancelled_call_cancelled(world):
    """The answer was read while the call waited; the call was cancelled before it is written."""
    stale = open_ticket(world)
    call_cancel(call=call_now(world, stale))
    with pytest.raises(Conflict):
        call_respond(call=stale, actor=world.a.users["operator"], state="error", message="could not open it")
    cancelled = call_now(world, stale)
    assert (cancelled.status, cancelled.error) == (CallStatus.CANCELLED, None)


def test_a_reviewer_who_answers_instead_of_approving_is_the_answer_s_responder(world, gov_member, ask):
    [request] = ask()
    reviewer = gov_member()
    request_decide(request=request, reviewer=reviewer, decision="respond", message="use the staging host")
    call = call_now(world, request.call)
    assert call.status == CallStatus.SUCCEEDED
    assert last_status_event(call) == {"status": "succeeded", "responder": reviewer.username}
    assert [(verb, actor) for verb, _, _, actor in events(world, "call.responded")] == [
        ("call.responded", reviewer.pk)]


def test_a_rule_cannot_route_to_another_tenant_s_queue(world):
    theirs = default_queue(world.b.tenant)
    with pytest.raises(ServiceError) as refused:
        approval_services.rule_create(tenant=world.a.tenant, behavior="ask", tool_pattern="calculate", queue=theirs)
    assert refused.value.detail == {"queue": ["no such queue"]}
    rule = approval_services.rule_create(tenant=world.a.tenant, behavior="ask", tool_pattern="calculate",
                                         queue=default_queue(world.a.tenant))
    with pytest.raises(ServiceError) as moved:
        rule_update(rule=rule, queue=theirs)
    assert moved.value.detail == {"queue": ["no such queue"]}
    rule.refresh_from_db()
    assert rule.queue == default_queue(world.a.tenant)
