"""Toolkeeper as an OAuth 2.1 client of an upstream MCP server's authorization server (docs/accounts.md).

Every request goes through the outbound guard (`common.outbound.http_client`): the server's URL, and every URL
its documents name, are a tenant's input. Documents are bounded in size, requests in time, and what a document
says is checked before it is used:

- **Discovery** (`discover`): an unauthenticated request to the server must be refused with a 401; its
  `WWW-Authenticate` names the protected-resource metadata (RFC 9728), else the well-known places are tried.
  The metadata's `resource` must be the server (RFC 8707), and its first authorization server's metadata
  (RFC 8414, then OpenID discovery) must name the issuer it was fetched for and offer the authorization code
  flow with PKCE S256.
- **The client** (`client_for`): the operator's pre-registered client when there is one; else the client id
  metadata document at `TOOLKEEPER_PUBLIC_URL` when the server supports them and the URL is HTTPS; else
  dynamic registration (RFC 7591), whose answer is kept, encrypted, on the server for the next person.
- **Tokens**: the authorization code with PKCE and the `resource` parameter, refresh, revocation (RFC 7009),
  and client credentials for an HTTP tools' provider's service account.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
from dataclasses import asdict, dataclass
from urllib.parse import urlencode, urlsplit

import httpx2
from django.conf import settings
from django.urls import reverse
from mcp.client.auth.utils import (
    build_oauth_authorization_server_metadata_discovery_urls,
    build_protected_resource_metadata_discovery_urls,
    extract_resource_metadata_from_www_auth,
    extract_scope_from_www_auth,
)
from mcp.shared.auth import OAuthMetadata, ProtectedResourceMetadata
from mcp.shared.auth_utils import check_resource_allowed, resource_url_from_server_url
from pydantic import ValidationError

from common.outbound import OutboundRefused, allow_list, http_client, literal_address, normal_host

CLIENT_KEYS = frozenset({"client_id", "client_secret"})
CLIENT_VALUE = re.compile(r"[\t\x20-\x7e]*")  # visible ASCII, space and tab: it may go into a header
CLIENT_VALUE_MAX = 2000
SCOPES = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+(?: [\x21\x23-\x5b\x5d-\x7e]+)*")  # RFC 6749 scope-tokens
SCOPES_MAX = 500
DOCUMENT_MAX_BYTES = 64 * 1024
REQUEST_TIMEOUT_S = 10.0
CLIENT_NAME = "Toolkeeper"


class OAuthFailed(Exception):
    """The upstream's authorization server could not be used; the text is for people (no secret in it)."""


class GrantRefused(OAuthFailed):
    """The authorization server refused a grant (`invalid_grant`): the person must connect again."""


