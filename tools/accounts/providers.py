"""OAuth providers of HTTP tools (docs/accounts.md): an authorization server an operator configures by hand (an
HTTP API publishes no MCP discovery), the client Toolkeeper is registered as there, and whose account the HTTP
tools that name the provider act as: each person's own (`person`: authorization code with PKCE, connected on the
"Your accounts" page) or one service account (`service`: client credentials).

Its tokens go only to URLs under its `api_url` (`url_under`): an HTTP tool that names it must call there, checked
when the tool is saved and again at every call, so whoever may edit a tool (an operator) cannot send people's
tokens, or the service account's, to another host; only an admin sets where they may go. Every address is a
tenant's input: checked by the outbound guard when saved (and at every connection), HTTPS
unless its host is one the platform admin opened. The client is write-only and encrypted. Changing what a grant
was made for (the endpoints, the issuer, the resource, the client, the mode; the scopes, for a service account)
ends the provider's accounts, revoked upstream where it offers revocation. A provider named by HTTP tools cannot
be deleted.
"""
from __future__ import annotations

import re
from urllib.parse import urlsplit

from django.db import transaction
from django.db.models import RestrictedError

from audit.services import audit_record
from common.errors import Conflict, ServiceError
from common.outbound import OutboundRefused, check_url
from common.secrets import SecretUnreadable
from tools.accounts import oauth, vault
from tools.models import AccountMode, OAuthProvider

NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,22}[a-z0-9])?")
NAME_RULE = "1-24 lowercase letters, digits or '-', starting and ending with a letter or digit"
MODES = (AccountMode.PERSON, AccountMode.SERVICE)
URL_MAX = 2000
ENDPOINT_FIELDS = ("authorization_endpoint", "token_endpoint", "revocation_endpoint")
FIELDS = ("name", "accounts", "api_url", "issuer", *ENDPOINT_FIELDS, "resource", "scopes", "client")
# A change of these ends the accounts: the grants were made for what the provider was.
GRANT_FIELDS = ("accounts", "issuer", *ENDPOINT_FIELDS, "resource", "client")


def url_under(url: str, base: str) -> bool:
    """Whether `url` is `base` or below it: the same scheme and host (case aside), and a path that continues
    `base`'s at a segment boundary (`https://api.example/v1` covers `/v1/items`, not `/v1x`)."""
    if not base:
        return False
    split, root = urlsplit(url), urlsplit(base)
    if (split.scheme.lower(), split.netloc.lower()) != (root.scheme.lower(), root.netloc.lower()):
        return False
    prefix = root.path.rstrip("/")
    return split.path == prefix or split.path.startswith(prefix + "/") or (not prefix and not split.path)


def _address_problem(url: str, what: str) -> str | None:
    if len(url) > URL_MAX:
        return f"at most {URL_MAX} characters"
    try:
        check_url(url)
        oauth.checked_endpoint(what, url)
    except OutboundRefused as exc:
        return str(exc)
    except oauth.OAuthFailed as exc:
        return f"{exc} (plain HTTP only to a host the platform admin allows)"
    return None


def _stored_client(provider: OAuthProvider | None) -> dict | None:
    if provider is None:
        return None
    try:
        return dict(provider.client or {})
    except SecretUnreadable:
        return None  # unreadable: the operator enters it again


