"""A one-time decision link is spent only by a decision it made (docs/notes/governance.md, Notifications): a click
that is refused (a vote already cast, four-eyes, not a reviewer of the queue, an expired request) leaves the
link to the reviewer it was meant for, and two people on one link at once still cast one vote."""
import os
import threading
from datetime import timedelta
from types import SimpleNamespace
from urllib.parse import urlencode

import pytest
from django.db import connection, connections
from django.test import Client
from django.utils import timezone

from approvals import decision_links, notifications
from approvals import services as approvals
from approvals.models import ApprovalRequest, DecisionLink, RequestStatus, Vote
from common.errors import Conflict, NotPermitted
from tools.models import CallStatus

USED = "this link was used already"


def link_token(request: ApprovalRequest, decision: str = "approve", user=None) -> str:
    """A link as a message carries it: a row for the request (shared when `user` is None), its signed token."""
    link = DecisionLink.objects.create(tenant_id=request.tenant_id, request=request, decision=decision, user=user)
    return notifications.link_token(link.pk)


def spent(token: str) -> bool:
    link_id = int(token.split(":", 1)[0])
    return DecisionLink.all_tenants.get(pk=link_id).used_at is not None


def act(token: str) -> str:
    return f"/t/acme/inbox/act/?{urlencode({'token': token})}"


