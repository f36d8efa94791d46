"""Reviewers told where they work: a queue's events sent to its channels (signed webhooks, Slack-compatible
webhooks, email), and one-time decision links in those messages.

A message is a `Notification` row written in the transaction of the change it tells of, so a change that
commits is told and one that rolls back is not. After commit the runtime's background workers send it
(threads of the server embedded, a Celery task distributed); `deliveries_send`, also a periodic job, sends
whatever is due, so a kick lost with its process only delays a message. Each send first claims the row by a
conditional update with a lease, so two workers never send one message at once; a failure is retried with
backoff, and the row keeps the attempts and the last error (the queue's delivery log). Nothing here runs in a
request: a slow receiver holds a background thread, never a call.

Webhook bodies are signed: `X-Toolkeeper-Signature: v1=<hex HMAC-SHA256 of "<timestamp>.<body>">` under the
channel's secret, with the timestamp in `X-Toolkeeper-Timestamp`, so a receiver refuses a changed body and an
old one replayed. Every URL goes through the outbound guard (`common.outbound`), when it is saved and
when each connection is made. Messages carry no call arguments: they name the tool, the agent and the reason,
and link to the inbox, where a logged-in reviewer sees the rest. Those names are values, never markup: each
medium escapes them its own way (`_message` and the `_*_part` renderers below).
"""
import hashlib
import hmac
import json
import logging
import secrets
import time
import unicodedata
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlencode, urlsplit

import anyio
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.html import conditional_escape, format_html, format_html_join
from django.utils.safestring import SafeString

from approvals.channel_kinds import ChannelKind, channel_kind, channel_kind_names
from approvals.models import (
    ApprovalRequest,
    DecisionLink,
    DeliveryStatus,
    Notification,
    NotificationChannel,
    NotifyEvent,
    Queue,
    RequestKind,
    RequestStatus,
    ReviewerNotifySetting,
)
from audit.services import audit_record
from common.errors import ServiceError
from common.outbound import OutboundRefused, async_http_client, check_url
from tenancy.models import Role
from tools.calls.runtime import runtime
from tools.models import ToolCall

logger = logging.getLogger("toolkeeper.notifications")

DELIVER_JOB = "approvals.notify"
DIGEST_JOB = "approvals.expiry_digest"
BACKOFF_S = (10, 60, 300, 1800)  # the wait after each failed attempt; after the last, the message has failed
SEND_TIMEOUT_S = 10.0  # each step of a send (connect, write, read)
SEND_DEADLINE_S = 20.0  # a whole send
LEASE_S = 60  # a message claimed this long ago by a sender that vanished is sent again (> SEND_DEADLINE_S)
SEND_BATCH = 100
EXPIRING_WITHIN = timedelta(minutes=15)  # the digest lists pending requests that expire within this
LINK_MAX_AGE_S = 7 * 24 * 3600  # a decision link of a request without an expiry still ends
LINK_SALT = "toolkeeper.decision-link"
CHANNEL_EVENTS = [event for event in NotifyEvent.values if event != NotifyEvent.TEST]
OPERATOR_EVENTS = (NotifyEvent.DEFINITION,)
MIN_SECRET_CHARS = 16
SLACK_KIND = "slack"
SLACK_SECRET = "slack_signing_secret"  # noqa: S105 (the key in a channel's encrypted target)
SLACK_ACTIONS = {"approve": "toolkeeper_approve", "reject": "toolkeeper_reject", "view": "toolkeeper_view"}


# --- settings ----------------------------------------------------------------------------------

def _check_channel(values: dict, *, creating: bool, url, secret) -> dict:
    errors = {}
    kind = channel_kind(values.get("kind") or "")
    if kind is None:
        errors["kind"] = [f"one of {', '.join(channel_kind_names())}"]
    events = values.get("events")
    if not isinstance(events, list) or not events or not all(e in CHANNEL_EVENTS for e in events):
        errors["events"] = [f"a list of one or more of {', '.join(CHANNEL_EVENTS)}"]
    if (values.get("quiet_from") is None) != (values.get("quiet_until") is None):
        errors["quiet_until"] = ["quiet hours need both a start and an end"]
    target = {}
    if kind is not None and not kind.to_reviewers:
        if url:
            try:
                check_url(url)
            except OutboundRefused as exc:
                errors["url"] = [str(exc)]
            target["url"] = url
        elif creating:
            errors["url"] = ["a webhook needs a URL"]
        if secret:
            if len(secret) < MIN_SECRET_CHARS:
                errors["signing_secret"] = [f"at least {MIN_SECRET_CHARS} characters"]
            target["secret"] = secret
        elif creating and kind.signed:
            errors["signing_secret"] = [f"a {kind.name} channel signs its messages: give it a secret"]
    elif kind is not None and (url or secret):
        errors["url"] = [f"{kind.label} takes no URL or secret"]
    if errors:
        raise ServiceError(errors)
    return target


