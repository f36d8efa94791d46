"""Admission: the one set of checks every entry makes before it acts on a request (docs/notes/entry-and-admission.md,
"Admission").

Every entry that takes requests from outside — the REST API, `/mcp/`, the WebSocket streams and the console's
pages that change something — calls `admit` with what it knows of the caller and, where it was sent one, the
JSON value. `admit` checks, in this order, and raises the first refusal:

1. who is calling: an API key's bearer token (or, on `/mcp/` only, an OAuth access token: its grant's key) looked
   up here, a key the entry already looked up with
   `api_key_for_token`, or a logged-in console member of the tenant; and the scope the entry needs
   (`NotAuthenticated`, 401; `NotPermitted`, 403);
2. the requests-per-minute limits of the key (or the console login) and of the tenant (`RateLimited`, 429);
3. the value: what every stored JSON value must be (`common.json_values.json_problem`: no NUL, no lone
   surrogate, no NaN or Infinity, nesting at most 64 levels) (`ValueRefused`, 400).

The URL is checked even before the caller is known, at the HTTP entry every request passes
(`tenancy.entry.bodies.BodyGuard`, with `url_problem`): a path or query parameter with a NUL reaches no lookup, where
PostgreSQL would refuse the text with an error.

Each entry turns these refusals into its own medium in one place: the API's error envelope
(`common.api.exception_handler`), an HTTP status with a JSON-RPC error on `/mcp/` (`tools.gateway.entry`),
a close code on a WebSocket (`realtime.consumers`), a page with the status in the console (`tenancy.web`).
`tests/test_entry_admission.py` walks every entry and shows each refusal there, so a new entry cannot skip one.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from rest_framework.throttling import BaseThrottle

from common import metrics
from common.errors import NotPermitted, ServiceError
from common.json_values import json_problem
from tenancy.entry.authentication import INVALID_KEY, MALFORMED_AUTHORIZATION, bearer_token
from tenancy.entry.limits import requests_admit
from tenancy.models import ApiKey, Tenant
from tenancy.selectors import apikey_from_access_token, apikey_from_token, is_access_token


class Entry(StrEnum):
    REST = "rest"
    MCP = "mcp"
    WEBSOCKET = "websocket"
    CONSOLE = "console"
    SLACK = "slack"  # a Slack interaction, admitted as the member its Slack user is linked to (approvals.slack)


class NotAuthenticated(ServiceError):
    """No valid credentials (401)."""

    status = 401
    code = "authentication_failed"


class ValueRefused(ServiceError):
    """A value that could not be stored and read back (400); `field`, the member of the object sent that holds
    the problem, when there is one."""

    def __init__(self, problem: str, *, field: str | None = None):
        super().__init__(problem)
        self.field = field

    @property
    def fields(self) -> dict:
        return {self.field: [self.detail]} if self.field is not None else {}

    @property
    def message(self) -> str:
        return f"{self.field}: {self.detail}" if self.field is not None else self.detail


NO_VALUE = object()
INVALID_TOKEN = "Invalid, expired or revoked access token."  # noqa: S105 (a message)
TOKEN_FOR_MCP = "An OAuth access token is for the MCP endpoint (/mcp/) only; use an API key here."  # noqa: S105


@dataclass(frozen=True)
class Admission:
    """Who an admitted request comes from."""

    entry: Entry
    tenant: Tenant
    api_key: ApiKey | None = None
    user: object = None


def url_problem(path: str, query_string: bytes) -> str | None:
    """Why a request's path or query cannot name anything (a NUL, which no stored text holds), or None."""
    if "\x00" in path:
        return "The path may not contain the NUL character."
    if b"%00" in query_string or b"\x00" in query_string:
        return "Query parameters may not contain the NUL character (%00)."
    return None


def api_key_for_token(authorization: str, *, entry: Entry | None = None) -> ApiKey:
    """The active API key an `Authorization: Bearer <key>` header value names; NotAuthenticated otherwise.
    On `/mcp/`, an OAuth access token of Toolkeeper's stands for its grant's key, which then names the person
    it acts for (`acting_for`); the tokens' audience is that endpoint alone, so every other entry refuses them.
    The key is marked as used (at most once a minute)."""
    token = bearer_token(authorization)
    if token is None:
        raise NotAuthenticated(MALFORMED_AUTHORIZATION)
    if is_access_token(token):
        if entry != Entry.MCP:
            raise NotAuthenticated(TOKEN_FOR_MCP)
        api_key = apikey_from_access_token(token)
        if api_key is None:
            raise NotAuthenticated(INVALID_TOKEN)
        api_key.touch()
        return api_key
    api_key = apikey_from_token(token)
    if api_key is None:
        raise NotAuthenticated(INVALID_KEY)
    api_key.touch()
    return api_key


def admit(*, entry: Entry, authorization: str | None = None, api_key: ApiKey | None = None, user=None,
          tenant: Tenant | None = None, scope: str | None = None, value=NO_VALUE) -> Admission:
    """Admit one request of `entry`, or raise the first refusal (see the module's docstring).

    The caller is an `authorization` header value, an `api_key` already found by `api_key_for_token`, or a
    console `user` whose membership of `tenant` the entry has checked. `scope`: what a key must have.
    """
    with metrics.stopwatch("admission"):  # every entry's checks, refused or not (the tool is not known yet)
        if authorization is not None:
            api_key = api_key_for_token(authorization, entry=entry)
        if api_key is not None:
            if scope is not None and not api_key.has_scope(scope):
                raise NotPermitted(f"This API key lacks the {scope} scope.")
            tenant, user = api_key.tenant, None
        elif user is None or not user.is_authenticated or tenant is None:
            raise NotAuthenticated("Authentication credentials were not provided.")
        requests_admit(tenant=tenant, api_key=api_key, user=user)
        if value is not NO_VALUE and (problem := json_problem(value)):
            raise _value_refusal(value, problem)
        return Admission(entry=entry, tenant=tenant, api_key=api_key, user=user)


def _value_refusal(value, problem: str) -> ValueRefused:
    """The refusal of a value, filed under the field of an object whose value holds the problem (400 naming the
    field, as a service would), else as it is."""
    if isinstance(value, dict):
        for key, member in value.items():
            if isinstance(key, str) and json_problem(key) is None and (inner := json_problem({key: member})):
                return ValueRefused(inner, field=key)
    return ValueRefused(problem)


class RestAdmission(BaseThrottle):
    """The REST API's call of `admit`, once DRF knows the caller (an API key, or a console login with its
    tenant) and the view's permissions passed: the request's limits and its JSON body."""

    def allow_request(self, request, view):
        tenant = getattr(request, "tenant", None)
        if tenant is None:
            return True  # not authenticated: refused by the permission check, counted nowhere
        api_key = request.auth if isinstance(request.auth, ApiKey) else None
        value = request.data if request.content_type.startswith("application/json") else NO_VALUE
        admit(entry=Entry.REST, api_key=api_key, user=None if api_key else request.user, tenant=tenant, value=value)
        return True
