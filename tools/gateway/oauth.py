"""The HTTP side of Toolkeeper's authorization server for `/mcp/` (docs/identity.md, "OAuth for MCP clients"):
the `mcp` SDK's handlers of the authorization, token, registration and revocation endpoints, on the records
of `tenancy.oauth.services`, and the two metadata documents a client discovers them from: the protected
resource's (RFC 9728) and the authorization server's (RFC 8414).

The SDK's handlers check what the protocol fixes (a registered client, an exactly matching redirect URI, PKCE
with S256, the code's verifier, the client's secret); the records add what is ours (redirect URIs to HTTPS or
this machine only, a resource that is the MCP endpoint, codes and refresh tokens used once). Between the
authorization request and the code stands the consent page (`tenancy.oauth.pages`), where a signed-in person
picks the tenant and the agent. Every request here passes the address's requests-per-minute limit first
(`tenancy.entry.limits.address_admit`), 429 with `Retry-After` past it.
"""
from __future__ import annotations

import json
import logging

from django.conf import settings
from mcp.server.auth.handlers.authorize import AuthorizationHandler
from mcp.server.auth.handlers.register import RegistrationHandler
from mcp.server.auth.handlers.revoke import RevocationHandler
from mcp.server.auth.handlers.token import TokenHandler
from mcp.server.auth.middleware.client_auth import ClientAuthenticator
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    AuthorizeError,
    RefreshToken,
    RegistrationError,
    TokenError,
)
from mcp.server.auth.settings import ClientRegistrationOptions
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router

from common.errors import RateLimited, ServiceError
from tenancy.entry.limits import address_admit
from tenancy.models import OAuthClient, OAuthCode, OAuthGrant, Scope
from tenancy.models import OAuthToken as TokenRow
from tenancy.oauth import services
from tenancy.oauth.consent import consent_url
from tenancy.selectors import is_mcp_resource, issuer, mcp_resource
from tenancy.services import grant_revoke
from tools.calls.waiting import run_db

logger = logging.getLogger("toolkeeper.oauth")

SCOPES = [Scope.AGENT.value, Scope.EXTERNAL.value, Scope.ADMIN.value]
AUTHORIZE_PATH, TOKEN_PATH = "/oauth/authorize", "/oauth/token"
REGISTER_PATH, REVOKE_PATH = "/oauth/register", "/oauth/revoke"
AS_METADATA_PATH = "/.well-known/oauth-authorization-server"
RESOURCE_METADATA_PATH = "/.well-known/oauth-protected-resource/mcp"
OAUTH_PATHS = frozenset({AUTHORIZE_PATH, TOKEN_PATH, REGISTER_PATH, REVOKE_PATH, AS_METADATA_PATH,
                         RESOURCE_METADATA_PATH, RESOURCE_METADATA_PATH + "/"})


def is_oauth(scope) -> bool:
    return scope["path"] in OAUTH_PATHS


def resource_metadata_url() -> str:
    return issuer() + RESOURCE_METADATA_PATH


def _client_info(client: OAuthClient | None) -> OAuthClientInformationFull | None:
    if client is None:
        return None
    secret = client.secret.get("client_secret") if client.secret else None
    return OAuthClientInformationFull.model_validate({**client.metadata, "client_secret": secret})


def _tokens(issued: services.IssuedTokens) -> OAuthToken:
    return OAuthToken(access_token=issued.access_token, token_type="Bearer",  # noqa: S106 (the type's name)
                      expires_in=issued.expires_in, refresh_token=issued.refresh_token, scope=" ".join(issued.scopes))