def provider_check(tenant, changes: dict, provider: OAuthProvider | None = None) -> dict:
    """The provider's fields after `changes`, checked whole; ServiceError naming each refused field."""
    unknown = set(changes) - set(FIELDS)
    if unknown:
        raise ServiceError({name: ["not a field of an OAuth provider"] for name in sorted(unknown)})
    current = ({name: getattr(provider, name) for name in FIELDS if name != "client"} if provider is not None else
               {"name": "", "accounts": AccountMode.PERSON, "api_url": "", "issuer": "", "authorization_endpoint": "",
                "token_endpoint": "", "revocation_endpoint": "", "resource": "", "scopes": ""})
    values = {**current, "client": _stored_client(provider), **changes}
    errors: dict = {}
    name = values["name"]
    if not isinstance(name, str) or not NAME.fullmatch(name):
        errors["name"] = [NAME_RULE]
    elif OAuthProvider.objects.for_tenant(tenant).filter(name=name).exclude(
            pk=provider.pk if provider else None).exists():
        errors["name"] = ["an OAuth provider of this name exists"]
    if values["accounts"] not in MODES:
        errors["accounts"] = [f"one of: {', '.join(MODES)}"]
    for field in ("api_url", "issuer", *ENDPOINT_FIELDS, "resource"):
        value = values[field]
        if not isinstance(value, str):
            errors[field] = ["a URL, or empty"]
        elif value and (problem := _address_problem(value, field.replace("_", " "))):
            errors[field] = [problem]
    for field in ("api_url", "token_endpoint"):
        if not values[field] and field not in errors:
            errors[field] = ["required"]
    if provider is not None and "api_url" not in errors and values["api_url"] != provider.api_url:
        outside = sorted(endpoint.tool.name for endpoint in provider.endpoints.select_related("tool")
                         if not url_under(endpoint.url_template, values["api_url"]))
        if outside:
            errors["api_url"] = [f"HTTP tools that use it call outside it ({', '.join(outside[:10])}): change "
                                 "their URLs first"]
    person = values["accounts"] == AccountMode.PERSON
    if person and not values["authorization_endpoint"] and "authorization_endpoint" not in errors:
        errors["authorization_endpoint"] = ["each person's own account is authorized there: required"]
    if not person and values["authorization_endpoint"] and "accounts" not in errors:
        errors["authorization_endpoint"] = ["a service account is authorized by client credentials: leave it empty"]
    if problem := oauth.scopes_problem(values["scopes"]):
        errors["scopes"] = [problem]
    client = values["client"]
    if client is None:
        errors["client"] = ["the client registered for Toolkeeper there: {\"client_id\", \"client_secret\"?}"]
    elif problem := oauth.client_problem(client):
        errors["client"] = [problem]
    elif not person and not client.get("client_secret"):
        errors["client"] = ["a service account's client authenticates with its client_secret"]
    if errors:
        raise ServiceError(errors)
    return values


def _described(values: dict) -> dict:
    """What the audit log may hold: never the client's secret."""
    return {**{name: values[name] for name in FIELDS if name != "client"}, "client_id": values["client"]["client_id"]}


@transaction.atomic
def provider_create(*, tenant, actor=None, **fields) -> OAuthProvider:
    values = provider_check(tenant, fields)
    provider = OAuthProvider.objects.create(tenant=tenant, **values)
    audit_record(tenant=tenant, actor=actor, verb="oauth_provider.created", target=f"oauth_provider:{provider.name}",
                 data=_described(values))
    return provider


@transaction.atomic
def provider_update(*, provider: OAuthProvider, actor=None, **changes) -> OAuthProvider:
    """Change any field; `client`, when given, replaces the stored one whole."""
    before = {**{name: getattr(provider, name) for name in FIELDS if name != "client"},
              "client": _stored_client(provider)}
    values = provider_check(provider.tenant, changes, provider)
    changed = sorted(name for name in FIELDS if values[name] != before[name])
    ending = [name for name in changed if name in GRANT_FIELDS
              or (name == "scopes" and values["accounts"] == AccountMode.SERVICE)]
    old_name = provider.name
    # ended before the change is saved: a revocation after the commit uses the client the grants were made with
    ended = vault.upstream_accounts_end(upstream=provider, reason="provider_changed") if ending else 0
    for name, value in values.items():
        setattr(provider, name, value)
    provider.save()
    audit_record(tenant=provider.tenant, actor=actor, verb="oauth_provider.updated",
                 target=f"oauth_provider:{old_name}",
                 data={"fields": changed, "accounts_ended": ended, **_described(values)})
    return provider


@transaction.atomic
def provider_delete(*, provider: OAuthProvider, actor=None) -> None:
    """Refused while HTTP tools name it; its accounts end (revoked upstream) with it."""
    tools = sorted(provider.endpoints.values_list("tool__name", flat=True))
    if tools:
        raise Conflict(f"HTTP tools call with it ({', '.join(tools[:10])}{', …' if len(tools) > 10 else ''}): "
                       "give them another provider or none first")
    ended = vault.upstream_accounts_end(upstream=provider, reason="provider_deleted")
    audit_record(tenant=provider.tenant, actor=actor, verb="oauth_provider.deleted",
                 target=f"oauth_provider:{provider.name}", data={"accounts_ended": ended})
    try:
        provider.delete()
    except RestrictedError:  # a tool was given it meanwhile
        raise Conflict("an HTTP tool was given this provider meanwhile: give it another provider or none "
                       "first") from None
