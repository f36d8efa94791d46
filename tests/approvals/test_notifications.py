"""Notifications of a queue's events: signed webhooks to a real local receiver, Slack's shape, email through the
locmem backend, retries and the delivery log, quiet hours, the expiry digest, the SSRF guard, write-only secrets,
one-time decision links and tenant isolation."""
import hashlib
import hmac
import json
from datetime import time as clock
from datetime import timedelta

import pytest
from django.core import mail
from django.test import override_settings
from django.utils import timezone

from approvals import decision_links, notifications
from approvals import services as approvals
from approvals.models import (
    ApprovalRequest,
    DecisionLink,
    DeliveryStatus,
    Notification,
    NotificationChannel,
    RequestStatus,
)
from common.errors import NotPermitted, ServiceError
from tenancy.models import Role
from tests.approvals.conftest import console_api
from tests.tools import http_endpoint
from tools.models import CallStatus

SECRET = "a-signing-secret-of-some-length"


@pytest.fixture
def receiver(settings):
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1"]
    yield from http_endpoint.serve()


@pytest.fixture
def channel(world, receiver):
    def make(queue, *, kind="webhook", path="/echo/hook", events=("requested",), **values):
        if kind != "email":
            values.setdefault("url", receiver.url + path)
        if kind == "webhook":
            values.setdefault("signing_secret", SECRET)
        return notifications.channel_save(queue=queue, name=values.pop("name", f"ch-{kind}"), kind=kind,
                                          events=list(events), **values)

    return make


def posted(receiver) -> list:
    return [r for r in receiver.received if r.method == "POST"]


def verify(received, secret=SECRET) -> dict:
    """The body, after checking its signature as a receiver would."""
    stamp = received.headers["X-Toolkeeper-Timestamp"]
    expected = "v1=" + hmac.new(secret.encode(), f"{stamp}.".encode() + received.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(received.headers["X-Toolkeeper-Signature"], expected)
    return json.loads(received.body)


def test_a_new_request_reaches_the_webhook_signed_and_without_the_arguments(world, gov_queue, channel, receiver,
                                                                             inbox_pending):
    queue = gov_queue()
    channel(queue)
    [request] = inbox_pending(1, queue=queue, command="rm -rf /secret-path")
    assert notifications.deliveries_send() == 1
    [received] = posted(receiver)
    assert received.headers["X-Toolkeeper-Event"] == "requested"
    body = verify(received)
    assert body["event"] == "requested" and body["tenant"] == "acme"
    assert body["request"]["id"] == request.pk and body["request"]["tool"] == request.tool_name
    assert body["request"]["url"].endswith(f"/t/acme/inbox/{request.pk}/")
    assert "secret-path" not in received.body.decode()
    # a changed body or another secret fails the receiver's check
    with pytest.raises(AssertionError):
        verify(received, secret="another-secret-altogether")
    delivery = Notification.objects.for_tenant(world.a.tenant).get()
    assert (delivery.status, delivery.attempts, delivery.last_error) == (DeliveryStatus.SENT, 1, "")
    assert notifications.deliveries_send() == 0  # sent once, never again


def test_an_escalation_reaches_the_webhook_and_mails_the_escalation_reviewers(world, gov_queue, gov_member, channel,
                                                                              receiver, inbox_pending):
    first = gov_member(email="first@example.com")
    senior = gov_member(email="senior@example.com")
    queue = gov_queue(reviewers=[first], escalation_reviewers=[senior], escalate_after=timedelta(minutes=5))
    channel(queue, events=["escalated"])
    channel(queue, kind="email", events=["escalated"], name="mail")
    [request] = inbox_pending(1, queue=queue)
    assert notifications.deliveries_send() == 0  # nobody takes new requests here
    approvals.requests_expire_due(now=timezone.now() + timedelta(minutes=6))
    assert notifications.deliveries_send() == 2
    [received] = posted(receiver)
    body = verify(received)
    assert (body["event"], body["request"]["id"]) == ("escalated", request.pk)
    assert [m.to for m in mail.outbox] == [["senior@example.com"]]
    assert request.tool_name in mail.outbox[0].subject


def test_a_failing_receiver_is_retried_with_backoff_and_the_log_shows_it(world, gov_queue, channel, receiver,
                                                                         inbox_pending):
    queue = gov_queue()
    channel(queue, path="/fail")
    inbox_pending(1, queue=queue)
    now = timezone.now()
    assert notifications.deliveries_send(now=now) == 0
    delivery = Notification.objects.for_tenant(world.a.tenant).get()
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.PENDING, 1)
    assert delivery.last_error == "the receiver answered HTTP 500"
    wait = timedelta(seconds=notifications.BACKOFF_S[0])
    assert now + wait <= delivery.next_attempt_at <= timezone.now() + wait
    assert notifications.deliveries_send(now=now + timedelta(seconds=5)) == 0 and len(posted(receiver)) == 1
    for _ in notifications.BACKOFF_S:
        notifications.deliveries_send(now=delivery.next_attempt_at)
        delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.FAILED, len(notifications.BACKOFF_S) + 1)
    assert len(posted(receiver)) == len(notifications.BACKOFF_S) + 1
    page = world.a.console("operator").get(f"/t/acme/queues/{queue.pk}/notifications/")
    assert page.status_code == 200
    log = page.content.decode()
    assert "the receiver answered HTTP 500" in log and f'id="delivery-{delivery.pk}"' in log and "failed" in log


