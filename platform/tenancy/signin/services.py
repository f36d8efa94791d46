"""A person the provider vouched for, as an account here (docs/identity.md, "Single sign-on").

The provider's issuer and subject name the person; the first sign-in makes their account (or joins the account
that already has their verified email address), later ones find it by that name, whatever their address
became. The role claim grants and takes away memberships (`Membership.from_claim`); invitations and memberships
an admin made stay as they are. Each sign-in is recorded in the audit trail of every tenant the person is a
member of afterwards.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from importlib import import_module

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit.services import audit_record
from common.errors import ServiceError
from tenancy.models import Identity, Membership, ProviderSession, Role, Tenant
from tenancy.services import grants_revoke_for, membership_remove, membership_set

logger = logging.getLogger("toolkeeper.signin")

# The stronger role wins when a claim names one tenant twice.
ROLE_RANK = {Role.VIEWER: 0, Role.REVIEWER: 1, Role.OPERATOR: 2, Role.ADMIN: 3}
USERNAME_MAX = 150
SESSION_MEMORY = timedelta(days=30)  # a console session lasts two weeks (Django's default): older notes go


class SignInRefused(Exception):
    """A person the provider vouched for whom this deployment does not let in; `message` says why to them."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


@dataclass
class SignIn:
    user: object
    identity: Identity
    created: bool  # the account was made by this sign-in
    memberships: list[Membership]


def _text(claims: dict, name: str) -> str:
    value = claims.get(name)
    return value.strip() if isinstance(value, str) else ""


def _verified_email(claims: dict) -> str:
    email = _text(claims, "email")
    if not email or "@" not in email or len(email) > 254:
        raise SignInRefused("Your identity provider sent no email address: ask its admins to release it to "
                            "Toolkeeper.")
    if claims.get("email_verified") is not True and not settings.TOOLKEEPER_OIDC_TRUST_UNVERIFIED_EMAIL:
        raise SignInRefused(f"Your identity provider has not verified {email}: verify it there, then sign in "
                            "again.")
    domain = email.rpartition("@")[2].lower()
    allowed = settings.TOOLKEEPER_OIDC_ALLOWED_DOMAINS
    if allowed and domain not in allowed:
        raise SignInRefused(f"Accounts at {domain} may not sign in to this Toolkeeper.")
    return email


def claimed_roles(claims: dict) -> dict[str, str]:
    """The memberships the role claim grants: tenant slug to role. Values without the prefix, or naming no
    role, are someone else's groups and are passed over."""
    name = settings.TOOLKEEPER_OIDC_ROLES_CLAIM
    if not name:
        return {}
    values = claims.get(name)
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, list):
        return {}
    prefix = settings.TOOLKEEPER_OIDC_ROLE_PREFIX
    roles: dict[str, str] = {}
    for value in values:
        if not isinstance(value, str) or not value.startswith(prefix):
            continue
        slug, _, role = value[len(prefix):].partition(":")
        if role in Role.values and ROLE_RANK[Role(role)] >= ROLE_RANK.get(roles.get(slug), -1):
            roles[slug] = role
    return roles


def _unique_username(email: str) -> str:
    User = get_user_model()
    base = email[:USERNAME_MAX]
    candidate, number = base, 1
    while User.objects.filter(username__iexact=candidate).exists():
        number += 1
        suffix = f"-{number}"
        candidate = base[:USERNAME_MAX - len(suffix)] + suffix
    return candidate


def _account_for(issuer: str, subject: str, email: str, name: str) -> tuple[Identity, bool]:
    """The identity and its account, made on the first sign-in."""
    identity = Identity.objects.select_related("user").filter(issuer=issuer, subject=subject).first()
    if identity is not None:
        return identity, False
    User = get_user_model()
    # A person who joined with a password and the same verified address keeps their account.
    same_address = list(User.objects.filter(email__iexact=email)[:2])
    created = len(same_address) != 1
    if created:
        user = User.objects.create_user(username=_unique_username(email), email=email,
                                        first_name=name[:150])
        user.set_unusable_password()
        user.save(update_fields=["password"])
    else:
        user = same_address[0]
    try:
        with transaction.atomic():
            identity = Identity.objects.create(user=user, issuer=issuer, subject=subject, email=email)
    except IntegrityError:  # the same person's other tab signed in at the same moment
        identity = Identity.objects.select_related("user").get(issuer=issuer, subject=subject)
        created = False
    return identity, created