@transaction.atomic
def channel_save(*, queue: Queue, channel: NotificationChannel | None = None, actor=None, url: str = "",
                 signing_secret: str = "", slack_signing_secret: str = "", **values) -> NotificationChannel:
    """Create a queue's channel, or change one. The URL and the secrets are write-only: empty keeps them.
    `slack_signing_secret` (a Slack channel only) makes its messages interactive (approvals.slack)."""
    creating = channel is None
    fields = ("name", "kind", "events", "quiet_from", "quiet_until", "action_links", "enabled")
    current = {} if creating else {name: getattr(channel, name) for name in fields}
    merged = current | values
    kind = channel_kind(merged.get("kind") or "")
    if not creating and merged["kind"] != channel.kind and not url and kind is not None and not kind.to_reviewers:
        raise ServiceError({"url": ["a channel that becomes a webhook needs its URL again"]})
    target = _check_channel(merged, creating=creating or merged["kind"] != channel.kind, url=url,
                            secret=signing_secret)
    if slack_signing_secret and merged.get("kind") != SLACK_KIND:
        raise ServiceError({"slack_signing_secret": ["only a Slack channel takes a Slack signing secret"]})
    if slack_signing_secret and len(slack_signing_secret) < MIN_SECRET_CHARS:
        raise ServiceError({"slack_signing_secret": [f"at least {MIN_SECRET_CHARS} characters"]})
    if creating:
        channel = NotificationChannel(tenant_id=queue.tenant_id, queue=queue)
    for name, value in merged.items():
        setattr(channel, name, value)
    if kind.to_reviewers:
        channel.target, channel.host = None, ""
    elif target:
        channel.target = (channel.target or {}) | target if merged["kind"] == current.get("kind") else target
        if "url" in target:
            channel.host = _host_of(target["url"])
    if slack_signing_secret:
        channel.target = (channel.target or {}) | {SLACK_SECRET: slack_signing_secret}
    if merged["kind"] == SLACK_KIND and channel.public_id is None:
        channel.public_id = uuid.uuid4()
    try:
        with transaction.atomic():
            channel.save()
    except IntegrityError:
        raise ServiceError({"name": ["this queue has a channel of that name"]}) from None
    audit_record(tenant=queue.tenant, actor=actor, verb="notify.channel_saved", target=f"channel:{channel.pk}",
                 data={"queue": queue.name, "name": channel.name, "kind": channel.kind, "events": channel.events,
                       "url_changed": bool(url), "secret_changed": bool(signing_secret),
                       "slack_secret_changed": bool(slack_signing_secret)})
    return channel


def _host_of(url: str) -> str:
    return urlsplit(url).hostname or ""


@transaction.atomic
def channel_delete(*, channel: NotificationChannel, actor=None) -> None:
    audit_record(tenant=channel.queue.tenant, actor=actor, verb="notify.channel_deleted",
                 target=f"channel:{channel.pk}", data={"name": channel.name})
    channel.delete()


@transaction.atomic
def reviewer_setting_save(*, tenant, user, muted: bool, excluded=()) -> ReviewerNotifySetting:
    """A reviewer's own choice. `excluded`: channels of this tenant they want nothing from."""
    excluded = list(excluded)
    if any(channel.tenant_id != tenant.pk for channel in excluded):
        raise ServiceError({"excluded": ["no such channel"]})
    setting, _ = ReviewerNotifySetting.objects.for_tenant(tenant).get_or_create(tenant=tenant, user=user)
    setting.muted = muted
    setting.save(update_fields=["muted"])
    setting.excluded.set(excluded)
    return setting