def test_a_receiver_that_comes_back_gets_the_message(world, gov_queue, channel, receiver, inbox_pending):
    queue = gov_queue()
    hook = channel(queue, path="/busy")
    inbox_pending(1, queue=queue)
    now = timezone.now()
    notifications.deliveries_send(now=now)
    notifications.channel_save(queue=queue, channel=hook, url=receiver.url + "/echo/back")
    retry_at = Notification.objects.for_tenant(world.a.tenant).get().next_attempt_at
    assert notifications.deliveries_send(now=retry_at) == 1
    delivery = Notification.objects.for_tenant(world.a.tenant).get()
    assert (delivery.status, delivery.attempts, delivery.last_error) == (DeliveryStatus.SENT, 2, "")


def test_quiet_hours_hold_messages_until_they_end(world, gov_queue, channel, receiver, inbox_pending):
    queue = gov_queue()
    now = timezone.localtime()
    start = (now - timedelta(hours=1)).time().replace(second=0, microsecond=0)
    end = (now + timedelta(hours=1)).time().replace(second=0, microsecond=0)
    hook = channel(queue, quiet_from=start, quiet_until=end)
    inbox_pending(1, queue=queue)
    now = timezone.localtime()
    assert notifications.deliveries_send(now=now) == 0 and posted(receiver) == []
    delivery = Notification.objects.for_tenant(world.a.tenant).get()
    assert delivery.attempts == 0 and delivery.status == DeliveryStatus.PENDING
    assert timezone.localtime(delivery.next_attempt_at).time() == end
    assert notifications.deliveries_send(now=delivery.next_attempt_at) == 1
    # a test message is not held
    notifications.channel_test(channel=hook, actor=world.a.users["operator"])
    assert notifications.deliveries_send() == 1


@pytest.mark.parametrize("start,end,at,inside", [
    (clock(22), clock(7), clock(23), True),
    (clock(22), clock(7), clock(6, 59), True),
    (clock(22), clock(7), clock(7), False),
    (clock(22), clock(7), clock(12), False),
    (clock(9), clock(17), clock(8, 59), False),
    (clock(9), clock(17), clock(9), True),
])
def test_quiet_hours_may_span_midnight(start, end, at, inside):
    channel = NotificationChannel(quiet_from=start, quiet_until=end)
    moment = timezone.localtime().replace(hour=at.hour, minute=at.minute, second=0, microsecond=0)
    ends = notifications.in_quiet_hours(channel, moment)
    assert (ends is not None) is inside
    if inside:
        assert ends > moment and ends.time() == end and ends - moment <= timedelta(days=1)