def _apply_claimed_roles(user, claims: dict) -> None:
    """Memberships as the claim names them; those it granted before and no longer names end."""
    if not settings.TOOLKEEPER_OIDC_ROLES_CLAIM:
        return
    wanted = claimed_roles(claims)
    tenants = {t.slug: t for t in Tenant.objects.filter(slug__in=wanted)}
    for slug in sorted(set(wanted) - set(tenants)):
        logger.warning("the role claim names a tenant that does not exist: %s", slug[:60])
    held = {m.tenant_id: m for m in Membership.objects.filter(user=user).select_related("tenant")}
    for slug, tenant in tenants.items():
        current = held.get(tenant.pk)
        try:
            if current is None or current.role != wanted[slug]:
                membership_set(tenant=tenant, user=user, role=wanted[slug], actor=user)
            if current is None or not current.from_claim:
                Membership.objects.filter(user=user, tenant=tenant).update(from_claim=True)
        except ServiceError as exc:  # the tenant's last admin keeps the role until another admin is made
            logger.warning("the role claim could not change a membership in %s: %s", slug, exc)
    for membership in held.values():
        if membership.from_claim and membership.tenant.slug not in tenants:
            try:
                membership_remove(tenant=membership.tenant, user=user, actor=user)
            except ServiceError as exc:
                logger.warning("the role claim could not end a membership in %s: %s", membership.tenant.slug, exc)


@transaction.atomic
def person_sign_in(*, issuer: str, claims: dict) -> SignIn:
    """The account of the person the provider's verified `claims` describe, their memberships brought up to the
    role claim, and the sign-in recorded; SignInRefused when this deployment does not let them in."""
    subject = _text(claims, "sub")
    if not subject or len(subject) > 255:
        raise SignInRefused("Your identity provider sent no usable subject: ask its admins to check the client.")
    email = _verified_email(claims)
    identity, created = _account_for(issuer, subject, email, _text(claims, "name"))
    user = identity.user
    if not user.is_active:
        raise SignInRefused("This account is disabled here: ask a Toolkeeper admin.")
    if identity.email != email or user.email != email:
        identity.email = user.email = email
        user.save(update_fields=["email"])
    identity.last_sign_in_at = timezone.now()
    identity.save(update_fields=["email", "last_sign_in_at"])
    _apply_claimed_roles(user, claims)
    memberships = sign_in_record(user=user, data={"method": "oidc", "issuer": issuer, "account_created": created})
    return SignIn(user=user, identity=identity, created=created, memberships=memberships)


def sign_in_record(*, user, data: dict) -> list[Membership]:
    """A sign-in, in the audit trail of every tenant the person is a member of; their memberships."""
    memberships = list(Membership.objects.filter(user=user).select_related("tenant"))
    for membership in memberships:
        audit_record(tenant=membership.tenant, actor=user, verb="person.signed_in", target=f"user:{user.username}",
                     data=data)
    return memberships


def provider_session_note(*, identity: Identity, sid: str, session_key: str) -> None:
    """Remember which console session a sign-in began, under the provider's session id, for its logout."""
    ProviderSession.objects.create(identity=identity, sid=sid[:255], session_key=session_key)
    ProviderSession.objects.filter(identity=identity, created_at__lt=timezone.now() - SESSION_MEMORY).delete()


@transaction.atomic
def provider_sign_out(*, issuer: str, subject: str = "", sid: str = "") -> int:
    """The provider ended the person's session (back-channel logout: they signed out there, or were disabled):
    their console sessions end, and so do the MCP clients they connected (their OAuth grants, whose open streams
    close within seconds). Returns how many console sessions ended."""
    sessions = ProviderSession.objects.select_related("identity__user").filter(identity__issuer=issuer)
    if subject:
        identities = list(Identity.objects.select_related("user").filter(issuer=issuer, subject=subject))
        sessions = sessions.filter(identity__in=identities)
    else:
        found = list(sessions.filter(sid=sid))
        identities = list({row.identity for row in found})
        sessions = sessions.filter(identity__in=identities)
    store = import_module(settings.SESSION_ENGINE).SessionStore
    rows = list(sessions)
    for row in rows:
        store(session_key=row.session_key).delete()
    ProviderSession.objects.filter(pk__in=[row.pk for row in rows]).delete()
    for identity in identities:
        user = identity.user
        grants_revoke_for(user=user, actor=None, reason="provider_signed_out")
        for membership in Membership.objects.filter(user=user).select_related("tenant"):
            audit_record(tenant=membership.tenant, actor=None, verb="person.signed_out",
                         target=f"user:{user.username}", data={"by": "provider", "issuer": issuer,
                                                                "console_sessions": len(rows)})
    return len(rows)
