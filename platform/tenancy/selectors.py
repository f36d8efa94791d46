"""Reads for tenancy, and the access helpers: the object or 404, whether missing or foreign."""
import hmac
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Q
from django.http import Http404
from django.utils import timezone

from tenancy.fastread import fetch_one
from tenancy.models import SYSTEM_AGENT, ApiKey, Membership, OAuthToken, Scope, Tenant, hash_secret, split_key
from tenancy.versions import versioned_models

_tenant_slugs: dict[int, str] = {}  # a tenant's slug never changes
TENANT_SLUGS_KEPT = 10_000


def tenant_slug(tenant_id: int | None, tenant: Tenant | None = None) -> str:
    """The tenant's slug (a metric's label): from `tenant` when the caller holds it, else read once per process; ""
    for an object of no tenant (yet)."""
    slug = _tenant_slugs.get(tenant_id)
    if slug is None:
        if tenant is None:
            tenant = Tenant.objects.only("slug").filter(pk=tenant_id).first() if tenant_id is not None else None
            if tenant is None:
                return ""
        if len(_tenant_slugs) >= TENANT_SLUGS_KEPT:
            _tenant_slugs.clear()
        slug = _tenant_slugs[tenant_id] = tenant.slug
    return slug


def apikey_from_token(token: str) -> ApiKey | None:
    """The active key a bearer token names, or None. The tenant's configuration versions come with it
    (`tenant_values`): a request that runs calls then checks its caches without reading them again
    (`tenancy.versions.versions_known`)."""
    parts = split_key(token)
    if parts is None:
        return None
    prefix, secret = parts
    api_key = fetch_one(ApiKey, join="tenant", prefix=prefix,
                        tenant_values=tuple((model, "version") for model in versioned_models()))
    if api_key is None or api_key.revoked_at is not None:
        return None
    if not hmac.compare_digest(api_key.secret_hash, hash_secret(secret)):
        return None
    return api_key


ACCESS_TOKEN_PREFIX = "tko_"  # noqa: S105 (what the tokens begin with, not one)


def issuer() -> str:
    """Toolkeeper's own authorization server: its public URL (tenancy.oauth)."""
    return settings.TOOLKEEPER_PUBLIC_URL.rstrip("/")


def mcp_resource() -> str:
    """The MCP endpoint's URL: the audience of every token Toolkeeper issues."""
    return f"{issuer()}/mcp/"


def _canonical(url: str) -> str:
    parts = urlsplit(url)
    path = parts.path if parts.path.endswith("/") else parts.path + "/"
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{path}"


def is_mcp_resource(value: str | None) -> bool:
    """A resource indicator (RFC 8707) or audience that names the MCP endpoint, with or without its trailing
    slash."""
    if not value or not isinstance(value, str):
        return False
    parts = urlsplit(value)
    return not parts.query and not parts.fragment and _canonical(value) == _canonical(mcp_resource())


def person_name(user) -> str:
    """How a session names the person it acts for: their email address, else their user name."""
    return user.email or user.get_username()


def member_with_email(tenant, email: str):
    """The tenant's one active member with this address (an ID token's verified email), or None (none, or two
    accounts share it)."""
    members = list(Membership.objects.filter(tenant=tenant, user__email__iexact=email, user__is_active=True)
                   .select_related("user")[:2])
    return members[0].user if len(members) == 1 else None


def is_access_token(token: str) -> bool:
    return token.startswith(ACCESS_TOKEN_PREFIX)


def apikey_from_access_token(token: str) -> ApiKey | None:
    """The key an OAuth access token of Toolkeeper's stands for, or None: unknown, expired, its grant revoked,
    or issued for another audience than the MCP endpoint. The key carries the person (`acting_for`)."""
    row = (OAuthToken.objects.select_related("grant__user").filter(token_hash=hash_secret(token),
                                                                   kind=OAuthToken.ACCESS).first())
    if row is None or row.expires_at <= timezone.now():
        return None
    grant = row.grant
    if grant.revoked_at is not None or not grant.user.is_active or not is_mcp_resource(grant.resource):
        return None
    api_key = fetch_one(ApiKey, join="tenant", pk=grant.api_key_id,
                        tenant_values=tuple((model, "version") for model in versioned_models()))
    if api_key is None or api_key.revoked_at is not None:
        return None
    api_key.acting_for = grant.user
    return api_key


def versions_read_with(row) -> tuple[dict | None, float]:
    """The tenant's configuration versions read with this row (an API key, a worker's call) by `fetch_one`'s
    `tenant_values` (a missing version row is version 0), and when: `tenancy.versions.versions_known`'s
    arguments after the tenant. (None, 0.0) for a row read without them."""
    found = getattr(row, "tenant_values", None)
    if not found:
        return None, 0.0
    return {model: version or 0 for model, version in found.items()}, row.tenant_values_read_at


def _key_session_rule(api_key: ApiKey) -> tuple[str, bool]:
    """Which sessions an API key may see: its locked agent's only (when it has one), and the tenant's system
    session (operators' work) only with the admin scope. (agent or "", whether the system session is hidden)"""
    return api_key.agent, not api_key.has_scope(Scope.ADMIN)


def key_sessions(api_key: ApiKey, prefix: str = "") -> Q:
    """The agent sessions an API key may see, as a condition (`prefix`: the path to them from another model)."""
    agent, hide_system = _key_session_rule(api_key)
    condition = Q(**{f"{prefix}agent": agent}) if agent else Q()
    if hide_system:
        condition &= ~Q(**{f"{prefix}agent": SYSTEM_AGENT})
    return condition


def key_sees_agent(api_key: ApiKey, agent: str) -> bool:
    """`key_sessions` for one session already loaded (by its agent)."""
    locked, hide_system = _key_session_rule(api_key)
    return (not locked or agent == locked) and not (hide_system and agent == SYSTEM_AGENT)


def memberships_of(user) -> list[Membership]:
    if not user.is_authenticated:
        return []
    return list(Membership.objects.filter(user=user).select_related("tenant").order_by("tenant__slug"))


def membership_of(user, tenant: Tenant) -> Membership | None:
    if not user.is_authenticated:
        return None
    return Membership.objects.filter(user=user, tenant=tenant).first()


def access_tenant(user, slug: str) -> tuple[Tenant, Membership]:
    """The tenant a logged-in user belongs to, with the membership; 404 otherwise."""
    membership = (
        Membership.objects.filter(user=user, tenant__slug=slug).select_related("tenant").first()
        if user.is_authenticated else None
    )
    if membership is None:
        raise Http404("no such tenant")
    return membership.tenant, membership


def access_object(model, tenant: Tenant, pk, *conditions: Q, **filters):
    """A tenant-owned row by primary key, or 404 (malformed ids are 404 too)."""
    try:
        return model.objects.for_tenant(tenant).filter(*conditions, **filters).get(pk=pk)
    except (model.DoesNotExist, ValueError, TypeError, DjangoValidationError) as exc:
        raise Http404(f"no such {model._meta.verbose_name}") from exc


def access_row(model, tenant: Tenant, pk, allowed=None):
    """`access_object` for a request's hot path: one plain statement (tenancy.fastread), then `allowed(row)`
    if given; 404 alike whether the row is missing, foreign, malformed or not allowed."""
    try:
        row = fetch_one(model, tenant=tenant.pk, pk=pk)
    except (ValueError, TypeError, DjangoValidationError) as exc:
        raise Http404(f"no such {model._meta.verbose_name}") from exc
    if row is None or (allowed is not None and not allowed(row)):
        raise Http404(f"no such {model._meta.verbose_name}")
    return row
