"""Stale copies against the conditional updates that keep an approval request's state machine exact.

Each test reads a copy of a pending request, lets another actor move the request on, then acts with the old
copy: the update's own condition must refuse it. The interleaving is written out step by step: no threads,
no timing. (The racing tests in `test_concurrent_decisions.py` show the same under real concurrency.)
"""
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest, RequestStatus, Vote
from approvals.services import (
    external_result_post,
    request_decide,
    request_escalate,
    request_expire,
    requests_expire_due,
)
from audit.models import Event
from common.errors import Conflict
from tests.approvals.test_external import open_ticket, ticket_tool  # noqa: F401 - ticket_tool: a fixture
from tests.tools.support import wait_terminal
from tools.calls.events import call_fail
from tools.calls.submit import calls_submit
from tools.models import CallStatus, ToolCall

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("drain_calls")]


@pytest.fixture
def pending(world, gov_shell, gov_queue, gov_rule, gov_session, gov_member):
    """A call of the counting tool waiting in a queue with escalation reviewers; two stale copies of its request."""
    queue = gov_queue(name="stale", escalation_reviewers=[gov_member()], escalate_after=timedelta(minutes=10))
    gov_rule("ask", gov_shell.name, queue=queue)
    [call] = calls_submit(session=gov_session(), calls=[{"name": gov_shell.name, "input": {"command": "deploy"}}])
    assert call.status == CallStatus.AWAITING_APPROVAL

    def copy() -> ApprovalRequest:
        return ApprovalRequest.objects.for_tenant(world.a.tenant).select_related("call", "queue", "tenant").get(
            call=call)

    return call, copy


def request_now(world, call) -> ApprovalRequest:
    return ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)


def audited(world, verb: str, call) -> int:
    return Event.objects.for_tenant(world.a.tenant).filter(verb=verb, target=f"call:{call.pk}").count()


def test_a_stale_copy_cannot_expire_a_request_approved_since(world, gov_shell, gov_member, pending):
    call, copy = pending
    stale = copy()  # the expiry job read the request while it was pending
    request_decide(request=copy(), reviewer=gov_member(), decision="approve")
    assert request_expire(request=stale) is False
    assert request_now(world, call).status == RequestStatus.APPROVED
    assert audited(world, "approval.expired", call) == 0
    finished = wait_terminal(call.pk, tenant=world.a.tenant)
    assert (finished.status, gov_shell.counter.count) == (CallStatus.SUCCEEDED, 1)


@pytest.mark.parametrize("decision", ["approve", "reject", "edit", "respond"])
def test_a_stale_copy_cannot_decide_a_request_expired_since(world, gov_shell, gov_member, pending, decision):
    call, copy = pending
    stale = copy()  # a reviewer's page loaded while it was pending
    assert request_expire(request=copy()) is True
    with pytest.raises(Conflict, match="the request is already expired"):
        request_decide(request=stale, reviewer=gov_member(), decision=decision, message="late",
                       new_input={"command": "deploy --dry-run"} if decision == "edit" else None)
    assert request_now(world, call).status == RequestStatus.EXPIRED
    assert not Vote.objects.for_tenant(world.a.tenant).filter(request=stale).exists()
    assert ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk).status == CallStatus.EXPIRED
    assert gov_shell.counter.count == 0


def test_a_stale_copy_cannot_decide_a_request_decided_since(world, gov_shell, gov_member, pending):
    call, copy = pending
    stale = copy()
    request_decide(request=copy(), reviewer=gov_member(), decision="reject", message="no")
    with pytest.raises(Conflict, match="the request is already rejected"):
        request_decide(request=stale, reviewer=gov_member(), decision="approve")
    assert ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk).status == CallStatus.REJECTED
    assert gov_shell.counter.count == 0


def test_a_stale_copy_cannot_escalate_a_request_decided_since(world, gov_member, pending):
    call, copy = pending
    stale = copy()  # the escalation job read it while it was pending
    request_decide(request=copy(), reviewer=gov_member(), decision="reject", message="no")
    assert request_escalate(request=stale, now=timezone.now()) is False
    assert request_now(world, call).escalated_at is None
    assert audited(world, "approval.escalated", call) == 0


def test_a_request_escalates_once_whatever_the_copies(world, pending):
    call, copy = pending
    first, second = copy(), copy()
    assert request_escalate(request=first, now=timezone.now()) is True
    assert request_escalate(request=second, now=timezone.now() + timedelta(seconds=5)) is False
    assert request_now(world, call).escalated_at == first.escalated_at
    assert audited(world, "approval.escalated", call) == 1
    requests_expire_due(now=timezone.now() + timedelta(minutes=11))  # the job, after it: nothing more
    assert audited(world, "approval.escalated", call) == 1


@pytest.mark.usefixtures("ticket_tool")
def test_a_stale_copy_cannot_answer_an_external_call_expired_since(world):
    """The external system read the call while it waited; the expiry job failed it before the answer came."""
    call = open_ticket(world)
    assert call.status == CallStatus.AWAITING_EXTERNAL
    stale = ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk)
    assert call_fail(call=ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk), error_type="ExternalExpired",
                     message="no result", status=CallStatus.EXPIRED, from_statuses=[CallStatus.AWAITING_EXTERNAL])
    with pytest.raises(Conflict, match="not waiting for a result"):
        external_result_post(call=stale, actor=world.a.key_objects["external"], state="success",
                             content=[{"type": "text", "text": "done"}])
    settled = ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk)
    assert (settled.status, settled.error["errorType"]) == (CallStatus.EXPIRED, "ExternalExpired")
    assert audited(world, "call.responded", call) == 0