# --- what is sent, and to whom -----------------------------------------------------------------

def _absolute(path: str) -> str:
    return settings.TOOLKEEPER_PUBLIC_URL.rstrip("/") + path


def _request_data(request: ApprovalRequest) -> dict:
    slug = request.tenant.slug
    return {
        "id": request.pk, "kind": request.kind, "status": request.status, "tool": request.tool_name,
        "agent": request.agent, "reason": request.reason, "call": str(request.call_id),
        "queue": request.queue.name if request.queue else None,
        "opened_at": request.opened_at.isoformat() if request.opened_at else None,
        "expires_at": request.expires_at.isoformat() if request.expires_at else None,
        "url": _absolute(reverse("inbox:inbox_request", kwargs={"tenant": slug, "request_id": request.pk})),
    }


def _reviewers(queue: Queue, *, escalation: bool) -> list:
    """Who reviews the queue's requests (its named reviewers, else every reviewing member); on escalation, its
    escalation reviewers (if it names any)."""
    users = get_user_model().objects.filter(memberships__tenant_id=queue.tenant_id,
                                            memberships__role__in=[Role.ADMIN, Role.OPERATOR, Role.REVIEWER])
    named = queue.escalation_reviewers.all() if escalation else queue.reviewers.all()
    if escalation and not named.exists():
        named = queue.reviewers.all()
    if named.exists():
        users = users.filter(pk__in=named.values("pk"))
    return list(users.exclude(email="").order_by("pk").distinct())


def _operators(tenant_id) -> list:
    """Who can accept a tool's changed definition: the tenant's admins and operators."""
    return list(get_user_model().objects.filter(memberships__tenant_id=tenant_id,
                                                memberships__role__in=[Role.ADMIN, Role.OPERATOR])
                .exclude(email="").order_by("pk").distinct())


def _recipients(channel: NotificationChannel, *, escalation: bool, event: str = "") -> list:
    """(user, address) pairs of an email channel, without those who muted it or muted everything. News for
    operators goes to them, not to the queue's reviewers."""
    quiet = ReviewerNotifySetting.objects.for_tenant(channel.tenant_id).filter(
        Q(muted=True) | Q(excluded=channel)).values_list("user_id", flat=True)
    silent = set(quiet)
    users = (_operators(channel.tenant_id) if event in OPERATOR_EVENTS
             else _reviewers(channel.queue, escalation=escalation))
    return [(user, user.email) for user in users if user.pk not in silent]


def _links(request: ApprovalRequest, user) -> dict:
    """Approve and reject links (ids: their tokens are made when the message is sent)."""
    if request.kind != RequestKind.APPROVAL or request.status != RequestStatus.PENDING:
        return {}
    return {decision: DecisionLink.objects.create(tenant_id=request.tenant_id, request=request, decision=decision,
                                                  user=user).pk
            for decision in ("approve", "reject")}


def _write(channel: NotificationChannel, *, event: str, key: str, body: dict, request=None, escalation=False,
           now=None) -> int:
    now = now or timezone.now()
    kind = channel_kind(channel.kind)
    to_reviewers = kind is not None and kind.to_reviewers
    targets = _recipients(channel, escalation=escalation, event=event) if to_reviewers else [(None, "")]
    rows = []
    for user, address in targets:
        payload = dict(body)
        if request is not None and channel.action_links and event in (NotifyEvent.REQUESTED, NotifyEvent.ESCALATED):
            payload["link_ids"] = _links(request, user)
        rows.append(Notification(tenant_id=channel.tenant_id, channel=channel, key=key, recipient=address,
                                 request=request, event=event, payload=payload, next_attempt_at=now))
    # one statement; a message this key already wrote is left as it is (the unique key)
    Notification.objects.for_tenant(channel.tenant_id).bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def _kick(written: int) -> None:
    if written:
        transaction.on_commit(lambda: runtime().run_soon(DELIVER_JOB), robust=True)