def test_email_reaches_reviewers_who_did_not_mute_it(world, gov_queue, gov_member, channel, inbox_pending):
    keen, muted, picky = (gov_member(email=f"{n}@example.com") for n in ("keen", "muted", "picky"))
    no_address = gov_member()
    queue = gov_queue(reviewers=[keen, muted, picky, no_address])
    mail_channel = channel(queue, kind="email", events=["requested", "decided"])
    notifications.reviewer_setting_save(tenant=world.a.tenant, user=muted, muted=True)
    notifications.reviewer_setting_save(tenant=world.a.tenant, user=picky, muted=False, excluded=[mail_channel])
    [request] = inbox_pending(1, queue=queue)
    assert notifications.deliveries_send() == 1
    [message] = mail.outbox
    assert message.to == ["keen@example.com"]
    assert f"/t/acme/inbox/{request.pk}/" in message.body
    approvals.request_decide(request=request, reviewer=keen, decision="reject", message="no")
    notifications.deliveries_send()
    assert "rejected" in mail.outbox[1].subject


def test_slack_channels_get_text_and_blocks(world, gov_queue, channel, receiver, inbox_pending):
    queue = gov_queue()
    channel(queue, kind="slack", action_links=True)
    [request] = inbox_pending(1, queue=queue)
    notifications.deliveries_send()
    [received] = posted(receiver)
    body = json.loads(received.body)
    assert request.tool_name in body["text"]
    assert body["blocks"][0]["type"] == "section"
    buttons = body["blocks"][1]["elements"]
    assert [b["text"]["text"] for b in buttons] == ["Approve", "Reject"]
    assert all("/t/acme/inbox/act/?token=" in b["url"] for b in buttons)
    assert "X-Toolkeeper-Signature" not in received.headers  # no secret given


def test_an_external_task_waiting_notifies_the_default_queue(world, channel, receiver):
    from tools.calls.submit import calls_submit
    from tools.models import ToolGroup

    admin = world.a.client("admin")
    assert admin.post("/api/v1/tools", {"name": "open_ticket", "description": "Open a ticket.",
                                        "input_schema": {"type": "object"}}, format="json").status_code == 201
    basic = ToolGroup.objects.for_tenant(world.a.tenant).get(name="basic")
    admin.patch(f"/api/v1/groups/{basic.pk}", {"tools": [t.name for t in basic.tools.all()] + ["open_ticket"]},
                format="json")
    default = approvals.default_queue(world.a.tenant)
    channel(default, events=["external"])
    [call] = calls_submit(session=world.a.session, calls=[{"name": "open_ticket", "input": {}}])
    assert call.status == CallStatus.AWAITING_EXTERNAL
    notifications.deliveries_send()
    [received] = posted(receiver)
    body = verify(received)
    assert body["event"] == "external" and body["task"]["call"] == str(call.pk)
    assert body["task"]["tool"] == "open_ticket" and body["task"]["url"].endswith("/t/acme/inbox/external/")


def test_the_expiry_digest_lists_each_request_once(world, gov_queue, channel, receiver, inbox_pending):
    queue = gov_queue(expires_after=timedelta(minutes=10))
    channel(queue, events=["expiring"])
    requests = inbox_pending(2, queue=queue)
    assert notifications.expiry_digest() == 1
    assert notifications.expiry_digest() == 0
    notifications.deliveries_send()
    [received] = posted(receiver)
    body = verify(received)
    assert sorted(r["id"] for r in body["requests"]) == sorted(r.pk for r in requests)


def test_outbound_urls_pass_the_guard_when_saved_and_when_sent(world, gov_queue, channel, receiver, inbox_pending,
                                                               settings):
    queue = gov_queue()
    for url in ("http://169.254.169.254/latest/meta-data/", "http://10.0.0.5/hook", "file:///etc/passwd"):
        with pytest.raises(ServiceError) as refused:
            notifications.channel_save(queue=queue, name="bad", kind="webhook", events=["requested"], url=url,
                                       signing_secret=SECRET)
        assert "url" in refused.value.fields
    channel(queue)
    inbox_pending(1, queue=queue)
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = []  # loopback is internal: refused when connecting
    notifications.deliveries_send()
    delivery = Notification.objects.for_tenant(world.a.tenant).get()
    assert delivery.status == DeliveryStatus.PENDING and delivery.attempts == 1 and delivery.last_error
    assert posted(receiver) == []


