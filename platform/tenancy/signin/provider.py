"""The deployment's OpenID provider, as a client of it (authlib): discovery from the issuer, the authorization
code flow with PKCE (S256), and the ID token's signature, issuer, audience, expiry and nonce checked."""
from __future__ import annotations

from authlib.integrations.django_client import OAuth
from django.conf import settings

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
