"""Bulk decisions (docs/governance.md, "Approvals"): many requests approved or rejected in one action, each
decided on its own through `request_decide` (its vote, audit entry and timeline event), and the ones the reviewer
may not decide skipped with the reason."""
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest, RequestStatus, Vote
from approvals.selectors import input_digest
from approvals.services import BULK_MAX, request_decide, requests_decide_bulk
from audit.models import Event as AuditEvent
from common.errors import ServiceError
from tests.approvals.test_isolation import ask_everything
from tools.models import CallEvent, CallStatus, EventKind

FOUR_EYES = "four-eyes: you cannot decide a call made in your own session"
VOTED = "you have voted; it waits for the other reviewers"


def fresh(request) -> ApprovalRequest:
    return ApprovalRequest.objects.for_tenant(request.tenant_id).select_related("call").get(pk=request.pk)


def reasons(outcome) -> dict:
    return {skipped.id: skipped.reason for skipped in outcome.skipped}


def test_each_request_is_approved_voted_audited_and_on_its_timeline_alone(world, inbox_pending):
    requests = inbox_pending(3)
    reviewer = world.a.users["reviewer"]
    outcome = requests_decide_bulk(tenant=world.a.tenant, request_ids=[r.pk for r in requests], reviewer=reviewer,
                                   decision="approve")
    assert [r.pk for r in outcome.decided] == [r.pk for r in requests]
    assert outcome.skipped == []
    for request in requests:
        request = fresh(request)
        assert request.status == RequestStatus.APPROVED
        assert request.call.status in (CallStatus.QUEUED, CallStatus.RUNNING, CallStatus.SUCCEEDED)
        votes = Vote.objects.for_tenant(world.a.tenant).filter(request=request)
        assert [(v.reviewer, v.decision) for v in votes] == [(reviewer, "approve")]
        audited = AuditEvent.objects.for_tenant(world.a.tenant).filter(verb="approval.approve",
                                            target=f"call:{request.call_id}")
        assert audited.count() == 1
        logged = CallEvent.objects.for_tenant(world.a.tenant).filter(call_id=request.call_id, kind=EventKind.LOG,
                                          data__reviewer=reviewer.username)
        assert [e.data["text"] for e in logged] == [f"approved by {reviewer.username}"]


def test_reject_settles_each_call_with_the_one_message_for_the_model(world, inbox_pending):
    requests = inbox_pending(2)
    outcome = requests_decide_bulk(tenant=world.a.tenant, request_ids=[r.pk for r in requests],
                                   reviewer=world.a.users["reviewer"], decision="reject",
                                   message="incident 7: nothing runs")
    assert len(outcome.decided) == 2
    for request in requests:
        call = fresh(request).call
        assert call.status == CallStatus.REJECTED
        assert call.error["errorType"] == "Rejected" and call.error["error"] == "incident 7: nothing runs"