def test_secrets_are_write_only_and_encrypted(world, gov_queue, channel, receiver):
    from django.db import connection

    queue = gov_queue()
    hook = channel(queue)
    client = world.a.client("admin")
    shown = client.get(f"/api/v1/notify-channels/{hook.pk}").json()
    assert "url" not in shown and "signing_secret" not in shown and shown["host"] == "127.0.0.1"
    with connection.cursor() as cursor:
        cursor.execute("SELECT target FROM approvals_notificationchannel WHERE id = %s", [hook.pk])
        stored = cursor.fetchone()[0]
    assert SECRET not in stored and receiver.url not in stored
    page = world.a.console("operator").get(f"/t/acme/queues/{queue.pk}/channels/{hook.pk}/").content.decode()
    assert SECRET not in page and receiver.url not in page
    # an update without them keeps them
    client.patch(f"/api/v1/notify-channels/{hook.pk}", {"events": ["requested", "decided"]}, format="json")
    hook.refresh_from_db()
    assert hook.target == {"url": receiver.url + "/echo/hook", "secret": SECRET}


def test_the_api_keeps_channels_settings_and_logs_per_tenant(world, gov_queue, channel, receiver, inbox_pending):
    queue = gov_queue()
    hook = channel(queue)
    inbox_pending(1, queue=queue)
    notifications.deliveries_send()
    mine, theirs = world.a.client("admin"), world.b.client("admin")
    assert [c["id"] for c in mine.get("/api/v1/notify-channels").json()["results"]] == [hook.pk]
    assert theirs.get("/api/v1/notify-channels").json()["results"] == []
    assert theirs.get("/api/v1/notify-deliveries").json()["results"] == []
    assert theirs.get(f"/api/v1/notify-channels/{hook.pk}").status_code == 404
    assert theirs.post(f"/api/v1/notify-channels/{hook.pk}/test").status_code == 404
    refused = theirs.post("/api/v1/notify-channels", {"queue": queue.name, "name": "x", "kind": "email",
                                                     "events": ["requested"]}, format="json")
    assert refused.status_code == 400 and "queue" in refused.json()["error"]["fields"]
    logged = mine.get("/api/v1/notify-deliveries", {"status": "sent"}).json()["results"]
    assert [(d["channel"], d["event"], d["attempts"]) for d in logged] == [(hook.name, "requested", 1)]
    member = world.a.users["reviewer"]
    created = mine.post("/api/v1/notify-settings", {"user": member.username, "muted": True, "excluded": [hook.pk]},
                        format="json")
    assert created.status_code == 201, created.content
    assert theirs.post("/api/v1/notify-settings", {"user": member.username, "muted": True},
                       format="json").status_code == 400
    assert theirs.post("/api/v1/notify-settings", {"user": world.b.users["reviewer"].username, "muted": False,
                                                   "excluded": [hook.pk]}, format="json").status_code == 400
    # an agent key reads none of it
    assert world.a.client("agent").get("/api/v1/notify-channels").status_code == 403


def test_the_api_creates_channels_and_sends_a_test(world, gov_queue, receiver):
    queue = gov_queue()
    client = world.a.client("admin")
    bad = client.post("/api/v1/notify-channels", {"queue": queue.name, "name": "hook", "kind": "webhook",
                                                  "events": ["requested"], "url": "http://169.254.169.254/x",
                                                  "signing_secret": SECRET}, format="json")
    assert bad.status_code == 400 and "url" in bad.json()["error"]["fields"]
    made = client.post("/api/v1/notify-channels", {"queue": queue.name, "name": "hook", "kind": "webhook",
                                                   "events": ["requested"], "url": receiver.url + "/echo/t",
                                                   "signing_secret": SECRET}, format="json")
    assert made.status_code == 201, made.content
    tested = client.post(f"/api/v1/notify-channels/{made.json()['id']}/test")
    assert tested.status_code == 202 and tested.json()["event"] == "test"
    notifications.deliveries_send()
    assert verify(posted(receiver)[0])["event"] == "test"