def notify_request(request: ApprovalRequest, change: str) -> int:
    """In the transaction of a request's change (`opened`, `escalated` or its new status): the messages of the
    queue's channels that take it."""
    if request.queue_id is None:
        return 0
    if change == "opened":
        event = NotifyEvent.EXTERNAL if request.kind == RequestKind.EXTERNAL else NotifyEvent.REQUESTED
    elif change == "escalated":
        event = NotifyEvent.ESCALATED
    elif change in (RequestStatus.APPROVED, RequestStatus.REJECTED, RequestStatus.RESPONDED,
                    RequestStatus.EXPIRED, RequestStatus.CANCELLED):
        event = NotifyEvent.DECIDED
    else:
        return 0
    channels = NotificationChannel.objects.for_tenant(request.tenant_id).filter(queue_id=request.queue_id,
                                                                                 enabled=True)
    body = {"event": event, "tenant": request.tenant.slug, "request": _request_data(request)}
    written = 0
    for channel in channels:
        if event in channel.events:
            written += _write(channel, event=event, key=f"{event}:{request.pk}", body=body, request=request,
                              escalation=event == NotifyEvent.ESCALATED)
    _kick(written)
    return written


def notify_external_task(call: ToolCall) -> int:
    """In the transaction that leaves an external tool's call waiting: the tenant's default queue's channels
    that take external tasks (such tasks have no queue of their own; the default queue times them out too)."""
    queue = Queue.objects.for_tenant(call.tenant_id).filter(is_default=True).first()
    if queue is None:
        return 0
    slug = call.tenant.slug
    body = {"event": NotifyEvent.EXTERNAL, "tenant": slug, "task": {
        "call": str(call.pk), "tool": call.tool_name, "agent": call.session.agent if call.session_id else "",
        "url": _absolute(reverse("inbox:inbox_external", kwargs={"tenant": slug})),
    }}
    written = 0
    for channel in NotificationChannel.objects.for_tenant(call.tenant_id).filter(queue=queue, enabled=True):
        if NotifyEvent.EXTERNAL in channel.events:
            written += _write(channel, event=NotifyEvent.EXTERNAL, key=f"external:{call.pk}", body=body)
    _kick(written)
    return written


def notify_definition_proposed(sender=None, *, tool, server, new: bool, **kwargs) -> int:
    """In the sync's transaction that withholds a tool for review (tools.upstream.definitions): the messages of
    every channel of the tenant that takes `definition` events, once per proposal."""
    slug = server.tenant.slug
    body = {"event": NotifyEvent.DEFINITION, "tenant": slug, "definition": {
        "tool": tool.name, "server": server.name, "new": new, "hash": tool.proposed_hash,
        "url": _absolute(reverse("console:mcp_server_detail", kwargs={"tenant": slug, "server_id": server.pk})),
    }}
    written = 0
    for channel in NotificationChannel.objects.for_tenant(server.tenant_id).filter(enabled=True):
        if NotifyEvent.DEFINITION in channel.events:
            written += _write(channel, event=NotifyEvent.DEFINITION,
                              key=f"definition:{tool.pk}:{tool.proposed_hash[:16]}", body=body)
    _kick(written)
    return written


@transaction.atomic
def channel_test(*, channel: NotificationChannel, actor) -> Notification:
    """A test message, sent like any other (and logged). An email channel's test goes to the one who asked."""
    address = ""
    kind = channel_kind(channel.kind)
    if kind is not None and kind.to_reviewers:
        address = getattr(actor, "email", "") or ""
        if not address:
            raise ServiceError({"channel": ["a test email goes to you: your account has no email address"]})
    notification = Notification.objects.create(
        tenant_id=channel.tenant_id, channel=channel, event=NotifyEvent.TEST, key=f"test:{secrets.token_hex(8)}",
        recipient=address, next_attempt_at=timezone.now(),
        payload={"event": NotifyEvent.TEST, "tenant": channel.queue.tenant.slug, "queue": channel.queue.name,
                 "channel": channel.name})
    audit_record(tenant=channel.queue.tenant, actor=actor, verb="notify.test", target=f"channel:{channel.pk}")
    _kick(1)
    return notification


