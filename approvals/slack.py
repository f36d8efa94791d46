"""Decisions from Slack: a Slack channel's interactive messages (Approve, Reject, View input) and the Slack users
linked to members (docs/governance.md, "Deciding from Slack").

A Slack channel with a Slack signing secret sends its pending requests with three buttons whose values are the
request's id (nothing secret). Slack posts a click to `/integrations/slack/<channel public id>/` as
`application/x-www-form-urlencoded` `payload=<JSON>`; `interaction_handle` then:

1. bounds the body, checks `X-Slack-Signature` (`v0=` + HMAC-SHA256 under the channel's signing secret of
   `v0:<X-Slack-Request-Timestamp>:<raw body>`, compared in constant time) and refuses a timestamp more than
   five minutes off (401), and a signature already seen within that window (409: the database keeps them, so
   every process refuses a replay);
2. reads the payload as hostile input (any other shape is a 400) and refuses a `response_url` off Slack's hosts
   (`TOOLKEEPER_SLACK_RESPONSE_HOSTS`);
3. finds the member the Slack user (workspace and user id) is linked to. An unlinked user gets an ephemeral reply
   with a signed single-use link to the console, valid LINK_MAX_AGE_S, which links them once to the member who
   opens it (`link_use`). A linked user who is no longer a member, or whose role does not review, is refused;
4. decides through `approvals.services.request_decide`, as the console does: named reviewers, four-eyes, quorum,
   one vote each and expiry hold as there; a refusal (`decide_refusals`' reason, or the service's) is an
   ephemeral reply. The original message is then replaced with where the request stands. View input shows an
   eligible reviewer the input approving would run, as the inbox list shows it.

Replies go to the payload's `response_url` through the outbound guard (`common.outbound`) once the interaction is
answered (Slack wants its answer within three seconds, whatever the reply's way takes: `interaction_handle` only
gathers them, `replies_send` posts them); a reply that fails is logged, and what was decided stays decided.
"""
import hashlib
import hmac
import json
import logging
import re
import time
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import anyio
from django.conf import settings
from django.core import signing
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from approvals import selectors
from approvals.models import (
    ApprovalRequest,
    NotificationChannel,
    RequestKind,
    RequestStatus,
    SlackIdentity,
    SlackLink,
    SlackSeenRequest,
    VoteDecision,
)
from approvals.notifications import (
    SLACK_ACTIONS,
    SLACK_SECRET,
    one_line,
    public_url,
    slack_escape,
    slack_interactive,
    slack_request_message,
)
from approvals.services import decide_refusals, request_decide, reviewer_may_decide
from audit.services import audit_record
from common.errors import Conflict, NotPermitted, RateLimited, ServiceError
from common.outbound import async_http_client
from tenancy.entry.admission import Entry, admit
from tenancy.models import Membership

logger = logging.getLogger("toolkeeper.slack")

WINDOW_S = 5 * 60  # a request's timestamp may be this far from now; its signature is remembered this long
MAX_BODY_BYTES = 64 * 1024
LINK_MAX_AGE_S = 15 * 60
LINK_SALT = "toolkeeper.slack-link"
REPLY_TIMEOUT_S = 3.0
REJECT_MESSAGE = "rejected from Slack"
DECIDE_MESSAGE = "decided from Slack"
SLACK_ID = re.compile(r"[A-Za-z0-9_]{1,32}")
ACTIONS = {action_id: name for name, action_id in SLACK_ACTIONS.items()}
VERSION = "v0"


class SlackRefused(Exception):
    """An interaction refused before anything is done; `status` is the HTTP answer, the message safe to show."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Interaction:
    team_id: str
    user_id: str
    action: str  # approve | reject | view
    request_id: int
    response_url: str
    replies: list = field(default_factory=list, compare=False)  # the JSON bodies for response_url, in order


# --- verifying --------------------------------------------------------------------------------------------------

def signature_of(secret: str, timestamp: str, body: bytes) -> str:
    """Slack's request signature: `v0=` + hex HMAC-SHA256 of `v0:<timestamp>:<body>`."""
    base = f"{VERSION}:{timestamp}:".encode() + body
    return f"{VERSION}=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def interaction_channel(public_id) -> NotificationChannel:
    """The interactive Slack channel a public id names (404 otherwise: a wrong id and a plain channel alike)."""
    channel = (NotificationChannel.all_tenants.select_related("tenant", "queue")
               .filter(public_id=public_id, enabled=True).first())
    if channel is None or not slack_interactive(channel):
        raise SlackRefused(404, "no such Slack channel")
    return channel