# --- decision links ------------------------------------------------------------------------------

def links_in(receiver) -> dict:
    return json.loads(posted(receiver)[-1].body)["links"]


def token_of(url: str) -> str:
    from urllib.parse import parse_qs, urlsplit

    return parse_qs(urlsplit(url).query)["token"][0]


def act(token: str, tenant: str = "acme") -> str:
    from urllib.parse import urlencode

    return f"/t/{tenant}/inbox/act/?{urlencode({'token': token})}"


def test_a_link_approves_once_for_a_logged_in_reviewer(world, gov_queue, channel, receiver, inbox_pending):
    queue = gov_queue()
    channel(queue, action_links=True)
    [request] = inbox_pending(1, queue=queue)
    notifications.deliveries_send()
    approve = links_in(receiver)["approve"]
    assert approve.startswith("http://127.0.0.1:8000/t/acme/inbox/act/?token=")
    path = act(token_of(approve))
    anonymous = world.a.console("reviewer")
    anonymous.logout()
    assert anonymous.post(path).status_code == 302  # to the login page: nothing decided
    reviewer = world.a.console("reviewer")
    shown = reviewer.get(path)
    assert shown.status_code == 200 and request.tool_name in shown.content.decode()
    request.refresh_from_db()
    assert request.status == RequestStatus.PENDING  # a GET (a mail scanner) decides nothing
    assert reviewer.post(path).status_code == 302
    request.refresh_from_db()
    assert request.status == RequestStatus.APPROVED
    again = reviewer.post(path)
    assert again.status_code == 410 and "used already" in again.content.decode()
    reject = act(token_of(links_in(receiver)["reject"]))
    assert "already decided" in reviewer.get(reject).content.decode()


def test_links_refuse_the_other_tenant_a_forged_token_and_an_expired_request(world, gov_queue, gov_member, channel,
                                                                             receiver, inbox_pending):
    queue = gov_queue(expires_after=timedelta(minutes=10))
    channel(queue, action_links=True)
    [request] = inbox_pending(1, queue=queue)
    notifications.deliveries_send()
    token = token_of(links_in(receiver)["approve"])
    outsider = world.b.console("admin")
    assert outsider.post(act(token)).status_code == 404  # not a member of acme
    assert outsider.post(act(token, "globex")).status_code == 410  # no such link in globex
    reviewer = world.a.console("reviewer")
    assert reviewer.post(act(token[:-2] + "xx")).status_code == 410
    assert reviewer.post(act("")).status_code == 410
    link_id, rest = token.split(":", 1)  # another link's id under this one's signature
    assert reviewer.post(act(f"{int(link_id) + 1}:{rest}")).status_code == 410
    ApprovalRequest.objects.for_tenant(world.a.tenant).filter(pk=request.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1))
    expired = reviewer.post(act(token))
    assert expired.status_code == 410 and "expired" in expired.content.decode()
    request.refresh_from_db()
    assert request.status == RequestStatus.PENDING and request.votes.count() == 0


def test_links_obey_four_eyes_and_reviewer_lists(world, gov_queue, gov_member, channel, receiver, inbox_pending):
    requester = gov_member(username="carol@example.com")
    outside_queue = gov_member()
    inside = gov_member()
    queue = gov_queue(four_eyes=True, reviewers=[requester, inside])
    channel(queue, action_links=True)
    [request] = inbox_pending(1, queue=queue, user="carol@example.com")
    notifications.deliveries_send()
    token = token_of(links_in(receiver)["approve"])
    with pytest.raises(NotPermitted, match="four-eyes"):
        decision_links.link_use(tenant=world.a.tenant, token=token, user=requester)
    with pytest.raises(NotPermitted):
        decision_links.link_use(tenant=world.a.tenant, token=token, user=outside_queue)
    viewer = world.a.users["viewer"]
    with pytest.raises(NotPermitted):
        decision_links.link_use(tenant=world.a.tenant, token=token, user=viewer)
    assert DecisionLink.objects.for_tenant(world.a.tenant).filter(used_at__isnull=False).count() == 0
    settled = decision_links.link_use(tenant=world.a.tenant, token=token, user=inside)
    assert settled.status == RequestStatus.APPROVED


