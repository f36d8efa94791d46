"""One-time decision links in notifications (their tokens are made by `approvals.notifications.link_token`).

A token is the link's id signed with the server's key (`TimestampSigner`, salted, at most a week old), so a
copy of the database or of the delivery log cannot make one. A link acts only for a logged-in member who
reviews (the one it was mailed to, for an email), while its request is pending and unexpired, and through
the inbox's own `request_decide`, so reviewer lists, four-eyes and quorum hold exactly as in the inbox. It is
spent only by a decision it made (`link_use`).
"""
from django.core import signing
from django.db import transaction
from django.utils import timezone

from approvals.models import ApprovalRequest, DecisionLink, RequestStatus
from approvals.notifications import LINK_MAX_AGE_S, LINK_SALT
from approvals.services import request_decide
from common.errors import NotPermitted, ServiceError
from tenancy.models import Membership


class LinkRefused(Exception):
    """A decision link that cannot act; the message is safe to show."""


def link_open(*, tenant, token: str) -> DecisionLink:
    """The link a token names, if it is genuine, unused and its request still pending and unexpired."""
    try:
        link_pk = int(signing.TimestampSigner(salt=LINK_SALT).unsign(token, max_age=LINK_MAX_AGE_S))
    except (signing.BadSignature, ValueError):
        raise LinkRefused("this link is not valid or has expired") from None
    link = (DecisionLink.objects.for_tenant(tenant).select_related("request", "request__call", "request__queue")
            .filter(pk=link_pk).first())
    if link is None:
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
    """Decide a request through its link, as the logged-in `user`, exactly as the inbox would.

    A link is spent only by a decision it made. It is spent by a conditional update and the vote is cast in the
    same transaction, so two people using one link at once cast one vote: the second waits on the link's row
    and then finds it spent, or, if the first was refused, free. A refused vote (the user has voted, four-eyes,
    not a reviewer of the queue, the request expired meanwhile) hands the link back in that transaction, and
    what the refusal itself settled (an expiry, say) is committed with it, as `request_decide` alone would.
    """
    link = link_open(tenant=tenant, token=token)
    if link.user_id is not None and link.user_id != user.pk:
        raise NotPermitted("this link was sent to another reviewer")
    membership = Membership.objects.filter(tenant=tenant, user=user).first()
    if membership is None or not membership.can_review:
        raise NotPermitted("only reviewers decide")
    links = DecisionLink.objects.for_tenant(tenant).filter(pk=link.pk)
    refusal = None
    with transaction.atomic():
        if not links.filter(used_at__isnull=True).update(used_at=timezone.now()):
            raise LinkRefused("this link was used already")
        try:
            settled = request_decide(request=link.request, reviewer=user, decision=link.decision, new_input=None,
                                     message="decided through a link in a notification")
        except ServiceError as exc:  # no decision was made: the link is not spent
            links.update(used_at=None)
            refusal = exc
    if refusal is not None:
        raise refusal
    return settled