@dataclass(frozen=True)
class AuthServer:
    """What discovery learnt: where to send the person and where to get tokens, for which resource."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    registration_endpoint: str
    revocation_endpoint: str
    resource: str
    scopes: str
    client_id_documents: bool
    issuer_in_response: bool  # RFC 9207: the authorization response names its issuer

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, values: dict) -> AuthServer:
        return cls(**values)


def client_problem(client, *, stored_keys=frozenset()) -> str | None:
    """What is wrong with a client an operator enters (`{"client_id", "client_secret"?}`), or None.
    `stored_keys`: what Toolkeeper itself may have added to a stored one (a registration's issuer)."""
    if not isinstance(client, dict) or set(client) - CLIENT_KEYS - stored_keys:
        return "an object with client_id and, for a confidential client, client_secret"
    if not all(isinstance(client.get(key), str) and 0 < len(client[key]) <= CLIENT_VALUE_MAX
               and CLIENT_VALUE.fullmatch(client[key]) for key in client):
        return f"client_id and client_secret: 1-{CLIENT_VALUE_MAX} visible characters each"
    if "client_id" not in client:
        return "client_id is required"
    return None


def scopes_problem(scopes) -> str | None:
    if not isinstance(scopes, str) or len(scopes) > SCOPES_MAX or (scopes and not SCOPES.fullmatch(scopes)):
        return f"scope names separated by single spaces, at most {SCOPES_MAX} characters"
    return None


def redirect_uri() -> str:
    return settings.TOOLKEEPER_PUBLIC_URL.rstrip("/") + reverse("accounts_callback")


def client_document_url() -> str:
    return settings.TOOLKEEPER_PUBLIC_URL.rstrip("/") + reverse("accounts_client_document")


def client_metadata() -> dict:
    """What Toolkeeper says of itself to an authorization server (registration, client id metadata document)."""
    return {"client_name": CLIENT_NAME, "redirect_uris": [redirect_uri()],
            "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
            "token_endpoint_auth_method": "none"}


def _client():
    return http_client(timeout=REQUEST_TIMEOUT_S)


def _request(client, method: str, url: str, **options) -> httpx2.Response:
    try:
        return client.request(method, url, **options)
    except OutboundRefused as exc:
        raise OAuthFailed(f"{_host(url)}: {exc}") from None
    except httpx2.HTTPError as exc:
        raise OAuthFailed(f"{_host(url)} could not be reached ({type(exc).__name__})") from None


def _host(url: str) -> str:
    return urlsplit(url).netloc or "the server"


def _json(response: httpx2.Response) -> dict | None:
    """The answer's JSON object, if it is one of a bounded size (whatever the status)."""
    if len(response.content) > DOCUMENT_MAX_BYTES:
        return None
    try:
        value = json.loads(response.content)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _document(response: httpx2.Response) -> dict | None:
    return _json(response) if response.status_code == 200 else None


def _first_document(client, urls: list[str], model):
    """The first of the well-known places that holds a valid document of `model`, or None."""
    for url in urls:
        document = _document(_request(client, "GET", url))
        if document is not None:
            try:
                return model.model_validate(document)
            except ValidationError:
                continue
    return None


def _plain_http_allowed(url: str) -> bool:
    """Plain HTTP only to a host the platform admin opened (a server on the deployment's own network)."""
    host = urlsplit(url).hostname or ""
    address = literal_address(host)
    allowed = allow_list()
    return allowed.permits(host, address) if address is not None else normal_host(host) in allowed.names


def checked_endpoint(name: str, url) -> str:
    url = str(url or "")
    scheme = urlsplit(url).scheme.lower()
    if url and not (scheme == "https" or (scheme == "http" and _plain_http_allowed(url))):
        raise OAuthFailed(f"the authorization server's {name} is not an HTTPS address")
    return url


def discover(server_url: str, *, transport: str = "streamable_http") -> AuthServer:
    """The authorization server of the MCP server at `server_url`, from its 401 (module docstring)."""
    with _client() as client:
        if transport == "sse":
            challenge = _request(client, "GET", server_url, headers={"Accept": "text/event-stream"})
        else:
            body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                               "clientInfo": {"name": CLIENT_NAME, "version": "1"}}}
            challenge = _request(client, "POST", server_url, json=body,
                                 headers={"Accept": "application/json, text/event-stream"})
        if challenge.status_code != 401:
            raise OAuthFailed(f"the server did not ask for authorization (it answered {challenge.status_code}): "
                              "it cannot take each person's own account")
        resource_metadata = _first_document(client, build_protected_resource_metadata_discovery_urls(
            extract_resource_metadata_from_www_auth(challenge), server_url), ProtectedResourceMetadata)
        if resource_metadata is None:
            raise OAuthFailed("the server publishes no protected-resource metadata (RFC 9728)")
        resource = str(resource_metadata.resource)
        if not check_resource_allowed(resource_url_from_server_url(server_url), resource):
            raise OAuthFailed(f"the server's metadata names another resource ({resource})")
        if not resource_metadata.authorization_servers:
            raise OAuthFailed("the server's metadata names no authorization server")
        issuer = str(resource_metadata.authorization_servers[0])
        metadata = _first_document(
            client, build_oauth_authorization_server_metadata_discovery_urls(issuer, server_url), OAuthMetadata)
    if metadata is None:
        raise OAuthFailed(f"the authorization server {issuer} publishes no metadata (RFC 8414)")
    if str(metadata.issuer).rstrip("/") != issuer.rstrip("/"):
        raise OAuthFailed(f"the authorization server's metadata names another issuer ({metadata.issuer})")
    if "code" not in metadata.response_types_supported:
        raise OAuthFailed("the authorization server offers no authorization code flow")
    if "S256" not in (metadata.code_challenge_methods_supported or []):
        raise OAuthFailed("the authorization server does not support PKCE with S256")
    scopes = extract_scope_from_www_auth(challenge) or " ".join(resource_metadata.scopes_supported or [])
    return AuthServer(
        issuer=str(metadata.issuer),
        authorization_endpoint=checked_endpoint("authorization endpoint", metadata.authorization_endpoint),
        token_endpoint=checked_endpoint("token endpoint", metadata.token_endpoint),
        registration_endpoint=checked_endpoint("registration endpoint", metadata.registration_endpoint),
        revocation_endpoint=checked_endpoint("revocation endpoint", metadata.revocation_endpoint),
        resource=resource, scopes=scopes,
        client_id_documents=bool(getattr(metadata, "client_id_metadata_document_supported", False)),
        issuer_in_response=bool(metadata.authorization_response_iss_parameter_supported))