def test_what_the_reviewer_may_not_decide_is_skipped_with_the_reason(world, inbox_pending, gov_queue):
    tenant, reviewer = world.a.tenant, world.a.users["reviewer"]
    strict = gov_queue(name="strict", four_eyes=True)
    pair = gov_queue(name="pair", required_approvals=2)
    (own,) = inbox_pending(1, agent="own-bot", user=reviewer.username, queue=strict)
    (voted,) = inbox_pending(1, agent="pair-bot", queue=pair)
    request_decide(request=voted, reviewer=reviewer, decision="approve")
    done, cancelled_later, fine = inbox_pending(3)
    request_decide(request=done, reviewer=world.a.users["operator"], decision="reject", message="no")
    (theirs,) = ask_everything(world.b, 1)
    (late,) = inbox_pending(1, agent="late-bot", queue=gov_queue(name="late"))
    ApprovalRequest.objects.for_tenant(tenant).filter(pk=late.pk).update(expires_at=timezone.now() - timedelta(1))

    ids = [own.pk, voted.pk, done.pk, theirs.pk, "not-an-id", 10 ** 9, late.pk, fine.pk]
    outcome = requests_decide_bulk(tenant=tenant, request_ids=ids, reviewer=reviewer, decision="approve")
    assert [r.pk for r in outcome.decided] == [fine.pk]
    assert reasons(outcome) == {
        own.pk: FOUR_EYES, voted.pk: VOTED, done.pk: "already rejected", theirs.pk: "not found",
        "not-an-id": "not found", 10 ** 9: "not found", late.pk: "the request has expired",
    }
    # Another tenant's request is never touched, nor named beyond its id.
    theirs = ApprovalRequest.objects.for_tenant(world.b.tenant).get(pk=theirs.pk)
    assert theirs.status == RequestStatus.PENDING and not theirs.votes.exists()
    assert next(s for s in outcome.skipped if s.id == theirs.pk).request is None
    # A refusal of one (the expiry, inside `request_decide`) undoes none of the others.
    assert fresh(fine).status == RequestStatus.APPROVED
    assert fresh(late).status == RequestStatus.EXPIRED
    assert fresh(own).status == RequestStatus.PENDING and fresh(voted).status == RequestStatus.PENDING
    assert fresh(cancelled_later).status == RequestStatus.PENDING  # not named, not decided
    assert Vote.objects.for_tenant(tenant).filter(request=own).count() == 0
    assert Vote.objects.for_tenant(tenant).filter(request=voted).count() == 1


def test_quorum_of_two_one_bulk_approval_leaves_the_request_pending(world, inbox_pending, gov_queue):
    tenant = world.a.tenant
    pair = gov_queue(name="pair", required_approvals=2)
    requests = inbox_pending(2, queue=pair)
    ids = [r.pk for r in requests]
    first = requests_decide_bulk(tenant=tenant, request_ids=ids, reviewer=world.a.users["reviewer"],
                                 decision="approve")
    assert [r.status for r in first.decided] == [RequestStatus.PENDING] * 2
    assert {fresh(r).call.status for r in requests} == {CallStatus.AWAITING_APPROVAL}
    # The same reviewer again: skipped, the vote stands; a second reviewer settles them.
    again = requests_decide_bulk(tenant=tenant, request_ids=ids, reviewer=world.a.users["reviewer"],
                                 decision="approve")
    assert again.decided == [] and set(reasons(again).values()) == {VOTED}
    second = requests_decide_bulk(tenant=tenant, request_ids=ids, reviewer=world.a.users["operator"],
                                  decision="approve")
    assert [r.status for r in second.decided] == [RequestStatus.APPROVED] * 2


def test_approval_runs_only_the_input_the_list_showed(world, inbox_pending, gov_queue, gov_member):
    tenant, reviewer = world.a.tenant, world.a.users["reviewer"]
    shown, changed, unshown = inbox_pending(3, queue=gov_queue(name="trio", required_approvals=2))
    # Another reviewer's edit replaced the input of `changed` after the list was shown.
    request_decide(request=changed, reviewer=gov_member(), decision="edit", new_input={"command": "rm -rf /"})
    seen = {shown.pk: input_digest({"command": "ls -la 0"}), changed.pk: input_digest({"command": "ls -la 1"})}
    outcome = requests_decide_bulk(tenant=tenant, request_ids=[shown.pk, changed.pk, unshown.pk], reviewer=reviewer,
                                   decision="approve", seen=seen)
    assert [r.pk for r in outcome.decided] == [shown.pk]
    assert reasons(outcome) == {
        changed.pk: "its input changed after the list was shown: open it to read it and decide",
        unshown.pk: "the list did not show all of its input: open it to read it and decide",
    }
    # Rejecting runs nothing: what was shown does not matter.
    rejected = requests_decide_bulk(tenant=tenant, request_ids=[changed.pk, unshown.pk], reviewer=reviewer,
                                    decision="reject", seen={})
    assert len(rejected.decided) == 2


