"""Toolkeeper as the authorization server of its MCP endpoint (docs/identity.md, "OAuth for MCP clients").

A client registers (or is named by its metadata document), a signed-in person consents on the consent page
that it acts for them as an agent of one of their tenants, and the client exchanges the code it was given
(with its PKCE verifier) for tokens. The consent becomes a grant with an API key of its own, locked to the
agent and never shown: the tokens stand for that key on `/mcp/`, so every limit and check of a key applies
and revoking the grant revokes the key. Codes, access and refresh tokens are random, kept only as hashes,
bound to the MCP endpoint as their audience, and short-lived; a refresh token is used once.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import secrets
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

import httpx2
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from mcp.shared.auth import OAuthClientInformationFull
from pydantic import ValidationError

from audit.services import audit_record
from common.errors import ServiceError
from common.outbound import OutboundRefused, http_client
from tenancy.models import (
    SYSTEM_AGENT_RESERVED,
    ApiKey,
    Membership,
    OAuthClient,
    OAuthCode,
    OAuthGrant,
    OAuthToken,
    Role,
    Scope,
    Tenant,
    hash_secret,
    is_system_agent,
)
from tenancy.selectors import ACCESS_TOKEN_PREFIX, issuer, mcp_resource
from tenancy.services import apikey_create, grant_revoke

logger = logging.getLogger("toolkeeper.oauth")

ACCESS_PREFIX, REFRESH_PREFIX = ACCESS_TOKEN_PREFIX, "tkr_"  # noqa: S105 (names, not secrets)
CODE_S = 300
# What each scope needs of the person's role in the tenant: an agent's calls need more than reading.
SCOPE_ROLES = {
    Scope.AGENT: (Role.ADMIN, Role.OPERATOR, Role.REVIEWER),
    Scope.EXTERNAL: (Role.ADMIN, Role.OPERATOR),
    Scope.ADMIN: (Role.ADMIN,),
}
CLIENT_NAME_MAX = 100
DOCUMENT_MAX_BYTES = 5 * 1024
DOCUMENT_TIMEOUT_S = 5
DOCUMENT_FRESH = timedelta(hours=1)
REDIRECT_URIS_MAX = 10
URI_MAX = 2000
AGENT_MAX = 100


def oauth_enabled() -> bool:
    """Toolkeeper issues tokens itself (the default), over HTTPS, or plain HTTP on a loopback address."""
    if settings.TOOLKEEPER_MCP_OAUTH != "builtin":
        return False
    parts = urlsplit(issuer())
    return parts.scheme == "https" or (parts.scheme == "http" and _is_loopback(parts.hostname or ""))


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- clients -------------------------------------------------------------------------------------------------

def redirect_uri_problem(uri: str) -> str | None:
    """Why a client may not be sent back to `uri`: only HTTPS, or HTTP to this machine (a native client's
    loopback listener), without a fragment or credentials."""
    if len(uri) > URI_MAX:
        return "a redirect URI is too long"
    parts = urlsplit(uri)
    if parts.fragment or "#" in uri:
        return "a redirect URI may not have a fragment"
    if parts.username or parts.password:
        return "a redirect URI may not carry credentials"
    if parts.scheme == "https" and parts.hostname:
        return None
    if parts.scheme == "http" and _is_loopback(parts.hostname or ""):
        return None
    return "a redirect URI must be HTTPS, or HTTP to localhost or a loopback address"


def _check_metadata(uris: list[str], name) -> None:
    problems = [problem for uri in uris if (problem := redirect_uri_problem(uri))]
    if len(uris) > REDIRECT_URIS_MAX:
        problems.append(f"at most {REDIRECT_URIS_MAX} redirect URIs")
    if not isinstance(name, str) or len(name) > CLIENT_NAME_MAX or any(ord(ch) < 32 for ch in name):
        problems.append(f"client_name: at most {CLIENT_NAME_MAX} characters, on one line")
    if problems:
        raise ServiceError(sorted(set(problems)))


def client_register(*, metadata: dict, client_secret: str | None) -> OAuthClient:
    """Keep a client that registered itself (RFC 7591), after the checks the SDK's handler left to us."""
    _check_metadata([str(uri) for uri in metadata.get("redirect_uris") or []], metadata.get("client_name") or "")
    kept = {key: value for key, value in metadata.items() if key != "client_secret" and value is not None}
    return OAuthClient.objects.create(
        client_id=metadata["client_id"], kind=OAuthClient.REGISTERED, metadata=kept,
        secret={"client_secret": client_secret} if client_secret else None)