def client_for(auth: AuthServer, stored: dict | None) -> tuple[dict, dict | None]:
    """The client to use at `auth` and, when it was registered now, what to store: (client, to_store).
    `stored` is the server's `oauth_client`: the operator's (no "issuer") or a registration's (its issuer)."""
    if stored and stored.get("client_id") and stored.get("issuer", auth.issuer) == auth.issuer:
        return stored, None
    document = client_document_url()
    if auth.client_id_documents and document.startswith("https://"):
        return {"client_id": document, "issuer": auth.issuer}, None
    if not auth.registration_endpoint:
        raise OAuthFailed("the authorization server allows no registration: an operator enters a client id "
                          "registered there")
    with _client() as client:
        response = _request(client, "POST", auth.registration_endpoint, json=client_metadata())
    document = _json(response) if response.status_code in (200, 201) else None
    if not document or not isinstance(document.get("client_id"), str):
        raise OAuthFailed(f"the authorization server refused to register Toolkeeper ({response.status_code})")
    registered = {"client_id": document["client_id"], "issuer": auth.issuer}
    if isinstance(document.get("client_secret"), str):
        registered["client_secret"] = document["client_secret"]
    return registered, registered


@dataclass(frozen=True)
class Authorization:
    url: str
    state: str
    verifier: str


def authorization_start(auth: AuthServer, client: dict, *, scopes: str) -> Authorization:
    """Where to send the person's browser: the authorization code request with PKCE (S256), its state and the
    `resource` the token is for."""
    state = secrets.token_urlsafe(32)
    verifier = secrets.token_urlsafe(64)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    query = {"response_type": "code", "client_id": client["client_id"], "redirect_uri": redirect_uri(),
             "state": state, "code_challenge": challenge, "code_challenge_method": "S256"}
    if auth.resource:
        query["resource"] = auth.resource
    if scopes:
        query["scope"] = scopes
    separator = "&" if "?" in auth.authorization_endpoint else "?"
    return Authorization(url=f"{auth.authorization_endpoint}{separator}{urlencode(query)}", state=state,
                         verifier=verifier)


@dataclass(frozen=True)
class Tokens:
    access_token: str
    refresh_token: str
    expires_in: float | None
    scope: str


def _token_request(token_endpoint: str, client: dict, form: dict) -> Tokens:
    # An operator's provider may name no resource (RFC 8707 is optional there): the parameter is then left out.
    form = {**{name: value for name, value in form.items() if value}, "client_id": client["client_id"]}
    auth = None
    if client.get("client_secret"):
        auth = httpx2.BasicAuth(client["client_id"], client["client_secret"])
        form.pop("client_id")
    with _client() as http:
        response = _request(http, "POST", token_endpoint, data=form, auth=auth,
                            headers={"Accept": "application/json"})
    document = _json(response)
    if response.status_code != 200 or document is None:
        code = (document or {}).get("error") if isinstance((document or {}).get("error"), str) else ""
        if code == "invalid_grant":
            raise GrantRefused("the authorization server no longer honours the grant")
        raise OAuthFailed(f"the authorization server refused the token request ({response.status_code}"
                          f"{', ' + code[:40] if code else ''})")
    access = document.get("access_token")
    if not isinstance(access, str) or not access or str(document.get("token_type", "")).lower() != "bearer":
        raise OAuthFailed("the authorization server's answer holds no bearer access token")
    expires_in = document.get("expires_in")
    refresh = document.get("refresh_token")
    return Tokens(access_token=access, refresh_token=refresh if isinstance(refresh, str) else "",
                  expires_in=float(expires_in) if isinstance(expires_in, int | float) and expires_in > 0 else None,
                  scope=document["scope"] if isinstance(document.get("scope"), str) else "")


def code_exchange(*, token_endpoint: str, client: dict, code: str, verifier: str, resource: str) -> Tokens:
    return _token_request(token_endpoint, client, {"grant_type": "authorization_code", "code": code,
                                                   "redirect_uri": redirect_uri(), "code_verifier": verifier,
                                                   "resource": resource})


def token_refresh(*, token_endpoint: str, client: dict, refresh_token: str, resource: str) -> Tokens:
    return _token_request(token_endpoint, client, {"grant_type": "refresh_token", "refresh_token": refresh_token,
                                                   "resource": resource})


def client_credentials(*, token_endpoint: str, client: dict, scopes: str, resource: str) -> Tokens:
    """A token of the client's own, a service account's (RFC 6749 §4.4): the client authenticates with its
    secret, no person takes part."""
    return _token_request(token_endpoint, client, {"grant_type": "client_credentials", "scope": scopes,
                                                   "resource": resource})


def token_revoke(*, revocation_endpoint: str, client: dict, token: str, hint: str) -> bool:
    """Ask the authorization server to end the grant (RFC 7009); whether it said yes."""
    form = {"token": token, "token_type_hint": hint, "client_id": client["client_id"]}
    auth = None
    if client.get("client_secret"):
        auth = httpx2.BasicAuth(client["client_id"], client["client_secret"])
        form.pop("client_id")
    try:
        with _client() as http:
            return _request(http, "POST", revocation_endpoint, data=form, auth=auth).status_code == 200
    except OAuthFailed:
        return False