def expiry_digest(*, now=None) -> int:
    """The periodic job: per queue, one message listing its pending requests that expire soon, each listed once."""
    now = now or timezone.now()
    soon = ApprovalRequest.all_tenants.filter(status=RequestStatus.PENDING, expiry_noticed_at__isnull=True,
                                              expires_at__isnull=False, expires_at__lte=now + EXPIRING_WITHIN,
                                              expires_at__gt=now).select_related("tenant", "queue")
    by_queue: dict = {}
    for request in soon.order_by("expires_at")[:SEND_BATCH * 5]:
        if request.queue_id is not None:
            by_queue.setdefault(request.queue_id, []).append(request)
    written = 0
    for requests in by_queue.values():
        with transaction.atomic():
            # each request's own conditional update decides which run lists it, if two runs overlap
            requests = [r for r in requests if ApprovalRequest.objects.for_tenant(r.tenant_id).filter(
                pk=r.pk, expiry_noticed_at__isnull=True).update(expiry_noticed_at=now)]
            if not requests:
                continue
            marked = [r.pk for r in requests]
            queue = requests[0].queue
            body = {"event": NotifyEvent.EXPIRING, "tenant": queue.tenant.slug, "queue": queue.name,
                    "requests": [_request_data(r) for r in requests]}
            key = f"expiring:{now.isoformat()}:{min(marked)}"
            count = 0
            for channel in NotificationChannel.objects.for_tenant(queue.tenant_id).filter(queue=queue, enabled=True):
                if NotifyEvent.EXPIRING in channel.events:
                    count += _write(channel, event=NotifyEvent.EXPIRING, key=key, body=body, now=now)
            _kick(count)
            written += count
    return written


# --- sending -----------------------------------------------------------------------------------

def in_quiet_hours(channel: NotificationChannel, at: datetime) -> datetime | None:
    """When the quiet hours that hold `at` end, or None outside them (server time; a window may span midnight)."""
    start, end = channel.quiet_from, channel.quiet_until
    if start is None or end is None or start == end:
        return None
    local = timezone.localtime(at)
    clock = local.time()
    inside = start <= clock < end if start < end else clock >= start or clock < end
    if not inside:
        return None
    ends = local.replace(hour=end.hour, minute=end.minute, second=end.second, microsecond=0)
    if ends <= local:
        ends += timedelta(days=1)
    return ends


