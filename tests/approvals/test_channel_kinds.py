"""Notification channel kinds are a registry (docs/architecture.md, Where to add…): a kind registered from outside
the approvals app is offered by the form and the API, takes the settings it declares, and sends its messages;
names are claimed once, and a stored channel whose kind is gone fails its messages plainly."""
import pytest

from approvals import channel_kinds, notifications
from approvals.channel_kinds import ChannelKind, register_channel_kind
from approvals.forms import ChannelForm
from approvals.models import DeliveryStatus, Notification
from common.errors import ServiceError


@pytest.fixture
def pager(monkeypatch):
    """A kind of our own, to reviewers' addresses, that records what it was given to send."""
    monkeypatch.setattr(channel_kinds, "_kinds", dict(channel_kinds._kinds))
    sent = []
    register_channel_kind(ChannelKind("pager", "a pager per reviewer", lambda n, payload: sent.append(
        (n.recipient, payload)), to_reviewers=True))
    return sent


def test_the_built_in_kinds_are_registered_by_the_app():
    assert channel_kinds.channel_kind_names() == ["webhook", "slack", "email"]
    assert channel_kinds.reviewer_kind_names() == ["email"]
    assert channel_kinds.channel_kind("webhook").signed and not channel_kinds.channel_kind("slack").signed


def test_a_registered_kind_is_offered_saved_and_sent(world, gov_queue, gov_member, pager, inbox_pending):
    queue = gov_queue(reviewers=[gov_member(email="ann@example.com"), gov_member(email="bob@example.com")])
    assert ("pager", "a pager per reviewer") in ChannelForm().fields["kind"].choices
    channel = notifications.channel_save(queue=queue, name="pages", kind="pager", events=["requested"])
    assert channel.target is None and channel.host == ""
    [request] = inbox_pending(1, queue=queue)
    assert notifications.deliveries_send() == 2  # one message per reviewer, to their address
    assert sorted(recipient for recipient, _ in pager) == ["ann@example.com", "bob@example.com"]
    assert all(payload["request"]["id"] == request.pk and payload["event"] == "requested" for _, payload in pager)


def test_a_kind_to_reviewers_takes_no_url_and_a_signed_kind_needs_its_secret(world, gov_queue, pager):
    queue = gov_queue()
    with pytest.raises(ServiceError) as refused:
        notifications.channel_save(queue=queue, name="p", kind="pager", events=["requested"],
                                   url="https://hooks.example.com/x")
    assert refused.value.detail == {"url": ["a pager per reviewer takes no URL or secret"]}
    register_channel_kind(ChannelKind("signedhook", "signed hook", lambda n, p: None, signed=True))
    with pytest.raises(ServiceError) as refused:
        notifications.channel_save(queue=queue, name="s", kind="signedhook", events=["requested"],
                                   url="https://hooks.example.com/x")
    assert refused.value.detail == {"signing_secret": ["a signedhook channel signs its messages: give it a secret"]}


def test_the_api_offers_registered_kinds_and_refuses_others(world, gov_queue, pager):
    queue = gov_queue()
    client = world.a.client("admin")
    created = client.post("/api/v1/notify-channels", {"queue": queue.name, "name": "pages", "kind": "pager",
                                                              "events": ["requested"]}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["kind"] == "pager"
    refused = client.post("/api/v1/notify-channels", {"queue": queue.name, "name": "x", "kind": "carrier",
                                                             "events": ["requested"]}, format="json")
    assert refused.status_code == 400 and "kind" in refused.json()["error"]["fields"]


@pytest.mark.parametrize("name", ["", "Pager", "1pager", "pa-ger", "p" * 33, "pager\n"])
def test_an_ill_formed_kind_name_is_refused(name, pager):
    with pytest.raises(ValueError, match="channel kind is 1-32"):
        register_channel_kind(ChannelKind(name, "x", lambda n, p: None))


def test_a_kind_name_is_claimed_once(pager):
    with pytest.raises(ValueError, match="registered already"):
        register_channel_kind(ChannelKind("email", "another email", lambda n, p: None))
    again = channel_kinds.channel_kind("pager")
    register_channel_kind(again)  # the same kind twice (an app ready twice) is no claim
    assert channel_kinds.channel_kind_names().count("pager") == 1


def test_a_channel_whose_kind_is_gone_fails_its_messages_plainly(world, gov_queue, gov_member, pager,
                                                                 inbox_pending, monkeypatch):
    queue = gov_queue(reviewers=[gov_member(email="ann@example.com")])
    channel = notifications.channel_save(queue=queue, name="pages", kind="pager", events=["requested"])
    inbox_pending(1, queue=queue)
    monkeypatch.delitem(channel_kinds._kinds, "pager")
    for _attempt in range(len(notifications.BACKOFF_S) + 1):
        Notification.all_tenants.filter(channel=channel).update(next_attempt_at=notifications.timezone.now())
        notifications.deliveries_send()
    failed = Notification.all_tenants.filter(channel=channel)
    assert failed.exists() and not pager
    assert {(n.status, n.last_error) for n in failed} == {(DeliveryStatus.FAILED,
                                                           "no channel kind 'pager' is installed")}