def test_mailed_links_belong_to_their_reviewer_and_count_toward_quorum(world, gov_queue, gov_member, channel,
                                                                       inbox_pending):
    first, second = gov_member(email="first@example.com"), gov_member(email="second@example.com")
    queue = gov_queue(reviewers=[first, second], required_approvals=2)
    channel(queue, kind="email", action_links=True)
    [request] = inbox_pending(1, queue=queue)
    notifications.deliveries_send()
    tokens = {}
    for message in mail.outbox:
        [line] = [line for line in message.body.splitlines() if line.startswith("Approve")]
        tokens[message.to[0]] = token_of(line.split(": ", 1)[1])
    with pytest.raises(NotPermitted, match="^this link was sent to another reviewer$"):
        decision_links.link_use(tenant=world.a.tenant, token=tokens["second@example.com"], user=first)
    assert decision_links.link_use(tenant=world.a.tenant, token=tokens["first@example.com"],
                                   user=first).status == RequestStatus.PENDING
    with pytest.raises(decision_links.LinkRefused, match="used already"):
        decision_links.link_use(tenant=world.a.tenant, token=tokens["first@example.com"], user=first)
    assert decision_links.link_use(tenant=world.a.tenant, token=tokens["second@example.com"],
                                   user=second).status == RequestStatus.APPROVED


def test_a_request_decided_in_the_inbox_makes_old_links_answer_already_decided(world, gov_queue, channel, receiver,
                                                                               inbox_pending):
    queue = gov_queue()
    channel(queue, action_links=True)
    [request] = inbox_pending(1, queue=queue)
    notifications.deliveries_send()
    token = token_of(links_in(receiver)["reject"])
    approvals.request_decide(request=request, reviewer=world.a.users["reviewer"], decision="approve")
    with pytest.raises(decision_links.LinkRefused, match="already decided: approved"):
        decision_links.link_use(tenant=world.a.tenant, token=token, user=world.a.users["admin"])


def test_a_resent_message_carries_links_that_all_work(world, gov_queue, channel, receiver, inbox_pending):
    queue = gov_queue()
    hook = channel(queue, action_links=True, path="/fail")
    inbox_pending(1, queue=queue)
    notifications.deliveries_send()
    first = token_of(json.loads(posted(receiver)[-1].body)["links"]["approve"])
    notifications.channel_save(queue=queue, channel=hook, url=receiver.url + "/echo/ok")
    notifications.deliveries_send(now=Notification.objects.for_tenant(world.a.tenant).get().next_attempt_at)
    second = token_of(links_in(receiver)["approve"])
    # the failed attempt may have reached someone (an error after delivery): its link is the same link
    assert decision_links.link_open(tenant=world.a.tenant, token=first).pk == decision_links.link_open(
        tenant=world.a.tenant, token=second).pk
    decision_links.link_use(tenant=world.a.tenant, token=first, user=world.a.users["reviewer"])
    with pytest.raises(decision_links.LinkRefused):
        decision_links.link_use(tenant=world.a.tenant, token=second, user=world.a.users["admin"])


# --- console -------------------------------------------------------------------------------------

def test_operators_set_up_channels_in_the_console_and_reviewers_mute_themselves(world, gov_queue, receiver):
    queue = gov_queue()
    operator = world.a.console("operator")
    base = f"/t/acme/queues/{queue.pk}/notifications/"
    assert world.a.console("reviewer").get(base).status_code == 403
    refused = operator.post(base, {"name": "hook", "kind": "webhook", "events": ["requested"],
                                   "url": "http://169.254.169.254/", "signing_secret": SECRET, "enabled": "on"})
    assert refused.status_code == 400 and not NotificationChannel.objects.for_tenant(world.a.tenant).exists()
    made = operator.post(base, {"name": "hook", "kind": "webhook", "events": ["requested", "escalated"],
                                "url": receiver.url + "/echo/c", "signing_secret": SECRET, "enabled": "on"})
    assert made.status_code == 302
    hook = NotificationChannel.objects.for_tenant(world.a.tenant).get()
    assert hook.events == ["requested", "escalated"] and hook.enabled
    assert operator.post(f"/t/acme/queues/{queue.pk}/channels/{hook.pk}/test/").status_code == 302
    notifications.deliveries_send()
    assert verify(posted(receiver)[0])["event"] == "test"
    reviewer = world.a.console("reviewer")
    assert reviewer.post("/t/acme/inbox/notifications/", {"muted": "on"}).status_code == 302
    assert approvals_setting(world).muted


