"""A queue's quorum must be reachable by the people who may vote in it, when it is made and after every edit,
counting what the edit leaves as it was (`queue_save`)."""
from datetime import timedelta

import pytest

from approvals.models import Queue
from approvals.services import queue_save
from common.errors import ServiceError

ADVICE = ": name more reviewers or ask for fewer approvals"


def refusal(**kwargs) -> list[str]:
    with pytest.raises(ServiceError) as caught:
        queue_save(**kwargs)
    return caught.value.detail["required_approvals"]


def test_a_new_queue_asks_for_one_approval_unless_told_so_one_named_reviewer_is_enough(world, gov_member):
    only = gov_member()
    queue = queue_save(tenant=world.a.tenant, name="solo", reviewers=[only])
    assert queue.required_approvals == 1 and list(queue.reviewers.all()) == [only]


def test_the_refusal_counts_in_words_that_fit_the_numbers(world, gov_member):
    only = gov_member()
    assert refusal(tenant=world.a.tenant, name="strict", reviewers=[only], four_eyes=True) == [
        "1 approval with four-eyes (which keeps out the session's own user) needs 2 members who review, "
        f"and only 1 of the reviewers it names can{ADVICE}"]
    assert refusal(tenant=world.a.tenant, name="many", reviewers=[only], required_approvals=2) == [
        f"2 approvals need 2 members who review, and only 1 of the reviewers it names can{ADVICE}"]
    assert not Queue.objects.for_tenant(world.a.tenant).filter(name__in=["strict", "many"]).exists()


def test_an_edit_is_checked_with_the_settings_it_leaves_as_they_were(world, gov_member):
    tenant = world.a.tenant
    first, second, third = gov_member(), gov_member(), gov_member()

    # the quorum and four-eyes kept from the queue, the reviewers changed
    pair = queue_save(tenant=tenant, name="pair", required_approvals=2, four_eyes=True,
                      reviewers=[first, second, third])
    assert refusal(tenant=tenant, queue=pair, reviewers=[first, second]) == [
        "2 approvals with four-eyes (which keeps out the session's own user) need 3 members who review, "
        f"and only 2 of the reviewers it names can{ADVICE}"]
    pair.refresh_from_db()
    assert set(pair.reviewers.all()) == {first, second, third}

    # the named reviewers kept, the quorum raised: the tenant's other reviewers do not count
    named = queue_save(tenant=tenant, name="named", reviewers=[first])
    assert refusal(tenant=tenant, queue=named, required_approvals=2) == [
        f"2 approvals need 2 members who review, and only 1 of the reviewers it names can{ADVICE}"]

    # reviewers and escalation reviewers both kept: an edit of something else goes through
    escalating = queue_save(tenant=tenant, name="escalating", reviewers=[first], escalation_reviewers=[second],
                            escalate_after=timedelta(minutes=10), required_approvals=2)
    saved = queue_save(tenant=tenant, queue=escalating, description="nights and weekends")
    assert saved.description == "nights and weekends"
    # and without the escalation the same quorum is out of reach
    assert refusal(tenant=tenant, queue=escalating, escalate_after=None) == [
        f"2 approvals need 2 members who review, and only 1 of the reviewers it names can{ADVICE}"]