class TokenProvider:
    """The SDK's `OAuthAuthorizationServerProvider` on Toolkeeper's records; each step one trip to the
    database pool."""

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return _client_info(await run_db(services.client_get, client_id))

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        metadata = client_info.model_dump(mode="json", exclude_none=True)
        try:
            await run_db(services.client_register, metadata=metadata, client_secret=client_info.client_secret)
        except ServiceError as exc:
            error = "invalid_redirect_uri" if "redirect URI" in exc.message else "invalid_client_metadata"
            raise RegistrationError(error, exc.message) from None

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        resource = params.resource or mcp_resource()
        if not is_mcp_resource(resource):
            raise AuthorizeError("invalid_target", "this server issues tokens for its MCP endpoint only")
        return consent_url(services.Consent(
            client_id=client.client_id or "", redirect_uri=str(params.redirect_uri),
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            code_challenge=params.code_challenge, scopes=tuple(params.scopes or [Scope.AGENT.value]),
            state=params.state, resource=mcp_resource()))

    async def load_authorization_code(self, client, authorization_code: str) -> AuthorizationCode | None:
        row = await run_db(services.code_load, client_id=client.client_id, code=authorization_code)
        if row is None:
            return None
        return _CodeOf(code=authorization_code, scopes=list(row.scopes), expires_at=row.expires_at.timestamp(),
                       client_id=client.client_id, code_challenge=row.code_challenge, redirect_uri=row.redirect_uri,
                       redirect_uri_provided_explicitly=row.redirect_uri_provided_explicitly,
                       resource=row.resource, subject=str(row.user_id), row_id=row.pk)

    async def exchange_authorization_code(self, client, authorization_code) -> OAuthToken:
        try:
            return _tokens(await run_db(_exchange_code, authorization_code.row_id))
        except ServiceError as exc:
            raise TokenError("invalid_grant", exc.message) from None

    async def load_refresh_token(self, client, refresh_token: str) -> RefreshToken | None:
        row = await run_db(services.refresh_load, client_id=client.client_id, token=refresh_token)
        if row is None:
            return None
        return _RefreshOf(token=refresh_token, client_id=client.client_id, scopes=list(row.grant.api_key.scopes),
                          expires_at=int(row.expires_at.timestamp()), resource=row.grant.resource,
                          subject=str(row.grant.user_id), row_id=row.pk)

    async def exchange_refresh_token(self, client, refresh_token, scopes: list[str]) -> OAuthToken:
        try:
            return _tokens(await run_db(_exchange_refresh, refresh_token.row_id))
        except ServiceError as exc:
            raise TokenError("invalid_grant", exc.message) from None

    async def load_access_token(self, token: str) -> AccessToken | None:
        row = await run_db(services.token_find, token)
        if row is None:
            return None
        return _AccessOf(token=token, client_id=row.grant.client.client_id, scopes=list(row.grant.api_key.scopes),
                         expires_at=int(row.expires_at.timestamp()), resource=row.grant.resource,
                         subject=str(row.grant.user_id), grant_id=row.grant_id)

    async def revoke_token(self, token) -> None:
        await run_db(_revoke, token.grant_id if isinstance(token, _AccessOf) else None,
                     getattr(token, "row_id", None))


class _CodeOf(AuthorizationCode):
    row_id: int


class _RefreshOf(RefreshToken):
    row_id: int


class _AccessOf(AccessToken):
    grant_id: int


def _exchange_code(row_id: int) -> services.IssuedTokens:
    code = OAuthCode.all_tenants.select_related("client", "user", "tenant").get(pk=row_id)
    return services.code_exchange(code=code)


def _exchange_refresh(row_id: int) -> services.IssuedTokens:
    token = TokenRow.objects.select_related("grant__api_key", "grant__tenant").get(pk=row_id)
    return services.refresh_exchange(token=token)


def _revoke(grant_id: int | None, refresh_id: int | None) -> None:
    if grant_id is None and refresh_id is not None:
        grant_id = TokenRow.objects.filter(pk=refresh_id).values_list("grant_id", flat=True).first()
    grant = OAuthGrant.all_tenants.select_related("client", "user", "tenant").filter(pk=grant_id).first()
    if grant is not None:
        grant_revoke(grant=grant, actor=grant.user, reason="client_revoked")


def as_metadata() -> dict:
    base = issuer()
    return {
        "issuer": base,
        "authorization_endpoint": base + AUTHORIZE_PATH,
        "token_endpoint": base + TOKEN_PATH,
        "registration_endpoint": base + REGISTER_PATH,
        "revocation_endpoint": base + REVOKE_PATH,
        "scopes_supported": SCOPES,
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post", "none"],
        "revocation_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post", "none"],
        "code_challenge_methods_supported": ["S256"],
        "authorization_response_iss_parameter_supported": True,
        "client_id_metadata_document_supported": True,
    }


