"""Where a decision link's life ends, to the second (docs/notes/governance.md, Notifications): a token is good for
a week (7 × 24 × 3600 s) after it was signed, and a request that expires at this very moment is expired for a
link and for the inbox alike; one second earlier, both still act."""
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.core import signing
from django.utils import timezone

from approvals import decision_links, notifications
from approvals import services as approvals
from approvals.models import ApprovalRequest, DecisionLink, RequestStatus
from common.errors import Conflict

WEEK_S = 7 * 24 * 3600
SIGNED_AT = 1_700_000_000  # a whole second, as the signer stamps it


@pytest.fixture
def signer_clock(monkeypatch):
    """The signer's clock (`django.core.signing` reads `time.time()`), set by the test."""
    clock = SimpleNamespace(now=float(SIGNED_AT))
    monkeypatch.setattr(signing, "time", SimpleNamespace(time=lambda: clock.now))
    return clock


@pytest.fixture
def pending_link(world, inbox_pending, gov_queue):
    (pending,) = inbox_pending(1, queue=gov_queue())
    return DecisionLink.objects.create(tenant_id=pending.tenant_id, request=pending, decision="approve")


@pytest.mark.parametrize("age_s,good", [(0, True), (WEEK_S - 1, True), (WEEK_S, True), (WEEK_S + 1, False),
                                        (WEEK_S + 3600, False)])
def test_a_token_is_good_for_a_week_to_the_second(world, pending_link, signer_clock, age_s, good):
    token = notifications.link_token(pending_link.pk)
    signer_clock.now = SIGNED_AT + age_s
    if good:
        assert decision_links.link_open(tenant=world.a.tenant, token=token).pk == pending_link.pk
    else:
        with pytest.raises(decision_links.LinkRefused, match="not valid or has expired"):
            decision_links.link_open(tenant=world.a.tenant, token=token)


def test_a_token_past_its_week_spends_and_decides_nothing(world, pending_link, signer_clock):
    token = notifications.link_token(pending_link.pk)
    signer_clock.now = SIGNED_AT + WEEK_S + 1
    with pytest.raises(decision_links.LinkRefused):
        decision_links.link_use(tenant=world.a.tenant, token=token, user=world.a.users["reviewer"])
    pending_link.refresh_from_db()
    assert pending_link.used_at is None and pending_link.request.status == RequestStatus.PENDING


@pytest.fixture
def frozen_now(monkeypatch):
    """One moment for the link's checks and the inbox's (the database keeps its own clock)."""
    now = timezone.now().replace(microsecond=0)
    frozen = SimpleNamespace(now=lambda: now)
    monkeypatch.setattr(decision_links, "timezone", frozen)
    monkeypatch.setattr(approvals, "timezone", frozen)
    return now


def expiring_at(request: ApprovalRequest, moment) -> ApprovalRequest:
    ApprovalRequest.objects.for_tenant(request.tenant_id).filter(pk=request.pk).update(expires_at=moment)
    request.refresh_from_db()
    return request


def test_a_link_of_a_request_that_expires_now_is_refused(world, pending_link, frozen_now):
    expiring_at(pending_link.request, frozen_now)
    token = notifications.link_token(pending_link.pk)
    with pytest.raises(decision_links.LinkRefused, match="this request has expired"):
        decision_links.link_open(tenant=world.a.tenant, token=token)
    with pytest.raises(decision_links.LinkRefused, match="this request has expired"):
        decision_links.link_use(tenant=world.a.tenant, token=token, user=world.a.users["reviewer"])
    pending_link.refresh_from_db()
    assert pending_link.used_at is None


def test_a_link_of_a_request_that_expires_in_a_second_decides(world, pending_link, frozen_now):
    request = expiring_at(pending_link.request, frozen_now + timedelta(seconds=1))
    token = notifications.link_token(pending_link.pk)
    assert decision_links.link_open(tenant=world.a.tenant, token=token).pk == pending_link.pk
    settled = decision_links.link_use(tenant=world.a.tenant, token=token, user=world.a.users["reviewer"])
    assert settled.pk == request.pk and settled.status == RequestStatus.APPROVED


def test_the_inbox_refuses_a_request_that_expires_now_and_expires_it(world, inbox_pending, gov_queue, frozen_now):
    (pending,) = inbox_pending(1, queue=gov_queue())
    pending = expiring_at(pending, frozen_now)
    with pytest.raises(Conflict, match="the request has expired"):
        approvals.request_decide(request=pending, reviewer=world.a.users["reviewer"], decision="approve")
    pending.refresh_from_db()
    assert pending.status == RequestStatus.EXPIRED


def test_the_inbox_decides_a_request_that_expires_in_a_second(world, inbox_pending, gov_queue, frozen_now):
    (pending,) = inbox_pending(1, queue=gov_queue())
    pending = expiring_at(pending, frozen_now + timedelta(seconds=1))
    settled = approvals.request_decide(request=pending, reviewer=world.a.users["reviewer"], decision="approve")
    assert settled.status == RequestStatus.APPROVED


def test_each_refusal_of_a_link_in_exact_words(world, pending_link):
    def refusal(token: str, tenant=None) -> str:
        with pytest.raises(decision_links.LinkRefused) as caught:
            decision_links.link_open(tenant=tenant or world.a.tenant, token=token)
        return str(caught.value)

    token = notifications.link_token(pending_link.pk)
    assert refusal(token + "x") == "this link is not valid or has expired"  # the signature
    assert refusal(signing.TimestampSigner(salt=notifications.LINK_SALT).sign("not a number")) == (
        "this link is not valid or has expired")
    assert refusal(token, tenant=world.b.tenant) == "this link is not valid or has expired"  # another's
    assert refusal(notifications.link_token(pending_link.pk + 1000)) == "this link is not valid or has expired"
    links = DecisionLink.objects.for_tenant(world.a.tenant).filter(pk=pending_link.pk)
    links.update(used_at=timezone.now())
    assert refusal(token) == "this link was used already"
    links.update(used_at=None)
    ApprovalRequest.objects.for_tenant(world.a.tenant).filter(pk=pending_link.request_id).update(
        status=RequestStatus.REJECTED)
    assert refusal(token) == "this request was already decided: rejected"
    ApprovalRequest.objects.for_tenant(world.a.tenant).filter(pk=pending_link.request_id).update(
        status=RequestStatus.PENDING, expires_at=timezone.now() - timedelta(seconds=1))
    assert refusal(token) == "this request has expired"
