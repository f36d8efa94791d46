"""Invitations and profiles.

An invitation is a link that carries a signed token: the invitation's id and a random secret, signed with
the server's key and dated, so a link that was changed or is older than its invitation's life is refused
before the database is read. Only a hash of the secret is stored; the link is shown once to the admin who
made it and mailed to the address. Accepting it is one conditional update, so a link works once, even when
two people follow it at the same moment.
"""
import logging
import secrets
import smtplib
import zoneinfo
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core import signing
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from audit.services import audit_record
from common.errors import ServiceError
from tenancy.models import Invitation, InvitationState, Membership, Profile, Role, Tenant, hash_secret
from tenancy.people.zones import zone_forget
from tenancy.services import membership_set

logger = logging.getLogger("toolkeeper.people")

INVITATION_DAYS = 7
INVITATION_SALT = "tenancy.invitation"
PENDING_INVITATIONS_MAX = 200  # per tenant: an admin's typo loop should not fill a table
LINK_REFUSED = "This invitation link is not valid: it was changed, has expired, or was already used."
# Where a message is only printed, nobody reads it: the page shows the link to pass on instead.
MAIL_BACKENDS_THAT_SEND_NOTHING = {
    "django.core.mail.backends.console.EmailBackend",
    "django.core.mail.backends.dummy.EmailBackend",
}


def mail_is_sent() -> bool:
    return settings.EMAIL_BACKEND not in MAIL_BACKENDS_THAT_SEND_NOTHING


@dataclass
class IssuedInvitation:
    invitation: Invitation
    link: str  # the full link with its secret: shown once, never stored
    mailed: bool


def _email_problems(email: str) -> list[str]:
    try:
        validate_email(email)
    except ValidationError:
        return ["enter a valid email address"]
    return []


def _issue(invitation: Invitation) -> str:
    """A fresh secret for the invitation (an older link stops working) and its link."""
    secret = secrets.token_urlsafe(24)
    invitation.secret_hash = hash_secret(secret)
    token = signing.dumps([invitation.pk, secret], salt=INVITATION_SALT)
    return settings.TOOLKEEPER_PUBLIC_URL.rstrip("/") + reverse("invitation_accept", kwargs={"token": token})


def _mail(invitation: Invitation, link: str) -> bool:
    if not mail_is_sent():
        return False
    context = {"invitation": invitation, "link": link, "tenant": invitation.tenant,
               "inviter": invitation.created_by, "days": INVITATION_DAYS}
    tenant_name = " ".join(invitation.tenant.name.split())  # a header holds one line
    try:
        send_mail(f"You are invited to {tenant_name} on Toolkeeper",
                  render_to_string("console/invitation_email.txt", context), settings.DEFAULT_FROM_EMAIL,
                  [invitation.email], html_message=render_to_string("console/invitation_email.html", context))
    except (smtplib.SMTPException, OSError) as exc:  # the invitation stands: its link is shown to pass on
        logger.warning("invitation %s could not be mailed: %s", invitation.pk, type(exc).__name__)
        return False
    return True


def invitation_create(*, tenant: Tenant, email: str, role: str, actor=None) -> IssuedInvitation:
    email = (email or "").strip()
    errors = {}
    if _email_problems(email):
        errors["email"] = _email_problems(email)
    if role not in Role.values:
        errors["role"] = [f"must be one of {', '.join(Role.values)}"]
    if errors:
        raise ServiceError(errors)
    if Membership.objects.for_tenant(tenant).filter(user__email__iexact=email).exists():
        raise ServiceError({"email": [f"{email} is already a member of {tenant.name}"]})
    pending = Invitation.objects.for_tenant(tenant).filter(
        accepted_at__isnull=True, revoked_at__isnull=True, expires_at__gt=timezone.now())
    if pending.count() >= PENDING_INVITATIONS_MAX:
        raise ServiceError([f"{PENDING_INVITATIONS_MAX} invitations are open already: revoke some first"])
    with transaction.atomic():
        # Inviting an address again replaces its open invitation: one link per address works at a time.
        for earlier in pending.filter(email__iexact=email):
            earlier.revoked_at = timezone.now()
            earlier.save(update_fields=["revoked_at"])
        invitation = Invitation.objects.create(
            tenant=tenant, email=email, role=role, created_by=actor if getattr(actor, "pk", None) else None,
            expires_at=timezone.now() + timedelta(days=INVITATION_DAYS), secret_hash="")
        link = _issue(invitation)
        invitation.save(update_fields=["secret_hash"])
        audit_record(tenant=tenant, actor=actor, verb="invitation.created", target=f"invitation:{invitation.pk}",
                     data={"email": email, "role": role})
    return IssuedInvitation(invitation=invitation, link=link, mailed=_mail(invitation, link))


