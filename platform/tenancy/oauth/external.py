"""Trusting another authorization server's tokens on `/mcp/` (`TOOLKEEPER_MCP_OAUTH=external`, docs/identity.md,
"An external authorization server").

The company's authorization server (Keycloak, Okta, Entra ID, …) issues the MCP client a JWT access token for
Toolkeeper's MCP endpoint. Each request's token is checked here: the server's signature (its JWKS, from its
metadata), its issuer, the MCP endpoint as audience, its expiry, and the scope `TOOLKEEPER_MCP_OAUTH_SCOPE`. The
person is the token's subject at that issuer, known from their sign-in to the console (`tenancy.Identity`); the
client names the tenant and the agent in headers, and the person must be a member who may connect an agent
there. Their calls then run under a grant of that client, person, tenant and agent, as a client of Toolkeeper's
own server's do: a key of its own, every limit of a key, the person as the sessions' verified user, and the
grant ending when the member is removed.
"""
from __future__ import annotations

import threading
import time

import requests
from django.conf import settings
from joserfc import jwt
from joserfc.errors import InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet

from audit.services import audit_record
from common.errors import ServiceError
from tenancy.models import ApiKey, Identity, Membership, OAuthClient, OAuthGrant, Scope, Tenant
from tenancy.oauth.services import SCOPE_ROLES, agent_problems
from tenancy.selectors import is_mcp_resource, mcp_resource
from tenancy.services import apikey_create

KEYS_FRESH_S = 3600


class ExternalTokenRefused(Exception):
    """A token of the external server that is not good here: `message` says why, for the 401."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class _ServerKeys:
    """The external server's metadata and signing keys, read once an hour (and again for a key not yet seen)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._keys: KeySet | None = None
        self._read_at = 0.0
        self._issuer = ""

    def _fetch(self, issuer: str) -> KeySet:
        timeout = settings.TOOLKEEPER_OIDC_TIMEOUT_S
        metadata = None
        for path in ("/.well-known/oauth-authorization-server", "/.well-known/openid-configuration"):
            response = requests.get(issuer + path, timeout=timeout)
            if response.status_code == 200:
                metadata = response.json()
                break
        if not isinstance(metadata, dict) or str(metadata.get("issuer", "")).rstrip("/") != issuer:
            raise ExternalTokenRefused("the authorization server's metadata cannot be read")
        response = requests.get(metadata["jwks_uri"], timeout=timeout)
        response.raise_for_status()
        return KeySet.import_key_set(response.json())

    def keys(self, *, fresh: bool = False) -> KeySet:
        issuer = settings.TOOLKEEPER_MCP_OAUTH_ISSUER
        with self._lock:
            stale = time.monotonic() - self._read_at > KEYS_FRESH_S or issuer != self._issuer
            if self._keys is None or stale or fresh:
                try:
                    self._keys = self._fetch(issuer)
                except (requests.RequestException, ValueError, KeyError, JoseError) as exc:
                    raise ExternalTokenRefused("the authorization server cannot be reached to check the token "
                                               f"({type(exc).__name__})") from None
                self._read_at, self._issuer = time.monotonic(), issuer
            return self._keys


server_keys = _ServerKeys()


