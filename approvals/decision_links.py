"""One-time decision links in notifications (tokens are made by `approvals.notifications` when it sends).

A token is `TimestampSigner`-signed `<link id>.<nonce>`; the link row keeps only the nonce's SHA-256, so neither
a copy of the database nor the delivery log can act. A link acts only for a logged-in member who reviews (the
one it was mailed to, for an email), while its request is pending and unexpired, and through the inbox's own
`request_decide`, so reviewers, four-eyes and quorum hold exactly as in the inbox; it is spent in the transaction
of the vote it records.
"""
import hmac

from django.core import signing
from django.db import transaction
from django.utils import timezone

from tenancy.models import Membership
from toolkeeper.errors import NotPermitted

from .models import ApprovalRequest, DecisionLink, RequestStatus
from .notifications import LINK_MAX_AGE_S, LINK_SALT, link_digest
from .services import request_decide


class LinkRefused(Exception):
    """A decision link that cannot act; the message is safe to show."""


def link_open(*, tenant, token: str) -> DecisionLink:
    """The link a token names, if it is genuine, unused and its request still pending and unexpired."""
    try:
        value = signing.TimestampSigner(salt=LINK_SALT).unsign(token, max_age=LINK_MAX_AGE_S)
        link_id, nonce = value.split(".", 1)
        link_pk = int(link_id)
    except (signing.BadSignature, ValueError):
        raise LinkRefused("this link is not valid or has expired") from None
    link = (DecisionLink.objects.for_tenant(tenant).select_related("request", "request__call", "request__queue")
            .filter(pk=link_pk).first())
    if link is None or not link.nonce_hash or not hmac.compare_digest(link.nonce_hash, link_digest(nonce)):
        raise LinkRefused("this link is not valid or has expired")
    if link.used_at is not None:
        raise LinkRefused("this link was used already")
    request = link.request
    if request.status != RequestStatus.PENDING:
        raise LinkRefused(f"this request was already decided: {request.status}")
    if request.expires_at is not None and request.expires_at <= timezone.now():
        raise LinkRefused("this request has expired")
    return link


def link_use(*, tenant, token: str, user) -> ApprovalRequest:
    """Decide a request through its link, as the logged-in `user`, exactly as the inbox would (reviewer, four-eyes,
    quorum); the link is spent only if the vote is recorded."""
    link = link_open(tenant=tenant, token=token)
    if link.user_id is not None and link.user_id != user.pk:
        raise NotPermitted("this link was sent to another reviewer")
    membership = Membership.objects.filter(tenant=tenant, user=user).first()
    if membership is None or not membership.can_review:
        raise NotPermitted("only reviewers decide")
    with transaction.atomic():
        if not DecisionLink.objects.for_tenant(tenant).filter(pk=link.pk, used_at__isnull=True).update(
                used_at=timezone.now()):
            raise LinkRefused("this link was used already")
        return request_decide(request=link.request, reviewer=user, decision=link.decision, new_input=None,
                              message="decided through a link in a notification")