def test_the_number_per_action_is_capped_and_only_approve_or_reject_is_bulk(world, inbox_pending):
    (pending,) = inbox_pending(1)
    reviewer = world.a.users["reviewer"]
    with pytest.raises(ServiceError) as refused:
        requests_decide_bulk(tenant=world.a.tenant, request_ids=[pending.pk, *range(10 ** 6, 10 ** 6 + BULK_MAX)],
                             reviewer=reviewer, decision="approve")
    assert f"at most {BULK_MAX} requests at a time ({BULK_MAX + 1} were selected)" in refused.value.message
    # the same id twice counts once
    assert len(requests_decide_bulk(tenant=world.a.tenant, request_ids=[pending.pk] * (BULK_MAX + 5),
                                    reviewer=reviewer, decision="reject").decided) == 1
    for decision in ("edit", "respond", "bogus"):
        with pytest.raises(ServiceError):
            requests_decide_bulk(tenant=world.a.tenant, request_ids=[pending.pk], reviewer=reviewer,
                                 decision=decision)
    with pytest.raises(ServiceError):
        requests_decide_bulk(tenant=world.a.tenant, request_ids=[], reviewer=reviewer, decision="approve")


# --- the API: POST /api/v1/approvals/decide -------------------------------------------------------

def test_the_api_decides_each_and_says_what_it_skipped(world, inbox_pending, gov_console_api):
    first, second = inbox_pending(2)
    (theirs,) = ask_everything(world.b, 1)
    client = gov_console_api(world.a.users["reviewer"], world.a.tenant)
    response = client.post("/api/v1/approvals/decide", {"ids": [first.pk, theirs.pk, second.pk, first.pk],
                                                        "decision": "reject", "message": "not now"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json() == {"decided": [{"id": first.pk, "status": "rejected"},
                                           {"id": second.pk, "status": "rejected"}],
                               "skipped": [{"id": theirs.pk, "reason": "not found"}]}
    assert ApprovalRequest.objects.for_tenant(world.b.tenant).get(pk=theirs.pk).status == RequestStatus.PENDING
    # Decided requests are skipped the second time, with the reason.
    again = client.post("/api/v1/approvals/decide", {"ids": [first.pk], "decision": "approve"}, format="json")
    assert again.json() == {"decided": [], "skipped": [{"id": first.pk, "reason": "already rejected"}]}


def test_an_admin_key_decides_in_bulk_as_automation(world, inbox_pending):
    requests = inbox_pending(2)
    response = world.a.client("admin").post("/api/v1/approvals/decide", {
        "ids": [r.pk for r in requests], "decision": "approve"}, format="json")
    assert response.status_code == 200, response.content
    assert [d["status"] for d in response.json()["decided"]] == ["approved", "approved"]
    votes = Vote.objects.for_tenant(world.a.tenant).filter(request__in=requests)
    assert {v.reviewer_label for v in votes} == {"apikey:admin"}


def test_the_api_refuses_viewers_agent_keys_too_many_ids_and_other_decisions(world, inbox_pending, gov_console_api):
    (pending,) = inbox_pending(1)
    body = {"ids": [pending.pk], "decision": "approve"}
    for client in (gov_console_api(world.a.users["viewer"], world.a.tenant), world.a.client("agent")):
        assert client.post("/api/v1/approvals/decide", body, format="json").status_code == 403
    reviewer = gov_console_api(world.a.users["reviewer"], world.a.tenant)
    many = reviewer.post("/api/v1/approvals/decide", {"ids": list(range(1, BULK_MAX + 2)), "decision": "approve"},
                         format="json")
    assert many.status_code == 400
    assert f"at most {BULK_MAX} requests at a time" in many.content.decode()
    for refused in ({"ids": ["x"], "decision": "approve"}, {"ids": [2 ** 64], "decision": "approve"},
                    {"ids": [], "decision": "approve"}, {"ids": [pending.pk], "decision": "edit"},
                    {"ids": pending.pk, "decision": "reject"}, {"ids": [pending.pk]}):
        response = reviewer.post("/api/v1/approvals/decide", refused, format="json")
        assert response.status_code == 400, (refused, response.content)
    assert ApprovalRequest.objects.for_tenant(world.a.tenant).get(pk=pending.pk).status == RequestStatus.PENDING
    assert not Vote.objects.for_tenant(world.a.tenant).filter(request=pending).exists()