def invitation_revoke(*, invitation: Invitation, actor=None) -> Invitation:
    updated = Invitation.objects.for_tenant(invitation.tenant).filter(
        pk=invitation.pk, accepted_at__isnull=True, revoked_at__isnull=True).update(revoked_at=timezone.now())
    if not updated:
        raise ServiceError(["this invitation was already accepted or revoked"])
    invitation.refresh_from_db()
    audit_record(tenant=invitation.tenant, actor=actor, verb="invitation.revoked",
                 target=f"invitation:{invitation.pk}", data={"email": invitation.email})
    return invitation


def invitation_from_link(token: str) -> Invitation | None:
    """The pending invitation a link names, or None for a link that was changed, is too old, or whose
    invitation was accepted, revoked, replaced or has expired."""
    try:
        invitation_id, secret = signing.loads(token, salt=INVITATION_SALT, max_age=timedelta(days=INVITATION_DAYS))
    except (signing.BadSignature, ValueError, TypeError):
        return None
    if not isinstance(invitation_id, int) or not isinstance(secret, str):
        return None
    invitation = Invitation.all_tenants.select_related("tenant", "created_by").filter(pk=invitation_id).first()
    if invitation is None or invitation.secret_hash != hash_secret(secret):
        return None
    return invitation if invitation.state == InvitationState.PENDING else None


def invitation_accept(*, token: str, user) -> Membership:
    """The signed-in `user` takes the invitation: a member with its role, once."""
    invitation = invitation_from_link(token)
    if invitation is None:
        raise ServiceError([LINK_REFUSED])
    tenant = invitation.tenant
    if Membership.objects.for_tenant(tenant).filter(user=user).exists():
        raise ServiceError([f"you are already a member of {tenant.name}"])
    with transaction.atomic():
        taken = Invitation.objects.for_tenant(tenant).filter(
            pk=invitation.pk, secret_hash=invitation.secret_hash, accepted_at__isnull=True,
            revoked_at__isnull=True, expires_at__gt=timezone.now(),
        ).update(accepted_at=timezone.now(), accepted_by=user)
        if not taken:
            raise ServiceError([LINK_REFUSED])
        if not user.email:
            user.email = invitation.email  # the link reached this address: it is theirs
            user.save(update_fields=["email"])
        membership = membership_set(tenant=tenant, user=user, role=invitation.role, actor=user)
        audit_record(tenant=tenant, actor=user, verb="invitation.accepted", target=f"invitation:{invitation.pk}",
                     data={"email": invitation.email, "role": invitation.role})
    return membership


def account_create(*, username: str, password: str, email: str):
    """A new person's account, made when they accept an invitation with no account yet."""
    username = (username or "").strip()
    User = get_user_model()
    errors = {}
    try:
        User._meta.get_field("username").run_validators(username)
        if not username:
            raise ValidationError("choose a user name")
    except ValidationError as exc:
        errors["username"] = list(exc.messages)
    if not errors and User.objects.filter(username__iexact=username).exists():
        errors["username"] = ["this user name is taken"]
    try:
        validate_password(password, User(username=username, email=email))
    except ValidationError as exc:
        errors["password"] = list(exc.messages)
    if errors:
        raise ServiceError(errors)
    try:
        return User.objects.create_user(username=username, password=password, email=email)
    except IntegrityError as exc:  # taken between the check and the insert
        raise ServiceError({"username": ["this user name is taken"]}) from exc


def time_zone_problems(name: str) -> list[str]:
    if name and name not in zoneinfo.available_timezones():
        return ["choose a time zone from the list (for example Europe/Berlin)"]
    return []


def profile_of(user) -> Profile:
    return Profile.objects.filter(user=user).first() or Profile(user=user)


def profile_update(*, user, name: str, email: str, time_zone: str) -> Profile:
    name, email, time_zone = (name or "").strip(), (email or "").strip(), (time_zone or "").strip()
    errors = {}
    if len(name) > 150:
        errors["name"] = ["at most 150 characters"]
    if email and _email_problems(email):
        errors["email"] = _email_problems(email)
    if time_zone_problems(time_zone):
        errors["time_zone"] = time_zone_problems(time_zone)
    if errors:
        raise ServiceError(errors)
    with transaction.atomic():
        profile = profile_of(user)
        profile.name, profile.time_zone = name, time_zone
        profile.save()
        if user.email != email:
            user.email = email
            user.save(update_fields=["email"])
        # Forgotten now and again once saved: a page read meanwhile may have kept the zone before.
        zone_forget(user.pk)
        transaction.on_commit(lambda: zone_forget(user.pk))
    return profile