def resource_metadata() -> dict:
    if settings.TOOLKEEPER_MCP_OAUTH == "external":
        servers, scopes = [settings.TOOLKEEPER_MCP_OAUTH_ISSUER], [settings.TOOLKEEPER_MCP_OAUTH_SCOPE]
    else:
        servers, scopes = [issuer()], SCOPES
    return {"resource": mcp_resource(), "authorization_servers": servers, "scopes_supported": scopes,
            "bearer_methods_supported": ["header"], "resource_name": "Toolkeeper"}


def tokens_taken() -> bool:
    """`/mcp/` takes OAuth access tokens: Toolkeeper's own (served over HTTPS or on this machine), or an external
    authorization server's."""
    return services.oauth_enabled() or settings.TOOLKEEPER_MCP_OAUTH == "external"


def _document(build, *, served=services.oauth_enabled):
    async def handle(request: Request) -> Response:
        if not served():
            return JSONResponse({"error": "not_found", "error_description": "OAuth is off on this server"}, 404)
        return JSONResponse(build(), headers={"Cache-Control": "public, max-age=300"})
    return handle


class OAuthEndpoints:
    """The ASGI application behind the OAuth paths."""

    def __init__(self):
        provider = TokenProvider()
        authenticator = ClientAuthenticator(provider)
        registration = ClientRegistrationOptions(enabled=True, valid_scopes=SCOPES, default_scopes=[Scope.AGENT])
        self.router = Router(routes=[
            Route(AS_METADATA_PATH, _document(as_metadata), methods=["GET"]),
            Route(RESOURCE_METADATA_PATH, _document(resource_metadata, served=tokens_taken), methods=["GET"]),
            Route(RESOURCE_METADATA_PATH + "/", _document(resource_metadata, served=tokens_taken), methods=["GET"]),
            Route(AUTHORIZE_PATH, AuthorizationHandler(provider).handle, methods=["GET", "POST"]),
            Route(TOKEN_PATH, TokenHandler(provider, authenticator).handle, methods=["POST"]),
            Route(REGISTER_PATH, RegistrationHandler(provider, registration).handle,
                  methods=["POST"]),
            Route(REVOKE_PATH, RevocationHandler(provider, authenticator).handle, methods=["POST"]),
        ])

    async def __call__(self, scope, receive, send):
        if not tokens_taken() or (not services.oauth_enabled() and not scope["path"].startswith(
                RESOURCE_METADATA_PATH)):
            await _json(send, 404, {"error": "not_found", "error_description": "OAuth is off on this server"})
            return
        address = (scope.get("client") or ("unknown", 0))[0]
        try:
            await run_db(address_admit, address=address)
        except RateLimited as exc:
            await _json(send, 429, {"error": "rate_limited", "error_description": exc.message},
                        [(b"retry-after", str(exc.retry_after).encode())])
            return
        started = False

        async def watched(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.router(scope, receive, watched)
        except Exception:  # a database that fails now is no reason to answer with a trace
            logger.exception("an OAuth request failed")
            if not started:
                await _json(send, 503, {"error": "temporarily_unavailable",
                                        "error_description": "The authorization server cannot answer now; retry."})


async def _json(send, status: int, body: dict, headers: list | None = None) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
        (b"cache-control", b"no-store"), *(headers or [])]})
    await send({"type": "http.response.body", "body": payload})


def challenge(*, token_refused: bool) -> bytes:
    """`WWW-Authenticate` of a 401 on `/mcp/`: where the client finds how to get a token (RFC 9728 §5.1)."""
    if not tokens_taken():
        return b"Bearer"
    scope = settings.TOOLKEEPER_MCP_OAUTH_SCOPE if settings.TOOLKEEPER_MCP_OAUTH == "external" else Scope.AGENT.value
    parts = [f'resource_metadata="{resource_metadata_url()}"', f'scope="{scope}"']
    if token_refused:
        parts.insert(0, 'error="invalid_token"')
    return ("Bearer " + ", ".join(parts)).encode()

