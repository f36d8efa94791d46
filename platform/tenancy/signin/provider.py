"""The deployment's OpenID provider, as a client of it (authlib): discovery from the issuer, the authorization
code flow with PKCE (S256), and the ID token's signature, issuer, audience, expiry and nonce checked."""
from __future__ import annotations

import time

from authlib.integrations.django_client import OAuth
from django.conf import settings
from django.core.cache import cache
from joserfc import jwt
from joserfc.errors import InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet

NAME = "provider"


class ProviderUnreachable(Exception):
    """The provider's metadata could not be read, or names another issuer than the one configured."""


def sso_enabled() -> bool:
    return bool(settings.TOOLKEEPER_OIDC_ISSUER)


def sso_name() -> str:
    return settings.TOOLKEEPER_OIDC_NAME


_clients: dict[tuple, object] = {}  # by configuration: a test's changed settings get a client of their own


def _client():
    config = (settings.TOOLKEEPER_OIDC_ISSUER, settings.TOOLKEEPER_OIDC_CLIENT_ID,
              settings.TOOLKEEPER_OIDC_CLIENT_SECRET, settings.TOOLKEEPER_OIDC_SCOPES)
    client = _clients.get(config)
    if client is None:
        issuer, client_id, secret, scopes = config
        client = OAuth().register(
            NAME, client_id=client_id, client_secret=secret or None,
            server_metadata_url=f"{issuer}/.well-known/openid-configuration",
            client_kwargs={"scope": scopes, "code_challenge_method": "S256",
                           "default_timeout": settings.TOOLKEEPER_OIDC_TIMEOUT_S})
        _clients[config] = client
    return client


def provider():
    """The client of the configured provider, its metadata read (once per process, and again after a failure)."""
    client = _client()
    try:
        metadata = client.load_server_metadata()
    except Exception as exc:  # requests' errors, a body that is no JSON
        raise ProviderUnreachable(type(exc).__name__) from exc
    if str(metadata.get("issuer", "")).rstrip("/") != settings.TOOLKEEPER_OIDC_ISSUER:
        client.server_metadata.clear()
        raise ProviderUnreachable("its metadata names another issuer")
    return client


def id_token_options() -> dict:
    """The ID token's issuer must be the configured one (not merely the one the metadata names)."""
    issuer = settings.TOOLKEEPER_OIDC_ISSUER
    return {"iss": {"essential": True, "values": [issuer, f"{issuer}/"]}, "sub": {"essential": True}}


def _decoded(token: str):
    """A JWT of the provider's, its signature checked with the provider's keys (read again once if it names a key
    not yet seen)."""
    client = provider()
    algorithms = [a for a in client.server_metadata.get("id_token_signing_alg_values_supported") or ["RS256"]
                  if a != "none"]
    try:
        try:
            return jwt.decode(token, KeySet.import_key_set(client.fetch_jwk_set()), algorithms=algorithms)
        except InvalidKeyIdError:  # the provider rolled its keys
            return jwt.decode(token, KeySet.import_key_set(client.fetch_jwk_set(force=True)), algorithms=algorithms)
    except (JoseError, ValueError, TypeError) as exc:
        raise TokenRefused(f"the token does not verify ({type(exc).__name__})") from None


class TokenRefused(Exception):
    """A token of the provider's that does not verify, or is not one this deployment takes."""


def id_token_user(token: str) -> str:
    """The person an app's end user's ID token vouches for (their verified email address): the provider's
    signature, its issuer, an audience the deployment trusts (`TOOLKEEPER_OIDC_ID_TOKEN_AUDIENCES`, by default
    the console's own client), not expired. TokenRefused otherwise; ProviderUnreachable when the provider's keys
    cannot be read."""
    if not isinstance(token, str) or not token or len(token) > 16_000:
        raise TokenRefused("an ID token is a compact JWT")
    claims = _decoded(token).claims
    audience = claims.get("aud")
    audiences = set(audience if isinstance(audience, list) else [audience])
    trusted = set(settings.TOOLKEEPER_OIDC_ID_TOKEN_AUDIENCES or [settings.TOOLKEEPER_OIDC_CLIENT_ID])
    now = time.time()
    problems = [
        str(claims.get("iss", "")).rstrip("/") != settings.TOOLKEEPER_OIDC_ISSUER and "another issuer",
        not audiences & trusted and "an audience this deployment does not trust",
        not isinstance(claims.get("exp"), int | float) and "no expiry",
        isinstance(claims.get("exp"), int | float) and claims["exp"] < now - 60 and "expired",
        not isinstance(claims.get("email"), str) and "no email address",
        claims.get("email_verified") is not True and not settings.TOOLKEEPER_OIDC_TRUST_UNVERIFIED_EMAIL
        and "an email address the provider has not verified",
    ]
    if refused := [p for p in problems if p]:
        raise TokenRefused(", ".join(refused))
    return claims["email"].strip()[:200]


BACKCHANNEL_EVENT = "http://schemas.openid.net/event/backchannel-logout"
LOGOUT_TOKEN_LEEWAY_S = 300


class LogoutTokenRefused(Exception):
    """A logout token that does not verify (OpenID Connect Back-Channel Logout 1.0, 2.6)."""


def logout_token_claims(token: str) -> dict:
    """The verified claims of a logout token the provider posted: its signature (the provider's keys), issuer,
    audience (our client), age, the back-channel logout event, a subject or session, and no nonce; its `jti`
    only once."""
    try:
        claims = _decoded(token).claims
    except TokenRefused as exc:
        raise LogoutTokenRefused(str(exc)) from None
    audience = claims.get("aud")
    audiences = audience if isinstance(audience, list) else [audience]
    now = time.time()
    problems = [
        str(claims.get("iss", "")).rstrip("/") != settings.TOOLKEEPER_OIDC_ISSUER and "another issuer",
        settings.TOOLKEEPER_OIDC_CLIENT_ID not in audiences and "another audience",
        not isinstance(claims.get("iat"), int | float) and "no iat",
        isinstance(claims.get("iat"), int | float) and abs(now - claims["iat"]) > LOGOUT_TOKEN_LEEWAY_S and "too old",
        isinstance(claims.get("exp"), int | float) and claims["exp"] < now - 60 and "expired",
        not (isinstance(claims.get("events"), dict) and isinstance(claims["events"].get(BACKCHANNEL_EVENT), dict))
        and "not a logout event",
        "nonce" in claims and "a nonce",
        not (isinstance(claims.get("sub"), str) or isinstance(claims.get("sid"), str)) and "no sub or sid",
        not isinstance(claims.get("jti"), str) and "no jti",
    ]
    if refused := [p for p in problems if p]:
        raise LogoutTokenRefused(", ".join(refused))
    if not cache.add(f"tk:logout-jti:{claims['jti'][:200]}", 1, timeout=2 * LOGOUT_TOKEN_LEEWAY_S):
        raise LogoutTokenRefused("this token was used already")
    return claims