def request_verify(*, channel: NotificationChannel, timestamp: str, signature: str, body: bytes, now=None) -> None:
    """Refuse a request Slack did not sign for this channel, an old or future one, and a replay (see the module)."""
    if len(body) > MAX_BODY_BYTES:
        raise SlackRefused(413, "the request body is larger than the limit")
    now = now if now is not None else time.time()
    if not (timestamp.isascii() and timestamp.isdigit()) or len(timestamp) > 12:
        raise SlackRefused(401, "missing or malformed X-Slack-Request-Timestamp")
    if abs(now - int(timestamp)) > WINDOW_S:
        raise SlackRefused(401, "the request's timestamp is more than five minutes off")
    expected = signature_of(channel.target[SLACK_SECRET], timestamp, body)
    if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace")):
        raise SlackRefused(401, "the request's signature does not verify")
    seen = hashlib.sha256(signature.encode()).hexdigest()
    at = timezone.now()
    rows = SlackSeenRequest.objects.for_tenant(channel.tenant_id)
    try:
        with transaction.atomic():
            rows.filter(channel=channel, seen_at__lt=at - timedelta(seconds=2 * WINDOW_S)).delete()
            rows.create(tenant_id=channel.tenant_id, channel=channel, signature=seen, seen_at=at)
    except IntegrityError:
        raise SlackRefused(409, "this request was received already (a replay)") from None


def interaction_parse(body: bytes) -> Interaction:
    """The one action a block_actions payload carries; anything else is a 400."""
    try:
        form = parse_qs(body.decode("utf-8"), strict_parsing=True, max_num_fields=5)
        [text] = form["payload"]
        payload = json.loads(text, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, KeyError, RecursionError):
        raise SlackRefused(400, "the body is not a Slack interaction payload") from None
    if not isinstance(payload, dict) or payload.get("type") != "block_actions":
        raise SlackRefused(400, "only block_actions interactions are taken")
    user, team, actions = payload.get("user"), payload.get("team"), payload.get("actions")
    user_id = user.get("id") if isinstance(user, dict) else None
    team_id = team.get("id") if isinstance(team, dict) else (user.get("team_id") if isinstance(user, dict) else None)
    if not (isinstance(user_id, str) and SLACK_ID.fullmatch(user_id)
            and isinstance(team_id, str) and SLACK_ID.fullmatch(team_id)):
        raise SlackRefused(400, "the payload names no Slack user and workspace")
    if not isinstance(actions, list) or len(actions) != 1 or not isinstance(actions[0], dict):
        raise SlackRefused(400, "the payload carries no single action")
    action, value = ACTIONS.get(actions[0].get("action_id")), actions[0].get("value")
    if action is None or not isinstance(value, str) or not value.isascii() or not value.isdigit() or len(value) > 18:
        raise SlackRefused(400, "the action is not one of Toolkeeper's buttons")
    response_url = payload.get("response_url")
    if not isinstance(response_url, str) or not _slack_host(response_url):
        raise SlackRefused(400, "the payload's response_url is not on Slack's hosts")
    return Interaction(team_id=team_id, user_id=user_id, action=action, request_id=int(value),
                       response_url=response_url)


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _slack_host(url: str) -> bool:
    try:
        split = urlsplit(url)
        host = (split.hostname or "").lower()
    except ValueError:
        return False
    allowed = {h.lower() for h in settings.TOOLKEEPER_SLACK_RESPONSE_HOSTS}
    return split.scheme in ("http", "https") and host in allowed and len(url) <= 2000


# --- acting -----------------------------------------------------------------------------------------------------

def interaction_handle(*, public_id, timestamp: str, signature: str, body: bytes) -> Interaction:
    """Verify and act on one click (see the module). Raises SlackRefused before acting; otherwise the interaction,
    with the replies for `replies_send` to post once Slack has its answer."""
    channel = interaction_channel(public_id)
    request_verify(channel=channel, timestamp=timestamp, signature=signature, body=body)
    interaction = interaction_parse(body)
    _act(channel, interaction)
    return interaction