def approvals_setting(world):
    from approvals.models import ReviewerNotifySetting

    return ReviewerNotifySetting.objects.for_tenant(world.a.tenant).get(user=world.a.users["reviewer"])


def test_channel_pages_refuse_a_channel_of_another_queue(world, gov_queue, channel):
    first, second = gov_queue(), gov_queue()
    hook = channel(first)
    operator = world.a.console("operator")
    assert operator.get(f"/t/acme/queues/{second.pk}/channels/{hook.pk}/").status_code == 404
    assert operator.post(f"/t/acme/queues/{second.pk}/channels/{hook.pk}/delete/").status_code == 404
    assert NotificationChannel.objects.for_tenant(world.a.tenant).filter(pk=hook.pk).exists()


def test_console_api_user_sends_test_email_to_themselves(world, gov_queue, gov_member, channel):
    queue = gov_queue()
    mailer = channel(queue, kind="email")
    operator = gov_member(role=Role.OPERATOR, email="op@example.com")
    client = console_api(operator, world.a.tenant)
    assert client.post(f"/api/v1/notify-channels/{mailer.pk}/test").status_code == 202
    notifications.deliveries_send()
    assert [m.to for m in mail.outbox] == [["op@example.com"]]
    nameless = console_api(world.a.users["operator"], world.a.tenant)
    assert nameless.post(f"/api/v1/notify-channels/{mailer.pk}/test").status_code == 400


# --- after commit, in the background ---------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_a_committed_request_is_sent_in_the_background(world, gov_queue, channel, receiver, inbox_pending,
                                                       drain_calls):
    import time

    queue = gov_queue()
    channel(queue)
    [request] = inbox_pending(1, queue=queue)
    deadline = time.monotonic() + 10
    while not posted(receiver) and time.monotonic() < deadline:
        time.sleep(0.05)
    [received] = posted(receiver)
    assert verify(received)["request"]["id"] == request.pk
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if Notification.objects.for_tenant(world.a.tenant).get().status == DeliveryStatus.SENT:
            break
        time.sleep(0.05)
    assert Notification.objects.for_tenant(world.a.tenant).get().status == DeliveryStatus.SENT


@override_settings(TOOLKEEPER_PUBLIC_URL="https://toolkeeper.example.com/")
def test_links_start_with_the_public_url(world, gov_queue, channel, receiver, inbox_pending):
    queue = gov_queue()
    channel(queue, action_links=True)
    inbox_pending(1, queue=queue)
    notifications.deliveries_send()
    body = json.loads(posted(receiver)[0].body)
    assert body["request"]["url"].startswith("https://toolkeeper.example.com/t/acme/inbox/")
    assert links_in(receiver)["approve"].startswith("https://toolkeeper.example.com/t/acme/inbox/act/?token=")


def test_a_link_older_than_its_longest_life_is_refused(world, gov_queue, channel, receiver, inbox_pending,
                                                       monkeypatch):
    queue = gov_queue()
    channel(queue, action_links=True)
    inbox_pending(1, queue=queue)
    notifications.deliveries_send()
    token = token_of(links_in(receiver)["approve"])
    monkeypatch.setattr(decision_links, "LINK_MAX_AGE_S", -1)  # as if the week had passed
    with pytest.raises(decision_links.LinkRefused, match="expired"):
        decision_links.link_open(tenant=world.a.tenant, token=token)