def is_document_client_id(client_id: str) -> bool:
    """A client id that is the URL of the client's metadata document (HTTPS, a path below the root)."""
    parts = urlsplit(client_id or "")
    return parts.scheme == "https" and bool(parts.hostname) and parts.path not in ("", "/") \
        and not parts.fragment and not parts.username and not parts.password


def client_get(client_id: str) -> OAuthClient | None:
    """The client of `client_id`: a registered one, or the one whose metadata document the id names, read (again,
    when older than DOCUMENT_FRESH) through the outbound guard; None for an unknown id or a document that does
    not hold."""
    if not client_id or len(client_id) > 255:
        return None
    client = OAuthClient.objects.filter(client_id=client_id).first()
    if not is_document_client_id(client_id):
        return client if client is not None and client.kind == OAuthClient.REGISTERED else None
    if client is not None and client.last_read_at and timezone.now() - client.last_read_at < DOCUMENT_FRESH:
        return client
    try:
        metadata = client_document(client_id)
    except ServiceError as exc:
        logger.info("a client metadata document was refused: %s", exc.message)
        return None
    client, _ = OAuthClient.objects.update_or_create(
        client_id=client_id, defaults={"kind": OAuthClient.DOCUMENT, "metadata": metadata, "secret": None,
                                       "last_read_at": timezone.now()})
    return client


def client_document(url: str) -> dict:
    """A client's metadata document (the MCP authorization specification's client ID metadata documents), fetched
    through the outbound guard (no private or internal address unless allow-listed), within DOCUMENT_MAX_BYTES and
    DOCUMENT_TIMEOUT_S, and checked as a registration is: its `client_id` is its own URL, its redirect URIs are
    HTTPS or this machine's, its name is short; a public client (no secret)."""
    try:
        with http_client(timeout=DOCUMENT_TIMEOUT_S) as http, http.stream(
                "GET", url, headers={"Accept": "application/json"}) as response:
            if response.status_code != 200:
                raise ServiceError([f"the client's metadata document answered {response.status_code}"])
            body = b""
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > DOCUMENT_MAX_BYTES:
                    raise ServiceError([f"the client's metadata document is larger than {DOCUMENT_MAX_BYTES} bytes"])
    except OutboundRefused as exc:
        raise ServiceError([f"the client's metadata document cannot be fetched: {exc}"]) from None
    except httpx2.HTTPError as exc:
        raise ServiceError([f"the client's metadata document cannot be fetched ({type(exc).__name__})"]) from None
    try:
        document = json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise ServiceError(["the client's metadata document is not JSON"]) from None
    if not isinstance(document, dict) or document.get("client_id") != url:
        raise ServiceError(["the client's metadata document does not name its own URL as client_id"])
    if document.get("token_endpoint_auth_method", "none") != "none" or "client_secret" in document:
        raise ServiceError(["a client named by its metadata document is a public client (no secret)"])
    uris = document.get("redirect_uris")
    if not isinstance(uris, list) or not uris or not all(isinstance(uri, str) for uri in uris):
        raise ServiceError(["the client's metadata document lists no redirect URIs"])
    grants = document.get("grant_types", ["authorization_code"])
    if not isinstance(grants, list) or "authorization_code" not in grants:
        raise ServiceError(["the client's metadata document does not use the authorization code grant"])
    _check_metadata(uris, document.get("client_name") or "")
    scopes = document.get("scope")
    if scopes is not None and (not isinstance(scopes, str) or set(scopes.split()) - set(Scope.values)):
        raise ServiceError([f"the client's metadata document asks for scopes other than {', '.join(Scope.values)}"])
    try:  # the SDK's own reading of client metadata: a document it would refuse is refused here
        info = OAuthClientInformationFull.model_validate({**document, "token_endpoint_auth_method": "none",
                                                          "scope": scopes or Scope.AGENT.value})
    except ValidationError as exc:
        raise ServiceError([f"the client's metadata document does not hold ({exc.error_count()} problems)"]) from None
    return info.model_dump(mode="json", exclude_none=True)


