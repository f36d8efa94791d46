"""Who may decide which request, said before the click (`decide_refusals`), must agree with what deciding
then allows: named reviewers, escalation reviewers once a request escalates, and a vote that still stands."""
from datetime import timedelta

from django.utils import timezone

from approvals.models import ApprovalRequest, RequestStatus
from approvals.selectors import request_rows
from approvals.services import decide_refusals, request_decide, request_escalate, reviewer_may_decide

NOT_NAMED = "you are not a reviewer of this request's queue"
VOTED = "you have voted; it waits for the other reviewers"


def pending_rows(tenant) -> list[ApprovalRequest]:
    """The pending requests as the inbox list loads them."""
    requests = ApprovalRequest.objects.for_tenant(tenant).filter(status=RequestStatus.PENDING).order_by("pk")
    return list(request_rows(requests, tenant=tenant))


def test_named_and_escalation_reviewers_are_refused_exactly_where_deciding_would_be(world, inbox_pending, gov_queue,
                                                                                      gov_member):
    tenant = world.a.tenant
    first, second, escalation, outsider = (gov_member() for _ in range(4))
    payments = gov_queue(name="payments", reviewers=[first, second])
    night = gov_queue(name="night", reviewers=[first], escalation_reviewers=[escalation],
                      escalate_after=timedelta(minutes=10))
    (paying,) = inbox_pending(1, agent="pay-bot", queue=payments)
    (late,) = inbox_pending(1, agent="night-bot", queue=night)
    (anyone,) = inbox_pending(1, agent="open-bot", queue=gov_queue(name="open"))
    people = {"first": first, "second": second, "escalation": escalation, "outsider": outsider}

    def refused() -> dict[str, set[int]]:
        rows = pending_rows(tenant)
        assert {row.pk for row in rows} == {paying.pk, late.pk, anyone.pk}
        seen = {}
        for name, user in people.items():
            refusals = decide_refusals(requests=rows, user=user)
            assert set(refusals.values()) <= {NOT_NAMED}, refusals
            seen[name] = set(refusals)
            # the list says no exactly where deciding would refuse
            assert seen[name] == {row.pk for row in rows if not reviewer_may_decide(request=row, user=user)}, name
        return seen

    assert refused() == {"first": set(), "second": {late.pk}, "escalation": {paying.pk, late.pk},
                         "outsider": {paying.pk, late.pk}}
    assert request_escalate(request=late, now=timezone.now())
    # escalation adds its reviewers to the named ones, and nobody else
    assert refused() == {"first": set(), "second": {late.pk}, "escalation": {paying.pk},
                         "outsider": {paying.pk, late.pk}}


def test_a_reviewer_whose_vote_was_an_edit_is_told_it_waits_and_so_is_one_who_approved_it(world, inbox_pending,
                                                                                             gov_queue, gov_member):
    tenant = world.a.tenant
    (pending,) = inbox_pending(1, queue=gov_queue(name="trio", required_approvals=3))
    editor, approver, third = gov_member(), gov_member(), gov_member()
    request_decide(request=pending, reviewer=editor, decision="edit", new_input={"command": "ls"})
    assert decide_refusals(requests=pending_rows(tenant), user=editor) == {pending.pk: VOTED}
    assert decide_refusals(requests=pending_rows(tenant), user=approver) == {}
    # an approval of someone's edit is a vote that stands as well
    request_decide(request=pending_rows(tenant)[0], reviewer=approver, decision="approve")
    rows = pending_rows(tenant)
    assert [row.pk for row in rows] == [pending.pk]
    assert decide_refusals(requests=rows, user=approver) == {pending.pk: VOTED}
    assert decide_refusals(requests=rows, user=editor) == {pending.pk: VOTED}
    assert decide_refusals(requests=rows, user=third) == {}