def test_a_message_is_claimed_by_one_sender_only(world, gov_queue, channel, receiver, inbox_pending):
    queue = gov_queue()
    channel(queue)
    inbox_pending(1, queue=queue)
    delivery = Notification.objects.for_tenant(world.a.tenant).get()
    now = timezone.now()
    first = notifications._claim(delivery.pk, now)
    assert first is not None and first.attempts == 1
    assert notifications._claim(delivery.pk, now) is None  # a second sender, same moment: nothing to send
    assert notifications.deliveries_send(now=now) == 0 and posted(receiver) == []
    # the first sender vanished: once its lease lapses, the message is sent again
    later = now + timedelta(seconds=notifications.LEASE_S + 1)
    assert notifications.deliveries_send(now=later) == 1
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.SENT, 2)


def test_disabled_channels_and_other_events_write_nothing(world, gov_queue, channel, inbox_pending):
    queue = gov_queue()
    channel(queue, enabled=False)
    channel(queue, events=["decided"], name="decisions")
    other = gov_queue()
    channel(other, name="elsewhere")
    inbox_pending(1, queue=queue)
    assert not Notification.objects.for_tenant(world.a.tenant).exists()


def test_a_change_that_rolls_back_tells_nobody(world, gov_queue, channel, inbox_pending):
    from django.db import transaction

    queue = gov_queue()
    channel(queue, events=["decided"])
    [request] = inbox_pending(1, queue=queue)
    with pytest.raises(RuntimeError), transaction.atomic():
        approvals.request_decide(request=request, reviewer=world.a.users["reviewer"], decision="reject")
        raise RuntimeError("the surrounding work failed")
    assert not Notification.objects.for_tenant(world.a.tenant).exists()
    request.refresh_from_db()
    approvals.request_decide(request=request, reviewer=world.a.users["reviewer"], decision="reject")
    assert Notification.objects.for_tenant(world.a.tenant).get().event == "decided"


def test_a_disabled_channel_sends_nothing_it_had_not_sent(world, gov_queue, channel, receiver, inbox_pending):
    queue = gov_queue()
    hook = channel(queue)
    inbox_pending(1, queue=queue)
    notifications.channel_save(queue=queue, channel=hook, enabled=False)
    assert notifications.deliveries_send() == 0 and posted(receiver) == []
    delivery = Notification.objects.for_tenant(world.a.tenant).get()
    assert (delivery.status, delivery.last_error) == (DeliveryStatus.FAILED, "not sent: the channel was disabled")


def test_a_receiver_that_never_answers_is_cut_off_at_the_deadline(world, gov_queue, channel, receiver, inbox_pending,
                                                                  monkeypatch):
    monkeypatch.setattr(notifications, "SEND_DEADLINE_S", 0.5)
    queue = gov_queue()
    channel(queue, path="/slow")
    inbox_pending(1, queue=queue)
    assert notifications.deliveries_send() == 0
    delivery = Notification.objects.for_tenant(world.a.tenant).get()
    assert (delivery.status, delivery.attempts, delivery.last_error) == (
        DeliveryStatus.PENDING, 1, "no answer within 0.5 s")


def test_a_webhook_becomes_an_email_channel_and_forgets_its_url(world, gov_queue, channel, receiver):
    queue = gov_queue()
    hook = channel(queue)
    mailer = notifications.channel_save(queue=queue, channel=hook, kind="email")
    assert (mailer.kind, mailer.target, mailer.host) == ("email", None, "")
    with pytest.raises(ServiceError, match="needs its URL again"):
        notifications.channel_save(queue=queue, channel=mailer, kind="slack")


def test_a_refused_console_form_does_not_show_the_url_back(world, gov_queue, channel, receiver):
    queue = gov_queue()
    channel(queue, name="taken")
    secret_url = receiver.url + "/echo/T000/B000/token-in-the-url"
    page = world.a.console("operator").post(f"/t/acme/queues/{queue.pk}/notifications/", {
        "name": "taken", "kind": "slack", "events": ["requested"], "url": secret_url, "enabled": "on"})
    assert page.status_code == 400
    body = page.content.decode()
    assert "this queue has a channel of that name" in body and "token-in-the-url" not in body