# -- consent and codes ---------------------------------------------------------------------------------------

def consent_tenants(user) -> list[Membership]:
    """The memberships in which `user` may let a client act as an agent."""
    return list(Membership.objects.filter(user=user, role__in=SCOPE_ROLES[Scope.AGENT])
                .select_related("tenant").order_by("tenant__name"))


def scopes_allowed(role: str, requested: list[str]) -> list[str]:
    """The scopes of `requested` that a member with `role` may grant (always the agent scope first)."""
    wanted = [Scope.AGENT.value, *[s for s in requested if s != Scope.AGENT]]
    return [scope for scope in dict.fromkeys(wanted) if scope in SCOPE_ROLES and role in SCOPE_ROLES[scope]]


def agent_problems(agent: str) -> list[str]:
    if not agent:
        return ["name the agent the client acts as"]
    if len(agent) > AGENT_MAX:
        return [f"at most {AGENT_MAX} characters"]
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in agent):
        return ["no control characters"]
    if is_system_agent(agent):
        return [SYSTEM_AGENT_RESERVED]
    return []


@dataclass(frozen=True)
class Consent:
    """What the consent page asked about: the authorization request, as the SDK's handler validated it."""

    client_id: str
    redirect_uri: str
    redirect_uri_provided_explicitly: bool
    code_challenge: str
    scopes: tuple[str, ...]
    state: str | None
    resource: str


def code_issue(*, consent: Consent, user, tenant: Tenant, agent: str, scopes: list[str]) -> str:
    """The person agreed: a code for the client to exchange (returned once, stored as a hash)."""
    membership = Membership.objects.filter(user=user, tenant=tenant).first()
    errors = {}
    if membership is None or membership.role not in SCOPE_ROLES[Scope.AGENT]:
        errors["tenant"] = ["choose a tenant in which you may connect an agent"]
    if problems := agent_problems(agent):
        errors["agent"] = problems
    granted = scopes_allowed(membership.role, scopes) if membership else []
    if membership and (beyond := sorted(set(scopes) - set(granted))):
        errors["scopes"] = [f"your role ({membership.role}) cannot grant {', '.join(beyond)}"]
    client = client_get(consent.client_id)
    if client is None:
        errors["client"] = ["this client is no longer registered"]
    if errors:
        raise ServiceError(errors)
    code = secrets.token_urlsafe(32)
    with transaction.atomic():
        OAuthCode.objects.create(
            tenant=tenant, code_hash=hash_secret(code), client=client, user=user, agent=agent, scopes=granted,
            code_challenge=consent.code_challenge, redirect_uri=consent.redirect_uri,
            redirect_uri_provided_explicitly=consent.redirect_uri_provided_explicitly, resource=consent.resource,
            expires_at=timezone.now() + timedelta(seconds=CODE_S))
        audit_record(tenant=tenant, actor=user, verb="oauth.consented", target=f"user:{user.username}",
                     data={"client": client.name, "client_id": client.client_id, "agent": agent, "scopes": granted})
    return code


def code_load(*, client_id: str, code: str) -> OAuthCode | None:
    """The unused, unexpired code the client holds, or None."""
    row = OAuthCode.all_tenants.select_related("client", "user", "tenant").filter(
        code_hash=hash_secret(code or "")).first()
    if row is None or row.client.client_id != client_id:
        return None
    if row.used_at is not None:
        # A second use: someone else has the code. What it already bought ends too (RFC 6749 §4.1.2).
        if row.grant_id is not None:
            grant_revoke(grant=row.grant, actor=None, reason="code_replayed")
        return None
    return row if row.expires_at > timezone.now() else None


@dataclass(frozen=True)
class IssuedTokens:
    access_token: str
    refresh_token: str
    expires_in: int
    scopes: list[str]