def _act(channel: NotificationChannel, interaction: Interaction) -> None:
    tenant = channel.tenant
    identity = (SlackIdentity.objects.for_tenant(tenant).select_related("user")
                .filter(team_id=interaction.team_id, slack_user_id=interaction.user_id).first())
    if identity is None:
        _reply(interaction, _ephemeral(
            "Your Slack account is not linked to Toolkeeper yet, so this click decided nothing. "
            f"<{slack_escape(_link_url(channel, interaction))}|Link it> while signed in to the console as yourself "
            f"(one use, within {LINK_MAX_AGE_S // 60} minutes), then click again."))
        return
    user = identity.user
    membership = Membership.objects.filter(tenant=tenant, user=user).first()
    if membership is None or not user.is_active or not membership.can_review:
        _reply(interaction, _ephemeral("Refused: the account your Slack user is linked to does not review in "
                                       "this tenant."))
        return
    try:
        admit(entry=Entry.SLACK, user=user, tenant=tenant)
    except RateLimited as exc:
        _reply(interaction, _ephemeral(f"Refused: {slack_escape(exc.message)}"))
        return
    request = (ApprovalRequest.objects.for_tenant(tenant)
               .filter(pk=interaction.request_id, queue_id=channel.queue_id, kind=RequestKind.APPROVAL).first())
    if request is None:
        _reply(interaction, _ephemeral("Refused: no such request in this channel's queue."))
        return
    if interaction.action == "view":
        _reply(interaction, _view_input(request, user))
        return
    _decide(interaction, request, user)


def _decide(interaction: Interaction, request: ApprovalRequest, user) -> None:
    if request.status == RequestStatus.PENDING:
        row = selectors.request_rows(ApprovalRequest.objects.for_tenant(request.tenant_id).filter(pk=request.pk),
                                     tenant=request.tenant).get()
        refusal = decide_refusals(requests=[row], user=user).get(request.pk)
        if refusal is not None:
            _reply(interaction, _ephemeral(f"Refused: {slack_escape(refusal)}."))
            return
    decision = VoteDecision.APPROVE if interaction.action == "approve" else VoteDecision.REJECT
    message = REJECT_MESSAGE if decision == VoteDecision.REJECT else DECIDE_MESSAGE
    try:
        settled = request_decide(request=request, reviewer=user, decision=decision, message=message)
    except (NotPermitted, Conflict, ServiceError) as exc:
        _reply(interaction, _ephemeral(f"Refused: {slack_escape(exc.message)}."))
        request.refresh_from_db()
        if request.status != RequestStatus.PENDING:  # the message still shows buttons: show where it stands
            _reply(interaction, _replacing(request, ""))
        return
    _reply(interaction, _replacing(settled, _standing_note(settled, user, decision)))


def _standing_note(request: ApprovalRequest, user, decision: str) -> str:
    who = f"`{slack_escape(one_line(user.username))}`"
    if request.status != RequestStatus.PENDING:
        return f"{'Approved' if decision == VoteDecision.APPROVE else 'Rejected'} from Slack by {who}."
    counted = len(selectors.approvals_of(request, selectors.approved_edit(request)))
    required = request.queue.required_approvals if request.queue else 1
    return (f"Approved by {who}: {counted} of {required} approvals, still pending until more reviewers "
            "approve.")


def _view_input(request: ApprovalRequest, user) -> dict:
    if request.status != RequestStatus.PENDING:
        return _ephemeral(f"This request is {request.status}: its input is in the console.")
    if not reviewer_may_decide(request=request, user=user):
        return _ephemeral("Refused: you are not a reviewer of this request's queue.")
    row = selectors.with_shown_input(
        ApprovalRequest.objects.for_tenant(request.tenant_id).filter(pk=request.pk), tenant=request.tenant).get()
    shown = selectors.shown_input(row)
    if not shown.whole:
        text = "The input is too long for Slack; its start:\n" + _code_block(shown.line)
    else:
        text = ("The input approving would run" + (" (a reviewer's edit)" if shown.edited else "") + ":\n"
                + _code_block(shown.pretty or shown.line))
    return _ephemeral(text)


def _code_block(text: str) -> str:
    """A value in a mrkdwn code block: escaped, and unable to end the block early."""
    return "```" + slack_escape(text).replace("```", "`\u200b``") + "```"


