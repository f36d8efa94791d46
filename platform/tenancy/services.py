"""Writes for tenants, memberships and API keys."""
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from common.errors import ServiceError
from tenancy.models import (
    SYSTEM_AGENT_RESERVED,
    ApiKey,
    Behavior,
    Membership,
    OAuthGrant,
    OAuthToken,
    Role,
    Scope,
    Tenant,
    ToolSurface,
    hash_secret,
    is_system_agent,
    new_key_material,
)
from tenancy.signals import member_left, tenant_created


@transaction.atomic
def tenant_create(*, slug: str, name: str = "", admin=None, **options) -> Tenant:
    tenant = Tenant.objects.create(slug=slug, name=name or slug, **options)
    if admin is not None:
        Membership.objects.create(user=admin, tenant=tenant, role=Role.ADMIN)
    audit_record(tenant=tenant, actor=admin, verb="tenant.created", target=f"tenant:{tenant.slug}")
    tenant_created.send(sender=Tenant, tenant=tenant)
    return tenant


LIMIT_FIELDS = ("key_requests_per_minute", "tenant_requests_per_minute", "key_calls_in_flight",
                "tenant_calls_in_flight")
LIMIT_MAX = 10_000_000


def _tenant_change(tenant: Tenant, values: dict, *, actor, verb: str) -> Tenant:
    """Save the checked values that differ, with one audit entry naming them (none when nothing changed)."""
    changed = {name: value for name, value in values.items() if getattr(tenant, name) != value}
    if changed:
        with transaction.atomic():
            for name, value in changed.items():
                setattr(tenant, name, value)
            tenant.save(update_fields=list(changed))
            audit_record(tenant=tenant, actor=actor, verb=verb, target=f"tenant:{tenant.slug}", data=changed)
    return tenant


def tenant_limits_set(*, tenant: Tenant, actor=None, **limits) -> Tenant:
    """Change the tenant's rate limits (tenancy.entry.limits; 0 is no limit). Only the named limits change."""
    unknown = sorted(set(limits) - set(LIMIT_FIELDS))
    if unknown:
        raise ServiceError({name: ["not a limit"] for name in unknown})
    errors = {name: [f"a whole number from 0 (no limit) to {LIMIT_MAX}"] for name, value in limits.items()
              if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= LIMIT_MAX}
    if errors:
        raise ServiceError(errors)
    return _tenant_change(tenant, limits, actor=actor, verb="tenant.limits_set")


LAST_ADMIN = "a tenant keeps at least one admin: make another member an admin first"


def _refuse_losing_the_last_admin(tenant: Tenant, user) -> None:
    """Called under a lock of the tenant's admins, so two admins demoting each other cannot both succeed."""
    admins = list(Membership.objects.for_tenant(tenant).filter(role=Role.ADMIN).select_for_update()
                  .values_list("user_id", flat=True))
    if admins == [user.pk]:
        raise ServiceError([LAST_ADMIN])


GOVERNANCE_FIELDS = ("default_behavior", "auto_allow_read_only", "review_untrusted", "max_parallel_calls",
                     "tool_surface")
PARALLEL_MAX = 1000


def tenant_governance_set(*, tenant: Tenant, actor=None, **values) -> Tenant:
    """Change how the tenant decides and runs calls: the decision when no rule matches, whether read-only
    tools run without asking, whether untrusted servers' tools wait for a reviewer, how many of its calls run at
    once, and whether a session is listed its whole surface or the core and the tool search (`tool_surface`). Only
    the named settings change."""
    errors = {name: ["not a setting"] for name in sorted(set(values) - set(GOVERNANCE_FIELDS))}
    if "default_behavior" in values and values["default_behavior"] not in Behavior.values:
        errors["default_behavior"] = [f"one of {', '.join(Behavior.values)}"]
    for name in ("auto_allow_read_only", "review_untrusted"):
        if name in values and not isinstance(values[name], bool):
            errors[name] = ["true or false"]
    parallel = values.get("max_parallel_calls", 1)
    if isinstance(parallel, bool) or not isinstance(parallel, int) or not 1 <= parallel <= PARALLEL_MAX:
        errors["max_parallel_calls"] = [f"a whole number from 1 to {PARALLEL_MAX}"]
    if "tool_surface" in values and values["tool_surface"] not in ToolSurface.values:
        errors["tool_surface"] = [f"one of {', '.join(ToolSurface.values)}"]
    if errors:
        raise ServiceError(errors)
    return _tenant_change(tenant, values, actor=actor, verb="tenant.governance_set")