def deliveries_send(*, now=None, limit: int = SEND_BATCH) -> int:
    """The background and periodic job: send what is due. Returns how many were sent."""
    now = now or timezone.now()
    due = Notification.all_tenants.filter(
        Q(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
        | Q(status=DeliveryStatus.SENDING, lease_until__lt=now)).order_by("next_attempt_at")
    sent = 0
    for pk in list(due.values_list("pk", flat=True)[:limit]):
        sent += delivery_send(pk=pk, now=now)
    return sent


def _claim(pk: int, now: datetime) -> Notification | None:
    notification = (Notification.all_tenants.select_related("channel", "channel__queue", "request", "tenant")
                    .filter(pk=pk).first())
    if notification is None:
        return None
    claimable = Q(status=DeliveryStatus.PENDING, next_attempt_at__lte=now) | Q(status=DeliveryStatus.SENDING,
                                                                                lease_until__lt=now)
    if not notification.channel.enabled:  # switched off (a wrong or leaked URL): what it had not sent stays unsent
        Notification.all_tenants.filter(claimable, pk=pk).update(
            status=DeliveryStatus.FAILED, lease_until=None, last_error="not sent: the channel was disabled")
        return None
    quiet_end = in_quiet_hours(notification.channel, now) if notification.event != NotifyEvent.TEST else None
    if quiet_end is not None:  # held until the quiet hours end, without counting an attempt
        Notification.all_tenants.filter(claimable, pk=pk).update(status=DeliveryStatus.PENDING,
                                                                 next_attempt_at=quiet_end, lease_until=None)
        return None
    attempts = notification.attempts + 1
    if not Notification.all_tenants.filter(claimable, pk=pk, attempts=notification.attempts).update(
            status=DeliveryStatus.SENDING, lease_until=now + timedelta(seconds=LEASE_S), attempts=attempts):
        return None
    notification.attempts = attempts
    return notification


def delivery_send(*, pk: int, now=None) -> bool:
    """Claim one message and send it once; record the outcome. True when it was sent. The lease and the backoff
    count from the claim's own moment, never from a batch's start that earlier sends have left behind."""
    now = max(now, timezone.now()) if now else timezone.now()
    notification = _claim(pk, now)
    if notification is None:
        return False
    try:
        _send(notification)
    except Exception as exc:  # any failure of the receiver or of the way there is retried
        error = _error_text(exc)
        done = notification.attempts > len(BACKOFF_S)
        Notification.all_tenants.filter(pk=pk, attempts=notification.attempts).update(
            status=DeliveryStatus.FAILED if done else DeliveryStatus.PENDING, last_error=error, lease_until=None,
            next_attempt_at=now if done else now + timedelta(seconds=BACKOFF_S[notification.attempts - 1]))
        logger.info("notification %s failed (attempt %s): %s", pk, notification.attempts, error)
        return False
    Notification.all_tenants.filter(pk=pk, attempts=notification.attempts).update(
        status=DeliveryStatus.SENT, sent_at=timezone.now(), last_error="", lease_until=None)
    return True


def _error_text(exc: Exception) -> str:
    if isinstance(exc, (DeliveryRefused, OutboundRefused)):
        return str(exc)[:500]
    if isinstance(exc, TimeoutError):
        return f"no answer within {SEND_DEADLINE_S:g} s"
    return f"{type(exc).__name__}: {str(exc)[:300]}"


class DeliveryRefused(Exception):
    """The receiver answered, but not with a 2xx."""


def signature(secret: str, timestamp: int, body: bytes) -> str:
    return "v1=" + hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def link_token(link_id: int) -> str:
    """A decision link's token: its id, signed (SECRET_KEY, salted) with the time it was made. A resend makes a
    token of the same link again, so what an earlier attempt delivered still works."""
    return signing.TimestampSigner(salt=LINK_SALT).sign(str(link_id))


def _payload_with_links(notification: Notification) -> dict:
    payload = dict(notification.payload)
    link_ids = payload.pop("link_ids", None) or {}
    links = {}
    path = reverse("inbox:inbox_act", kwargs={"tenant": notification.tenant.slug})
    for decision in ("approve", "reject"):  # in this order: a JSON column may have sorted the keys
        if link_ids.get(decision) is not None:
            links[decision] = _absolute(f"{path}?{urlencode({'token': link_token(link_ids[decision])})}")
    if links:
        payload["links"] = links
    return payload


def _send(notification: Notification) -> None:
    kind = channel_kind(notification.channel.kind)
    if kind is None:
        raise DeliveryRefused(f"no channel kind {notification.channel.kind!r} is installed")
    payload = _payload_with_links(notification)
    payload["delivery"] = notification.pk
    kind.send(notification, payload)


def send_email(notification: Notification, payload: dict) -> None:
    subject, text, html = _email(payload)
    send_mail(subject, text, settings.DEFAULT_FROM_EMAIL, [notification.recipient], html_message=html)


def send_webhook(notification: Notification, payload: dict) -> None:
    """The payload as it is, signed."""
    _post_json(notification, payload)


def send_slack(notification: Notification, payload: dict) -> None:
    """Slack's incoming-webhook shape (signed too, when the channel has a secret); with Approve, Reject and View
    input buttons when the channel has a Slack signing secret (approvals.slack)."""
    _post_json(notification, _slack(payload, interactive=slack_interactive(notification.channel)))


def slack_interactive(channel: NotificationChannel) -> bool:
    return channel.kind == SLACK_KIND and bool((channel.target or {}).get(SLACK_SECRET))


def _post_json(notification: Notification, body_data: dict) -> None:
    target = notification.channel.target or {}
    body = json.dumps(body_data, separators=(",", ":"), ensure_ascii=False).encode()
    timestamp = int(time.time())
    headers = {"Content-Type": "application/json", "User-Agent": "Toolkeeper-Notify/1",
               "X-Toolkeeper-Event": notification.event, "X-Toolkeeper-Delivery": str(notification.pk),
               "X-Toolkeeper-Timestamp": str(timestamp)}
    if target.get("secret"):
        headers["X-Toolkeeper-Signature"] = signature(target["secret"], timestamp, body)
    status = anyio.run(_post, target["url"], body, headers)
    if not 200 <= status < 300:
        raise DeliveryRefused(f"the receiver answered HTTP {status}")


async def _post(url: str, body: bytes, headers: dict) -> int:
    """The receiver's status, within SEND_DEADLINE_S in all (a receiver that trickles its answer byte by byte
    would outlast any per-read timeout, and the lease); the body of the answer is not read."""
    with anyio.fail_after(SEND_DEADLINE_S):
        async with (async_http_client(timeout=SEND_TIMEOUT_S) as client,
                    client.stream("POST", url, content=body, headers=headers) as response):
            return response.status_code


# --- what a message says, in each medium ------------------------------------------------------
# A message is built once as lines of parts: our own words (str), values (`Shown`: text a tenant, an app or a
# model controls: tool, agent, reason, queue and channel names) and links we made (`Linked`). Each medium then
# renders the parts its own way, so a value is never read as markup (docs/notes/governance.md, Notifications).

@dataclass(frozen=True)
class Shown:
    """A value shown to people: never markup, never more than one line."""

    text: str


@dataclass(frozen=True)
class Linked:
    """A link we made (the inbox, a decision link): it stays a link."""

    url: str


def one_line(text) -> str:
    """A value on one line: control characters and line breaks become spaces (a value cannot start a line of its
    own, in a body or in a mail header), invisible format characters (bidirectional overrides, zero-width
    characters) are dropped, and runs of white space become one space."""
    kept = []
    for char in str(text):
        category = unicodedata.category(char)
        if category == "Cf":
            continue
        kept.append(" " if category in ("Cc", "Zl", "Zp") else char)
    return " ".join("".join(kept).split())


def _value_or(value, fallback: str):
    """A value, or our own word for its absence."""
    return Shown(value) if value and one_line(value) else fallback


def _message(payload: dict) -> tuple[list, list[list]]:
    """The subject and the lines of a message, as parts."""
    event = payload["event"]
    if event == NotifyEvent.TEST:
        queue = Shown(payload["queue"])
        return (["Test notification from queue ", queue],
                [["This is a test of channel ", Shown(payload["channel"]), " of queue ", queue, "."]])
    if event == NotifyEvent.EXPIRING:
        queue = Shown(payload["queue"])
        lines = [[f"{len(payload['requests'])} request(s) in queue ", queue, " expire soon:"]]
        lines += [["- ", Shown(r["tool"]), " by ", _value_or(r["agent"], "an agent"), f", expires {r['expires_at']}: ",
                   Linked(r["url"])] for r in payload["requests"]]
        return ["Requests expiring soon in ", queue], lines
    if event == NotifyEvent.DEFINITION:
        change = payload["definition"]
        what = "New tool waiting for review" if change["new"] else "Tool definition changed"
        return ([f"{what}: ", Shown(change["tool"])],
                [["MCP server ", Shown(change["server"]), " offers ", Shown(change["tool"]),
                  " with a definition no operator has accepted. The tool is withheld from every agent until one "
                  "reviews the change and accepts it."], [Linked(change["url"])]])
    if event == NotifyEvent.EXTERNAL:
        task = payload["task"]
        return (["External task waiting: ", Shown(task["tool"])],
                [[Shown(task["tool"]), " (called by ", _value_or(task["agent"], "an agent"), ") waits for a result."],
                 [Linked(task["url"])]])
    request = payload["request"]
    heading = {NotifyEvent.REQUESTED: "Approval requested", NotifyEvent.ESCALATED: "Approval escalated",
               NotifyEvent.DECIDED: f"Request {request['status']}"}[event]
    lines = [[f"{heading}: ", Shown(request["tool"]), " called by ", _value_or(request["agent"], "an agent"),
              " (queue ", _value_or(request["queue"], "none"), ")."]]
    if request["reason"] and one_line(request["reason"]):
        lines.append(["Reason: ", Shown(request["reason"])])
    lines.append(["Open it in the inbox: ", Linked(request["url"])])
    for decision, url in payload.get("links", {}).items():
        lines.append([f"{decision.capitalize()} (one use, login required): ", Linked(url)])
    return [f"{heading}: ", Shown(request["tool"])], lines


def _text_part(part) -> str:
    """Plain text (an e-mail's text part and its subject): a value on one line, a link as its URL."""
    if isinstance(part, Shown):
        return one_line(part.text)
    return part.url if isinstance(part, Linked) else part


def _html_part(part) -> SafeString:
    """HTML (an e-mail's HTML part): everything escaped; a value in <code>, a link we made an <a>."""
    if isinstance(part, Shown):
        return format_html("<code>{}</code>", one_line(part.text))
    if isinstance(part, Linked):
        return format_html('<a href="{}">{}</a>', part.url, part.url)
    return conditional_escape(part)


SLACK_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
LOOKALIKE_BACKTICK = "\u02cb"  # ˋ, MODIFIER LETTER GRAVE ACCENT


def slack_escape(text: str) -> str:
    """Slack's three control characters: with them escaped, no text opens a link (`<url|label>`) or a mention
    (`<!channel>`, `<!here>`, `<@U…>`)."""
    return text.translate(SLACK_ESCAPES)


def _slack_part(part) -> str:
    """Slack `mrkdwn`. A value goes in inline code, where Slack applies no formatting (`*`, `_`, `~`) and sees
    no mention; a backtick in it, which would end the code, becomes the look-alike `ˋ`. A link we made is
    `<url>`."""
    if isinstance(part, Shown):
        return "`" + slack_escape(one_line(part.text)).replace("`", LOOKALIKE_BACKTICK) + "`"
    if isinstance(part, Linked):
        return f"<{slack_escape(part.url)}>"
    return slack_escape(part)


def _as_text(parts: list) -> str:
    return "".join(_text_part(part) for part in parts)


def _as_html(parts: list) -> SafeString:
    return format_html_join("", "{}", ((_html_part(part),) for part in parts))


def _as_slack(parts: list) -> str:
    return "".join(_slack_part(part) for part in parts)


def _email(payload: dict) -> tuple[str, str, str]:
    """An e-mail's subject (one line: a value cannot add a header), text part and HTML part."""
    subject, lines = _message(payload)
    subject_text = "[Toolkeeper] " + _as_text(subject)
    html = render_to_string("notifications/email.html", {
        "subject": subject_text, "lines": [_as_html(line) for line in lines]})
    return subject_text, "\n".join(_as_text(line) for line in lines) + "\n", html


def _slack(payload: dict, *, interactive: bool = False, note: str = "") -> dict:
    """Slack's incoming-webhook shape: `text` (the fallback) and blocks, decision links as buttons. Interactive:
    a pending request's Approve, Reject and View input buttons, whose values are the request's id. `note`: a
    line of our own words (already mrkdwn) at the end."""
    subject, lines = _message(payload)
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(
        [f"*{_as_slack(subject)}*", *(_as_slack(line) for line in lines), *([note] if note else [])])}}]
    request = payload.get("request") or {}
    if interactive and request.get("status") == RequestStatus.PENDING and request.get("kind") == RequestKind.APPROVAL:
        buttons = [{"type": "button", "text": {"type": "plain_text", "text": label}, "action_id": SLACK_ACTIONS[name],
                    "value": str(request["id"]), **({"style": style} if style else {})}
                   for name, label, style in (("approve", "Approve", "primary"), ("reject", "Reject", "danger"),
                                              ("view", "View input", ""))]
    else:
        buttons = [{"type": "button", "text": {"type": "plain_text", "text": decision.capitalize()}, "url": url}
                   for decision, url in payload.get("links", {}).items()]
    if buttons:
        blocks.append({"type": "actions", "elements": buttons})
    return {"text": _as_slack(subject), "blocks": blocks}


def slack_request_message(request: ApprovalRequest, *, note: str = "", interactive: bool = True) -> dict:
    """A request's Slack message as it stands now (for `replace_original` after a vote): its status heading, and
    while it is pending, the buttons again."""
    event = NotifyEvent.REQUESTED if request.status == RequestStatus.PENDING else NotifyEvent.DECIDED
    return _slack({"event": event, "tenant": request.tenant.slug, "request": _request_data(request)},
                  interactive=interactive, note=note)


def public_url(path: str) -> str:
    """An absolute URL of the console (TOOLKEEPER_PUBLIC_URL)."""
    return _absolute(path)


BUILT_IN_KINDS = (
    ChannelKind("webhook", "webhook (signed JSON)", send_webhook, signed=True),
    ChannelKind(SLACK_KIND, "Slack-compatible webhook", send_slack),
    ChannelKind("email", "email to the queue's reviewers", send_email, to_reviewers=True),
)