def _ephemeral(text: str) -> dict:
    return {"response_type": "ephemeral", "replace_original": False, "text": text}


def _replacing(request: ApprovalRequest, note: str) -> dict:
    return {"replace_original": True, **slack_request_message(request, note=note)}


def _reply(interaction: Interaction, message: dict) -> None:
    interaction.replies.append(json.dumps(message, ensure_ascii=False).encode())


def replies_send(interaction: Interaction) -> int:
    """Post the interaction's replies to its response_url (Slack's hosts, through the outbound guard), in order;
    how many were taken. A reply that fails is logged, never the caller's failure."""
    sent = 0
    for body in interaction.replies:
        try:
            status = anyio.run(_post, interaction.response_url, body)
        except Exception as exc:  # the receiver, the way there or the guard
            logger.info("a reply to Slack failed: %s", type(exc).__name__)
            continue
        sent += 200 <= status < 300
    return sent


async def _post(url: str, body: bytes) -> int:
    with anyio.fail_after(REPLY_TIMEOUT_S * 2):
        async with async_http_client(timeout=REPLY_TIMEOUT_S) as client:
            response = await client.post(url, content=body, headers={"Content-Type": "application/json"})
            return response.status_code


# --- linking ----------------------------------------------------------------------------------------------------

def _link_url(channel: NotificationChannel, interaction: Interaction) -> str:
    link = SlackLink.objects.create(tenant_id=channel.tenant_id, channel=channel, team_id=interaction.team_id,
                                    slack_user_id=interaction.user_id)
    token = signing.TimestampSigner(salt=LINK_SALT).sign(str(link.pk))
    return public_url(reverse("inbox:slack_link", kwargs={"tenant": channel.tenant.slug})) + f"?token={token}"


class LinkRefused(Exception):
    """A link that cannot link; the message is safe to show."""


def link_open(*, tenant, token: str) -> SlackLink:
    """The unused link a token names, in this tenant, if genuine and younger than LINK_MAX_AGE_S."""
    try:
        pk = int(signing.TimestampSigner(salt=LINK_SALT).unsign(token, max_age=LINK_MAX_AGE_S))
    except (signing.BadSignature, ValueError):
        raise LinkRefused("this link is not valid or has expired") from None
    link = SlackLink.objects.for_tenant(tenant).filter(pk=pk).first()
    if link is None:
        raise LinkRefused("this link is not valid or has expired")
    if link.used_at is not None:
        raise LinkRefused("this link was used already")
    return link


@transaction.atomic
def link_use(*, tenant, token: str, user) -> SlackIdentity:
    """Link the Slack user of a link to `user`, a member of the tenant, once: the link is spent by a conditional
    update, and a Slack user linked already stays as it is."""
    link = link_open(tenant=tenant, token=token)
    if not Membership.objects.filter(tenant=tenant, user=user).exists():
        raise LinkRefused("only a member of this tenant can link a Slack user to themselves")
    if not SlackLink.objects.for_tenant(tenant).filter(pk=link.pk, used_at__isnull=True).update(
            used_at=timezone.now()):
        raise LinkRefused("this link was used already")
    try:
        with transaction.atomic():
            identity = SlackIdentity.objects.create(tenant=tenant, team_id=link.team_id,
                                                    slack_user_id=link.slack_user_id, user=user)
    except IntegrityError:
        raise LinkRefused("this Slack user is linked to a member already: unlink it first") from None
    audit_record(tenant=tenant, actor=user, verb="slack.linked", target=f"user:{user.pk}",
                 data={"team_id": link.team_id, "slack_user_id": link.slack_user_id})
    return identity


@transaction.atomic
def identity_unlink(*, tenant, user, identity_id) -> bool:
    """A member unlinks one of their own Slack users (another's is not theirs to unlink: nothing happens)."""
    identity = SlackIdentity.objects.for_tenant(tenant).filter(pk=identity_id, user=user).first()
    if identity is None:
        return False
    audit_record(tenant=tenant, actor=user, verb="slack.unlinked", target=f"user:{user.pk}",
                 data={"team_id": identity.team_id, "slack_user_id": identity.slack_user_id})
    identity.delete()
    return True


def identities_of(*, tenant, user):
    return SlackIdentity.objects.for_tenant(tenant).filter(user=user)