def _claims(token: str) -> dict:
    try:
        try:
            decoded = jwt.decode(token, server_keys.keys(), algorithms=["RS256", "PS256", "ES256"])
        except InvalidKeyIdError:
            decoded = jwt.decode(token, server_keys.keys(fresh=True), algorithms=["RS256", "PS256", "ES256"])
    except (JoseError, ValueError, TypeError) as exc:
        raise ExternalTokenRefused(f"the access token does not verify ({type(exc).__name__})") from None
    claims = decoded.claims
    audience = claims.get("aud")
    audiences = audience if isinstance(audience, list) else [audience]
    expected = settings.TOOLKEEPER_MCP_OAUTH_AUDIENCE or mcp_resource()
    scopes = claims.get("scope", "")
    scopes = scopes.split() if isinstance(scopes, str) else list(claims.get("scp") or [])
    problems = [
        str(claims.get("iss", "")).rstrip("/") != settings.TOOLKEEPER_MCP_OAUTH_ISSUER and "another issuer",
        not any(a == expected or (is_mcp_resource(a) and not settings.TOOLKEEPER_MCP_OAUTH_AUDIENCE)
                for a in audiences) and "another audience",
        not isinstance(claims.get("exp"), int | float) and "no expiry",
        isinstance(claims.get("exp"), int | float) and claims["exp"] < time.time() and "expired",
        settings.TOOLKEEPER_MCP_OAUTH_SCOPE not in scopes and f"no {settings.TOOLKEEPER_MCP_OAUTH_SCOPE} scope",
        not isinstance(claims.get("sub"), str) and "no subject",
    ]
    if refused := [p for p in problems if p]:
        raise ExternalTokenRefused("the access token is not good here: " + ", ".join(refused))
    return claims


def apikey_from_external_token(token: str, *, tenant_slug: str, agent: str) -> ApiKey:
    """The key of the grant the external token's person has for `tenant_slug` and `agent` (made on first use);
    ExternalTokenRefused with the reason otherwise."""
    claims = _claims(token)
    identity = Identity.objects.select_related("user").filter(issuer=settings.TOOLKEEPER_MCP_OAUTH_ISSUER,
                                                              subject=claims["sub"]).first()
    if identity is None or not identity.user.is_active:
        raise ExternalTokenRefused("Toolkeeper does not know this person yet: sign in to the console once with "
                                   "single sign-on")
    user = identity.user
    tenant = Tenant.objects.filter(slug=tenant_slug).first() if tenant_slug else None
    membership = Membership.objects.filter(user=user, tenant=tenant).first() if tenant else None
    if membership is None or membership.role not in SCOPE_ROLES[Scope.AGENT]:
        raise ExternalTokenRefused("name a tenant in which you may connect an agent (the X-Toolkeeper-Tenant header)")
    if problems := agent_problems(agent):
        raise ExternalTokenRefused(f"the agent (the X-Toolkeeper-Agent header): {problems[0]}")
    client_name = str(claims.get("azp") or claims.get("client_id") or "an external client")[:100]
    client, _ = OAuthClient.objects.get_or_create(
        client_id=f"external:{settings.TOOLKEEPER_MCP_OAUTH_ISSUER}#{client_name}"[:255],
        defaults={"kind": OAuthClient.EXTERNAL, "metadata": {"client_name": client_name}})
    grant = (OAuthGrant.objects.for_tenant(tenant).select_related("api_key")
             .filter(client=client, user=user, api_key__agent=agent).order_by("-created_at").first())
    if grant is not None and grant.revoked_at is not None:
        issued = claims.get("iat")
        if not isinstance(issued, int | float) or issued <= grant.revoked_at.timestamp():
            raise ExternalTokenRefused("this client was disconnected: sign in to it again for a new token")
        grant = None
    if grant is None:
        try:
            key = apikey_create(tenant=tenant, name=f"MCP client: {client_name}"[:100], scopes=[Scope.AGENT],
                                agent=agent, created_by=user).api_key
        except ServiceError as exc:
            raise ExternalTokenRefused(exc.message) from None
        grant = OAuthGrant.objects.create(tenant=tenant, client=client, user=user, api_key=key,
                                          resource=mcp_resource())
        audit_record(tenant=tenant, actor=user, verb="oauth.granted", target=f"oauth_grant:{grant.pk}",
                     data={"client": client_name, "agent": agent, "scopes": [Scope.AGENT.value],
                           "issuer": settings.TOOLKEEPER_MCP_OAUTH_ISSUER})
    api_key = ApiKey.all_tenants.select_related("tenant").get(pk=grant.api_key_id)
    if api_key.revoked_at is not None:
        raise ExternalTokenRefused("this client was disconnected")
    api_key.acting_for = user
    return api_key