def console(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_reviewer_who_voted_clicks_a_link_and_leaves_it_to_the_next_reviewer(world, inbox_pending, gov_queue,
                                                                                gov_member):
    first, second, third = gov_member(), gov_member(), gov_member()
    (pending,) = inbox_pending(1, queue=gov_queue(required_approvals=2))
    token = link_token(pending)
    approvals.request_decide(request=pending, reviewer=first, decision="approve")
    refused = console(first).post(act(token))
    assert refused.status_code == 409 and "you have already voted" in refused.content.decode()
    assert not spent(token)
    assert console(second).post(act(token)).status_code == 302
    pending.refresh_from_db()
    assert pending.status == RequestStatus.APPROVED
    assert sorted(Vote.objects.for_tenant(world.a.tenant).filter(request=pending).values_list(
        "reviewer_id", flat=True)) == sorted([first.pk, second.pk])
    # the decision it made spent it
    assert spent(token)
    again = console(third).post(act(token))
    assert again.status_code == 410 and "This link was used already." in again.content.decode()


@pytest.mark.parametrize("refusal", ["four-eyes", "not named", "viewer"])
def test_a_click_refused_for_who_clicked_spends_nothing(world, inbox_pending, gov_queue, gov_member, refusal):
    requester, named, other = gov_member(username="carol"), gov_member(), gov_member()
    queue = gov_queue(four_eyes=True, reviewers=[requester, named, other])
    (pending,) = inbox_pending(1, queue=queue, user="carol")
    token = link_token(pending)
    clicker = {"four-eyes": requester, "not named": gov_member(), "viewer": world.a.users["viewer"]}[refusal]
    with pytest.raises(NotPermitted):
        decision_links.link_use(tenant=world.a.tenant, token=token, user=clicker)
    assert not spent(token)
    assert decision_links.link_use(tenant=world.a.tenant, token=token, user=named).status == RequestStatus.APPROVED
    assert spent(token)


def test_a_vote_a_link_cast_spends_it_for_everyone(world, inbox_pending, gov_queue, gov_member):
    first, second = gov_member(), gov_member()
    (pending,) = inbox_pending(1, queue=gov_queue(required_approvals=2))
    token = link_token(pending)
    assert decision_links.link_use(tenant=world.a.tenant, token=token, user=first).status == RequestStatus.PENDING
    assert spent(token)
    for user in (first, second):
        with pytest.raises(decision_links.LinkRefused, match=USED):
            decision_links.link_use(tenant=world.a.tenant, token=token, user=user)
    assert Vote.objects.for_tenant(world.a.tenant).filter(request=pending).count() == 1


def test_a_request_that_expires_between_the_check_and_the_vote_is_expired_and_the_link_is_not_spent(
        world, inbox_pending, gov_queue, monkeypatch):
    (pending,) = inbox_pending(1, queue=gov_queue(expires_after=timedelta(minutes=10)))
    token = link_token(pending)
    deadline = timezone.now() - timedelta(seconds=1)
    ApprovalRequest.objects.for_tenant(world.a.tenant).filter(pk=pending.pk).update(expires_at=deadline)
    # the link's own check runs a moment before the deadline, the vote after it
    monkeypatch.setattr(decision_links, "timezone", SimpleNamespace(now=lambda: deadline - timedelta(seconds=1)))
    with pytest.raises(Conflict, match="expired"):
        decision_links.link_use(tenant=world.a.tenant, token=token, user=world.a.users["reviewer"])
    assert not spent(token)
    # the refusal's own finding is kept: the request and its call are expired
    pending.refresh_from_db()
    assert pending.status == RequestStatus.EXPIRED
    assert pending.call.status == CallStatus.EXPIRED
    assert not Vote.objects.for_tenant(world.a.tenant).filter(request=pending).exists()


# --- at once --------------------------------------------------------------------------------------------------

CLICKERS = 6


@pytest.fixture
def needs_postgres(db):
    if connection.vendor != "postgresql":
        if os.environ.get("TOOLKEEPER_REQUIRE_SERVICES") == "1":
            pytest.fail("PostgreSQL is required (TOOLKEEPER_REQUIRE_SERVICES=1)")
        pytest.skip("concurrent clicks need PostgreSQL")


def click_together(tenant, token: str, users) -> list:
    barrier = threading.Barrier(len(users))
    outcomes: list = [None] * len(users)

    def click(position, user):
        try:
            barrier.wait(timeout=10)
            decision_links.link_use(tenant=tenant, token=token, user=user)
            outcomes[position] = "voted"
        except decision_links.LinkRefused as exc:
            outcomes[position] = str(exc)
        except Conflict as exc:
            outcomes[position] = exc.message
        except Exception as exc:  # an unexpected error is an outcome the test reports
            outcomes[position] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=click, args=(i, u)) for i, u in enumerate(users)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads), "a click never returned"
    return outcomes


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("needs_postgres")
def test_people_on_one_link_at_once_cast_one_vote_and_a_refused_one_does_not_take_it(world, inbox_pending,
                                                                                    gov_queue, gov_member):
    voted = gov_member()
    others = [gov_member() for _ in range(CLICKERS - 1)]
    # a quorum nobody reaches here, so every vote that got through would stay on the request
    (pending,) = inbox_pending(1, queue=gov_queue(required_approvals=CLICKERS + 1))
    approvals.request_decide(request=pending, reviewer=voted, decision="approve")
    token = link_token(pending)
    outcomes = click_together(world.a.tenant, token, [voted, *others])
    assert outcomes[0] in ("you have already voted on this request", USED), outcomes
    assert sorted(outcomes[1:]) == sorted(["voted"] + [USED] * (CLICKERS - 2)), outcomes
    votes = Vote.objects.for_tenant(world.a.tenant).filter(request=pending)
    assert votes.count() == 2
    assert spent(token)


def test_only_a_reviewer_of_the_links_tenant_may_click_it(world, inbox_pending, gov_queue):
    """A reviewer of another tenant, or a viewer of this one, is refused before anything is decided."""
    (pending,) = inbox_pending(1, queue=gov_queue())
    token = link_token(pending)
    for user in (world.b.users["reviewer"], world.a.users["viewer"]):
        with pytest.raises(NotPermitted, match="^only reviewers decide$"):
            decision_links.link_use(tenant=world.a.tenant, token=token, user=user)
    assert not spent(token)
    assert not Vote.objects.for_tenant(world.a.tenant).filter(request=pending).exists()


def test_a_links_vote_says_it_came_through_a_link(world, inbox_pending, gov_queue, gov_member):
    (pending,) = inbox_pending(1, queue=gov_queue())
    decision_links.link_use(tenant=world.a.tenant, token=link_token(pending), user=gov_member())
    vote = Vote.objects.for_tenant(world.a.tenant).get(request=pending)
    assert (vote.decision, vote.message) == ("approve", "decided through a link in a notification")