def _issue_tokens(grant: OAuthGrant) -> IssuedTokens:
    access, refresh = ACCESS_PREFIX + secrets.token_urlsafe(32), REFRESH_PREFIX + secrets.token_urlsafe(32)
    now = timezone.now()
    access_s, refresh_s = settings.TOOLKEEPER_OAUTH_ACCESS_TOKEN_S, settings.TOOLKEEPER_OAUTH_REFRESH_TOKEN_S
    OAuthToken.objects.bulk_create([
        OAuthToken(grant=grant, kind=OAuthToken.ACCESS, token_hash=hash_secret(access),
                   expires_at=now + timedelta(seconds=access_s)),
        OAuthToken(grant=grant, kind=OAuthToken.REFRESH, token_hash=hash_secret(refresh),
                   expires_at=now + timedelta(seconds=refresh_s)),
    ])
    OAuthToken.objects.filter(grant=grant, expires_at__lt=now).delete()  # a grant's list stays short
    return IssuedTokens(access_token=access, refresh_token=refresh, expires_in=int(access_s),
                        scopes=list(grant.api_key.scopes))


def code_exchange(*, code: OAuthCode) -> IssuedTokens:
    """The client's tokens for a code, once: the grant (with its key) is made, or the same client's grant for
    the same person and agent is renewed."""
    with transaction.atomic():
        taken = OAuthCode.all_tenants.filter(pk=code.pk, used_at__isnull=True).update(used_at=timezone.now())
        if not taken:
            raise ServiceError(["this code was used already"])
        grant = (OAuthGrant.objects.for_tenant(code.tenant).select_related("api_key")
                 .filter(client=code.client, user=code.user, api_key__agent=code.agent, revoked_at__isnull=True)
                 .first())
        if grant is not None and sorted(grant.api_key.scopes) != sorted(code.scopes):
            ApiKey.all_tenants.filter(pk=grant.api_key_id).update(scopes=sorted(code.scopes))
            grant.api_key.scopes = sorted(code.scopes)
        if grant is None:
            key = apikey_create(tenant=code.tenant, name=f"MCP client: {code.client.name}"[:100],
                                scopes=code.scopes, agent=code.agent, created_by=code.user).api_key
            grant = OAuthGrant.objects.create(tenant=code.tenant, client=code.client, user=code.user, api_key=key,
                                              resource=mcp_resource())
        OAuthCode.all_tenants.filter(pk=code.pk).update(grant=grant)
        OAuthClient.objects.filter(pk=code.client_id).update(last_used_at=timezone.now())
        audit_record(tenant=code.tenant, actor=code.user, verb="oauth.granted", target=f"oauth_grant:{grant.pk}",
                     data={"client": code.client.name, "agent": code.agent, "scopes": list(grant.api_key.scopes)})
        return _issue_tokens(grant)


def _token_row(token: str, kind: str) -> OAuthToken | None:
    return (OAuthToken.objects.select_related("grant__client", "grant__api_key", "grant__user", "grant__tenant")
            .filter(token_hash=hash_secret(token or ""), kind=kind).first())


def refresh_load(*, client_id: str, token: str) -> OAuthToken | None:
    row = _token_row(token, OAuthToken.REFRESH)
    if row is None or row.grant.client.client_id != client_id or row.grant.revoked_at is not None:
        return None
    if row.used_at is not None:  # a used refresh token again: a copy is loose; the grant ends
        grant_revoke(grant=row.grant, actor=None, reason="refresh_token_replayed")
        return None
    return row if row.expires_at > timezone.now() else None


def refresh_exchange(*, token: OAuthToken) -> IssuedTokens:
    with transaction.atomic():
        taken = OAuthToken.objects.filter(pk=token.pk, used_at__isnull=True).update(used_at=timezone.now())
        if not taken:
            raise ServiceError(["this refresh token was used already"])
        return _issue_tokens(token.grant)


def token_find(token: str) -> OAuthToken | None:
    """An access or refresh token of a grant that still stands (for revocation)."""
    kind = OAuthToken.ACCESS if (token or "").startswith(ACCESS_PREFIX) else OAuthToken.REFRESH
    row = _token_row(token, kind)
    return row if row is not None and row.grant.revoked_at is None else None