@transaction.atomic
def membership_set(*, tenant: Tenant, user, role: str, actor=None) -> Membership:
    if role not in Role.values:
        raise ServiceError({"role": [f"must be one of {', '.join(Role.values)}"]})
    if role != Role.ADMIN:
        _refuse_losing_the_last_admin(tenant, user)
    membership, _ = Membership.objects.update_or_create(user=user, tenant=tenant, defaults={"role": role})
    audit_record(tenant=tenant, actor=actor, verb="membership.set", target=f"user:{user.username}",
                 data={"role": role})
    return membership


@transaction.atomic
def membership_remove(*, tenant: Tenant, user, actor=None) -> bool:
    """Take a user out of a tenant; their open console streams and waiting requests end within seconds
    (tenancy.grants), and so do the MCP clients they connected there (their OAuth grants end)."""
    _refuse_losing_the_last_admin(tenant, user)
    removed, _ = Membership.objects.filter(user=user, tenant=tenant).delete()
    if removed:
        audit_record(tenant=tenant, actor=actor, verb="membership.removed", target=f"user:{user.username}")
        grants_revoke_for(user=user, tenant=tenant, actor=actor, reason="membership_removed")
        member_left.send(sender=Membership, tenant=tenant, user=user)
    return bool(removed)


def user_create(*, username: str, password: str, email: str = ""):
    return get_user_model().objects.create_user(username=username, password=password, email=email)


@dataclass
class IssuedKey:
    api_key: ApiKey
    key: str  # the full secret: shown once, never stored


def apikey_create(*, tenant: Tenant, name: str, scopes: list[str], agent: str = "", created_by=None) -> IssuedKey:
    unknown = sorted(set(scopes) - set(Scope.values))
    if unknown or not scopes:
        got = ", ".join(unknown) or "none"
        raise ServiceError({"scopes": [f"choose from {', '.join(Scope.values)}; got {got}"]})
    if is_system_agent(agent):
        raise ServiceError({"agent": [SYSTEM_AGENT_RESERVED]})
    prefix, secret, key = new_key_material()
    api_key = ApiKey.objects.create(
        tenant=tenant, name=name, prefix=prefix, secret_hash=hash_secret(secret),
        scopes=sorted(set(scopes)), agent=agent, created_by=created_by,
    )
    audit_record(tenant=tenant, actor=created_by, verb="apikey.created", target=f"apikey:{api_key.pk}",
                 data={"name": name, "scopes": api_key.scopes, "agent": agent})
    return IssuedKey(api_key=api_key, key=key)


def apikey_revoke(*, api_key: ApiKey, actor=None) -> ApiKey:
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
        audit_record(tenant=api_key.tenant, actor=actor, verb="apikey.revoked", target=f"apikey:{api_key.pk}")
    return api_key


def grant_revoke(*, grant: OAuthGrant, actor=None, reason: str = "revoked") -> OAuthGrant:
    """End an MCP client's OAuth grant (tenancy.oauth): its tokens stop working at once, and its key's open streams
    and waits within seconds."""
    with transaction.atomic():
        ended = OAuthGrant.all_tenants.filter(pk=grant.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        OAuthToken.objects.filter(grant=grant).delete()
        if ended:
            apikey_revoke(api_key=ApiKey.all_tenants.get(pk=grant.api_key_id), actor=actor)
            audit_record(tenant=grant.tenant, actor=actor, verb="oauth.revoked", target=f"oauth_grant:{grant.pk}",
                         data={"client": grant.client.name, "user": grant.user.username, "reason": reason})
    grant.refresh_from_db()
    return grant


def grants_revoke_for(*, user, tenant: Tenant | None = None, actor=None, reason: str) -> int:
    """End every standing grant of `user` (in `tenant`, or everywhere): a member removed, a person gone."""
    grants = OAuthGrant.all_tenants.select_related("client", "user", "tenant").filter(user=user,
                                                                                    revoked_at__isnull=True)
    if tenant is not None:
        grants = grants.filter(tenant=tenant)
    ended = 0
    for grant in grants:
        grant_revoke(grant=grant, actor=actor, reason=reason)
        ended += 1
    return ended
