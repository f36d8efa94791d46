"""The token vault (docs/accounts.md): each person's own tokens at an upstream, how they are connected, used,
refreshed and ended. An upstream is an MCP server (`accounts: person`) or an HTTP tools' OAuth provider
(`tools.accounts.providers`): its `person` accounts are connected as a server's are, from the operator's
configuration instead of discovery; its `service` account is the provider's client's own, got by client
credentials when a call first needs it and again when it expires, under the same one-refresh-in-flight rule.

- **Connecting** is two steps of the person's browser: `connect_start` discovers the server's authorization
  server, picks the client (`tools.accounts.oauth.client_for`) and says where to go; what the callback needs
  (the state, the PKCE verifier, who started it and where) stays in the person's own console session, so the
  callback (`connect_finish`) completes only for the same person, the same tenant and the same server.
- **Using**: `call_token` gives a call its verified person's access token, refreshed first when it is close to
  its expiry, or when the upstream refused it before (`token_refused`). One refresh is in flight per account
  across processes: a conditional update of
  `refresh_started_at` elects the process that refreshes; the others wait for its result. A refresh the
  authorization server refuses ends the account (the person connects again).
- **Ending**: a disconnect, a member leaving the tenant or the server going away revokes the grant upstream
  where the authorization server offers revocation, and deletes the tokens.
- **Audit**: `upstream_account.connected`, `.disconnected` (with the number of refreshes), `.failed`; each
  refresh is counted on the account, not recorded on its own.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from audit.services import audit_record
from common.errors import ServiceError
from common.secrets import SecretUnreadable
from tenancy.models import Membership, Role
from tools.accounts import oauth
from tools.models import AccountMode, McpServer, McpTransport, OAuthProvider, UpstreamAccount

logger = logging.getLogger("toolkeeper.accounts")

REFRESH_MARGIN_S = 60.0  # refresh this long before expiry (at most half of the token's life)
REFRESH_LEASE_S = 30.0  # a refresh started longer ago than this is taken for dead, and another may start
REFRESH_WAIT_S = 15.0  # how long a call waits for another process's refresh
# A token refused upstream is renewed only if it is older than this: an agent that steers a call at a route that
# always answers 401 cannot make every call a round trip to the authorization server.
REFUSED_RENEWAL_AFTER_S = 30.0
PENDING_MAX_AGE_S = 600  # the person has this long at the authorization server
PENDING_KEY = "toolkeeper.upstream_connect"
LISTING_ROLES = (Role.ADMIN, Role.OPERATOR)
ACCOUNT_RELATED = ("mcp_server__tenant", "oauth_provider__tenant", "user")
UPSTREAM_KINDS = {"mcp": McpServer, "http": OAuthProvider}


class AccountNeeded(Exception):
    """The call cannot act as its person upstream; `error_type` says why, the text says what to do."""

    def __init__(self, message: str, *, error_type: str, connect_url: str = ""):
        super().__init__(message)
        self.error_type = error_type
        self.connect_url = connect_url


def _kind(upstream) -> str:
    return "mcp" if isinstance(upstream, McpServer) else "http"


def upstream_named(upstream) -> str:
    """The upstream as people read it in a message."""
    return f"the MCP server {upstream.name!r}" if isinstance(upstream, McpServer) else \
        f"the HTTP API of OAuth provider {upstream.name!r}"


def connect_url(upstream) -> str:
    """The page where a person connects their account at `upstream` (absolute: it goes into error texts)."""
    path = reverse("console:upstream_accounts", kwargs={"tenant": upstream.tenant.slug})
    marked = upstream.name if isinstance(upstream, McpServer) else f"http:{upstream.name}"
    return f"{settings.TOOLKEEPER_PUBLIC_URL.rstrip('/')}{path}?{urlencode({'connect': marked})}"


def person_upstreams(tenant) -> list:
    """The tenant's MCP servers and HTTP tools' providers whose calls act as each person's own account."""
    return [*McpServer.objects.for_tenant(tenant).filter(accounts=AccountMode.PERSON).order_by("name"),
            *OAuthProvider.objects.for_tenant(tenant).filter(accounts=AccountMode.PERSON).order_by("name")]


def _is_member(tenant_id: int, user_id: int | None) -> bool:
    return user_id is not None and Membership.objects.filter(tenant_id=tenant_id, user_id=user_id,
                                                             user__is_active=True).exists()


# --- connecting ------------------------------------------------------------------------------------

def _connectable(upstream) -> None:
    if upstream.accounts != AccountMode.PERSON:
        whose = "a service account" if upstream.accounts == AccountMode.SERVICE else "the tenant's credential"
        raise ServiceError(f"{upstream_named(upstream)} is called with {whose}: there is no account of yours to "
                           "connect")
    if isinstance(upstream, McpServer):
        if not upstream.enabled:
            raise ServiceError("the server is disabled")
        if upstream.transport not in (McpTransport.STREAMABLE_HTTP, McpTransport.SSE):
            raise ServiceError("only an HTTP server can take each person's own account")


def _stored_client(upstream) -> dict | None:
    try:
        stored = upstream.oauth_client if isinstance(upstream, McpServer) else upstream.client
    except SecretUnreadable:
        return None  # registered again (or the operator enters it again)
    return dict(stored) if stored else None


def _failed(upstream, user, stage: str, exc: Exception) -> ServiceError:
    audit_record(tenant=upstream.tenant, actor=user, verb="upstream_account.failed", target=_target(upstream),
                 data={"stage": stage, "error": str(exc)[:300]})
    return ServiceError(f"connecting to {upstream.name} failed: {exc}")


def _target(upstream) -> str:
    return f"{'mcp_server' if isinstance(upstream, McpServer) else 'oauth_provider'}:{upstream.name}"


def _version(upstream) -> str:
    """What a connection under way was started against: a provider's last change (a server's discovery is its
    own: what changes it ends the accounts, and a sync must not stop a person connecting)."""
    return upstream.updated_at.isoformat() if isinstance(upstream, OAuthProvider) else ""


def _configured(provider: OAuthProvider) -> oauth.AuthServer:
    """An HTTP tools' provider as discovery would have found it: what the operator entered."""
    return oauth.AuthServer(
        issuer=provider.issuer, authorization_endpoint=provider.authorization_endpoint,
        token_endpoint=provider.token_endpoint, registration_endpoint="",
        revocation_endpoint=provider.revocation_endpoint, resource=provider.resource, scopes=provider.scopes,
        client_id_documents=False, issuer_in_response=False)


def _authorization_server(upstream, user) -> tuple[oauth.AuthServer, dict]:
    if isinstance(upstream, OAuthProvider):
        client = _stored_client(upstream)
        if client is None:
            raise _failed(upstream, user, "client", oauth.OAuthFailed("its client cannot be read with the platform's "
                                                                      "keys: an operator enters it again"))
        return _configured(upstream), client
    try:
        auth = oauth.discover(upstream.url, transport=upstream.transport)
        client, registered = oauth.client_for(auth, _stored_client(upstream))
    except oauth.OAuthFailed as exc:
        raise _failed(upstream, user, "discovery", exc) from None
    if registered is not None:  # kept for the next person: one registration per server and issuer
        upstream.oauth_client = registered
        McpServer.objects.for_tenant(upstream.tenant_id).filter(pk=upstream.pk).update(oauth_client=registered)
    return auth, client


def connect_start(*, upstream, user, session_store) -> str:
    """Begin connecting `user`'s account at `upstream`: the authorization URL to send their browser to. What the
    callback needs is kept in `session_store` (the person's console session)."""
    _connectable(upstream)
    auth, client = _authorization_server(upstream, user)
    scopes = (upstream.oauth_scopes or auth.scopes) if isinstance(upstream, McpServer) else upstream.scopes
    authorization = oauth.authorization_start(auth, client, scopes=scopes)
    pending = dict(session_store.get(PENDING_KEY) or {})
    now = time.time()
    pending = {state: entry for state, entry in pending.items() if now - entry["at"] < PENDING_MAX_AGE_S}
    pending[authorization.state] = {"at": now, "tenant": upstream.tenant_id, "kind": _kind(upstream),
                                    "upstream": upstream.pk, "user": user.pk, "version": _version(upstream),
                                    "verifier": authorization.verifier, "client_id": client["client_id"],
                                    "auth": auth.to_json()}
    session_store[PENDING_KEY] = dict(list(pending.items())[-5:])  # a few connections under way at most
    return authorization.url


@dataclass(frozen=True)
class Connected:
    account: UpstreamAccount
    tenant_slug: str


def _pending(session_store, state: str, user) -> dict:
    pending = dict(session_store.get(PENDING_KEY) or {})
    entry = pending.pop(state, None) if isinstance(state, str) else None
    session_store[PENDING_KEY] = pending  # a state is used once, whatever comes of it
    if entry is None or time.time() - entry["at"] >= PENDING_MAX_AGE_S:
        raise ServiceError("this answer of the authorization server is not one this browser asked for, or it came "
                           "too late: connect again")
    if entry["user"] != user.pk:
        raise ServiceError("this connection was started by someone else")
    return entry


def connect_finish(*, user, session_store, state: str, code: str | None, error: str | None,
                   issuer: str | None) -> Connected:
    """The authorization server's answer at the callback: the tokens stored for the person who started it."""
    entry = _pending(session_store, state, user)
    model = UPSTREAM_KINDS.get(entry.get("kind"), McpServer)
    upstream = model.objects.select_related("tenant").filter(pk=entry["upstream"], tenant_id=entry["tenant"]).first()
    if upstream is None or not _is_member(entry["tenant"], user.pk):
        raise ServiceError("the upstream or your membership of its tenant is gone")
    _connectable(upstream)
    server = upstream if isinstance(upstream, McpServer) else None
    auth = oauth.AuthServer.from_json(entry["auth"])
    if entry.get("version") != _version(upstream):  # its accounts ended with the change: this grant would too
        raise ServiceError("the provider was changed meanwhile: connect again")
    if error or not code:
        refused = "you declined" if error == "access_denied" else "the authorization server gave no code"
        raise _failed(upstream, user, "authorization", oauth.OAuthFailed(refused))
    # An operator's provider without an issuer cannot check one (RFC 9207 is then the provider's to ignore).
    if auth.issuer and ((issuer is not None and issuer != auth.issuer) or (issuer is None and auth.issuer_in_response)):
        raise _failed(upstream, user, "authorization", oauth.OAuthFailed("the answer came from another issuer"))
    stored = _stored_client(upstream) or {}
    client = stored if stored.get("client_id") == entry["client_id"] else {"client_id": entry["client_id"]}
    try:
        tokens = oauth.code_exchange(token_endpoint=auth.token_endpoint, client=client, code=code,
                                     verifier=entry["verifier"], resource=auth.resource)
    except oauth.OAuthFailed as exc:
        raise _failed(upstream, user, "token", exc) from None
    with transaction.atomic():
        previous = _accounts_at(upstream).filter(user=user).first()
        if previous is not None:
            previous.delete()  # connecting again replaces the grant (the old one is revoked below)
        account = UpstreamAccount.objects.create(
            tenant=upstream.tenant, user=user, mcp_server=server,
            oauth_provider=upstream if server is None else None, issuer=auth.issuer,
            tokens={"access_token": tokens.access_token, "refresh_token": tokens.refresh_token},
            token_endpoint=auth.token_endpoint, revocation_endpoint=auth.revocation_endpoint,
            client_id=client["client_id"], resource=auth.resource, scope=tokens.scope, expires_at=_expiry(tokens))
        listing = server is not None and server.listing_account_id is None and Membership.objects.filter(
            tenant_id=server.tenant_id, user=user, role__in=LISTING_ROLES).exists()
        if listing:  # an operator's connection lists the tools until another operator's takes over
            McpServer.objects.for_tenant(server.tenant_id).filter(pk=server.pk).update(listing_account=account)
        audit_record(tenant=upstream.tenant, actor=user, verb="upstream_account.connected",
                     target=_target(upstream), data={"issuer": auth.issuer, "scope": tokens.scope,
                                                     "lists_tools": listing, "replaced": previous is not None})
    if previous is not None:
        _revoke_upstream(previous)
    return Connected(account=account, tenant_slug=upstream.tenant.slug)


def _upstream_field(upstream) -> str:
    return "mcp_server" if isinstance(upstream, McpServer) else "oauth_provider"


def _accounts_at(upstream):
    return UpstreamAccount.objects.for_tenant(upstream.tenant_id).select_related(*ACCOUNT_RELATED).filter(
        **{_upstream_field(upstream): upstream})


def _account_at(upstream, **filters) -> UpstreamAccount | None:
    """One account at `upstream`, which it is given as its upstream: a call's path joins nothing (compiling the
    joins of every relation cost more than the query itself)."""
    field = _upstream_field(upstream)
    # at most one row (the constraints): no ordering to compile
    found = list(UpstreamAccount.objects.for_tenant(upstream.tenant_id)
                 .filter(**{f"{field}_id": upstream.pk}, **filters).order_by()[:1])
    if not found:
        return None
    setattr(found[0], field, upstream)
    return found[0]


def _expiry(tokens: oauth.Tokens):
    return timezone.now() + timedelta(seconds=tokens.expires_in) if tokens.expires_in else None


# --- using -----------------------------------------------------------------------------------------

def _needs_refresh(account: UpstreamAccount) -> bool:
    if account.expires_at is None:
        return False
    issued = account.refreshed_at or account.connected_at
    margin = min(REFRESH_MARGIN_S, max(0.0, (account.expires_at - issued).total_seconds()) / 2)
    return account.expires_at - timezone.now() <= timedelta(seconds=margin)


def _client_of(account: UpstreamAccount) -> dict:
    stored = _stored_client(account.upstream) or {}
    return stored if stored.get("client_id") == account.client_id else {"client_id": account.client_id}


def _reconnect(account: UpstreamAccount, why: str) -> AccountNeeded:
    upstream = account.upstream
    return AccountNeeded(f"your account at {upstream_named(upstream)} {why}: connect it again at "
                         f"{connect_url(upstream)}", error_type="AccountNotConnected",
                         connect_url=connect_url(upstream))


def _whose(account: UpstreamAccount) -> str:
    return account.user.get_username() if account.user_id else "service account"


def _refresh(account: UpstreamAccount, started) -> str:
    """A fresh access token: the refresh token's, or a service account's client credentials'."""
    tokens = account.tokens
    upstream = account.upstream
    try:
        if account.user_id is None:
            fresh = oauth.client_credentials(token_endpoint=account.token_endpoint, client=_client_of(account),
                                             scopes=upstream.scopes, resource=account.resource)
        else:
            fresh = oauth.token_refresh(token_endpoint=account.token_endpoint, client=_client_of(account),
                                        refresh_token=tokens["refresh_token"], resource=account.resource)
    except oauth.OAuthFailed as exc:
        if isinstance(exc, oauth.GrantRefused) and account.user_id is not None:
            with transaction.atomic():
                account.delete()
                audit_record(tenant=upstream.tenant, actor=None, verb="upstream_account.failed",
                             target=_target(upstream), data={"stage": "refresh", "user": _whose(account),
                                                             "error": str(exc)})
            raise _reconnect(account, "was ended by its authorization server") from None
        UpstreamAccount.objects.for_tenant(account.tenant_id).filter(
            pk=account.pk, refresh_started_at=started).update(refresh_started_at=None)
        if account.user_id is None:  # nobody else would hear of a service account's refusal
            audit_record(tenant=upstream.tenant, actor=None, verb="upstream_account.failed",
                         target=_target(upstream), data={"stage": "client_credentials", "user": _whose(account),
                                                         "error": str(exc)[:300]})
        raise
    now = timezone.now()
    account.tokens = {"access_token": fresh.access_token,
                      "refresh_token": fresh.refresh_token or tokens.get("refresh_token", "")}
    account.expires_at = _expiry(fresh)
    account.refreshed_at = now
    account.refresh_count += 1
    account.refresh_started_at = None
    if fresh.scope:
        account.scope = fresh.scope
    saved = UpstreamAccount.objects.for_tenant(account.tenant_id).filter(pk=account.pk).update(
        tokens=account.tokens, expires_at=account.expires_at, refreshed_at=now, refresh_count=account.refresh_count,
        refresh_started_at=None, scope=account.scope)
    if not saved:  # ended meanwhile (a disconnect, the provider changed): its new token is not to be used
        raise AccountNeeded("the account was ended while its token was being renewed: try again",
                            error_type="AccountNotConnected", connect_url=connect_url(upstream))
    if account.user_id is None and account.refresh_count == 1:  # a service account's first token
        audit_record(tenant=upstream.tenant, actor=None, verb="upstream_account.connected", target=_target(upstream),
                     data={"user": _whose(account), "issuer": account.issuer, "scope": account.scope,
                           "lists_tools": False, "replaced": False})
    return fresh.access_token


def account_token(account: UpstreamAccount) -> str:
    """The account's access token, refreshed first when it is close to its expiry (module docstring)."""
    deadline = time.monotonic() + REFRESH_WAIT_S
    while True:
        if not _needs_refresh(account):
            return account.tokens["access_token"]
        if account.user_id is not None and not account.tokens.get("refresh_token"):
            if account.expires_at > timezone.now():
                return account.tokens["access_token"]
            raise _reconnect(account, "has expired")
        now = timezone.now()
        elected = UpstreamAccount.objects.for_tenant(account.tenant_id).filter(pk=account.pk).filter(
            Q(refresh_started_at__isnull=True) | Q(refresh_started_at__lt=now - timedelta(seconds=REFRESH_LEASE_S)),
        ).update(refresh_started_at=now)
        if elected:
            return _refresh(account, now)
        if time.monotonic() > deadline:
            raise oauth.OAuthFailed("another process's refresh of the token did not finish")
        time.sleep(0.1)
        account = (UpstreamAccount.objects.for_tenant(account.tenant_id)
                   .select_related(*ACCOUNT_RELATED).filter(pk=account.pk).first())
        if account is None:
            raise AccountNeeded("your account was disconnected meanwhile", error_type="AccountNotConnected")


def _service_account(provider: OAuthProvider) -> UpstreamAccount:
    """The provider's service account, made (without a token yet: due at once) when a call first needs it."""
    account = _account_at(provider, user=None)
    if account is not None:
        return account
    account, _ = UpstreamAccount.objects.for_tenant(provider.tenant_id).get_or_create(
        oauth_provider=provider, user=None,
        defaults={"tenant_id": provider.tenant_id, "tokens": {"access_token": ""}, "expires_at": timezone.now(),
                  "issuer": provider.issuer, "token_endpoint": provider.token_endpoint,
                  "revocation_endpoint": provider.revocation_endpoint, "resource": provider.resource,
                  "client_id": (_stored_client(provider) or {}).get("client_id", ""), "scope": provider.scopes})
    account.oauth_provider = provider
    return account


def call_token(*, upstream, session) -> str:
    """The access token a call of `session` sends to `upstream`: a provider's service account's, or the call's
    verified person's own (AccountNeeded when there is none, with what to do)."""
    if isinstance(upstream, OAuthProvider) and upstream.accounts == AccountMode.SERVICE:
        try:
            return account_token(_service_account(upstream))
        except SecretUnreadable:
            raise oauth.OAuthFailed("the provider's client cannot be read with the platform's keys: an operator "
                                    "enters it again") from None
    person_id = session.person_id if session.user_verified else None
    if not _is_member(session.tenant_id, person_id):
        raise AccountNeeded(
            f"{upstream_named(upstream)} acts as each person's own account, and this session's user is not a "
            "verified person of the tenant (sign in through an OAuth client, or pass the user's ID token)",
            error_type="VerifiedUserRequired")
    account = _account_at(upstream, user_id=person_id)
    if account is None:
        url = connect_url(upstream)
        raise AccountNeeded(f"{upstream_named(upstream)} acts as your own account there, which you have not "
                            f"connected: connect it at {url}", error_type="AccountNotConnected", connect_url=url)
    try:
        return account_token(account)
    except SecretUnreadable:
        raise _reconnect(account, "cannot be read with the platform's keys") from None


def token_refused(*, upstream, session, token: str) -> str:
    """The upstream refused `token` before its recorded end (revoked or replaced at its authorization server):
    the account's token is taken as ended, so that one caller renews it as on expiry, and the call gets the new
    one. A caller whose token was renewed meanwhile by another gets that one without a second renewal."""
    service = isinstance(upstream, OAuthProvider) and upstream.accounts == AccountMode.SERVICE
    person_id = session.person_id if session.user_verified else None
    if service or person_id is not None:
        account = _account_at(upstream, user_id=None if service else person_id)
        try:
            current = account.tokens.get("access_token") if account is not None else None
        except SecretUnreadable:
            current = None
        recent = account is not None and account.refreshed_at is not None and (
            timezone.now() - account.refreshed_at).total_seconds() < REFUSED_RENEWAL_AFTER_S
        if current == token and not recent:  # conditional: a renewal since it was read is kept
            UpstreamAccount.objects.for_tenant(account.tenant_id).filter(
                pk=account.pk, refreshed_at=account.refreshed_at).update(expires_at=timezone.now())
    return call_token(upstream=upstream, session=session)


def listing_token(server: McpServer) -> str:
    """The token a sync lists the server's tools with: the listing account's (an operator's connection)."""
    account = (UpstreamAccount.objects.for_tenant(server.tenant_id).select_related(*ACCOUNT_RELATED)
               .filter(pk=server.listing_account_id).first() if server.listing_account_id else None)
    if account is None:
        raise oauth.OAuthFailed("each person connects their own account to this server, and no operator has "
                                "connected one to list its tools with")
    return account_token(account)


# --- ending ----------------------------------------------------------------------------------------

def _revoke_upstream(account: UpstreamAccount) -> bool:
    if not account.revocation_endpoint:
        return False
    try:
        tokens = account.tokens
    except SecretUnreadable:
        return False
    token, hint = ((tokens["refresh_token"], "refresh_token") if tokens.get("refresh_token")
                   else (tokens["access_token"], "access_token"))
    revoked = oauth.token_revoke(revocation_endpoint=account.revocation_endpoint, client=_client_of(account),
                                 token=token, hint=hint)
    if not revoked:
        logger.info("the authorization server of %s did not revoke account %s", _target(account.upstream), account.pk)
    return revoked


def account_disconnect(*, account: UpstreamAccount, actor=None, reason: str = "disconnected") -> bool:
    """End the account: revoked upstream where the server offers it, deleted here. Whether it was revoked."""
    revoked = _revoke_upstream(account)
    with transaction.atomic():
        deleted, _ = UpstreamAccount.objects.for_tenant(account.tenant_id).filter(pk=account.pk).delete()
        if deleted:
            audit_record(tenant=account.upstream.tenant, actor=actor, verb="upstream_account.disconnected",
                         target=_target(account.upstream),
                         data={"user": _whose(account), "reason": reason, "revoked": revoked,
                               "refreshes": account.refresh_count})
    return revoked


def _accounts_end(accounts, *, reason: str) -> int:
    """Deleted in the caller's transaction, revoked upstream once it commits; how many."""
    for account in accounts:
        UpstreamAccount.objects.for_tenant(account.tenant_id).filter(pk=account.pk).delete()
        audit_record(tenant=account.upstream.tenant, actor=None, verb="upstream_account.disconnected",
                     target=_target(account.upstream),
                     data={"user": _whose(account), "reason": reason,
                           "revoked": bool(account.revocation_endpoint), "refreshes": account.refresh_count})
        transaction.on_commit(lambda account=account: _revoke_upstream(account))
    return len(accounts)


def accounts_end_for(*, tenant, user, reason: str) -> int:
    """End every account `user` connected in `tenant` (they left it)."""
    return _accounts_end(UpstreamAccount.objects.for_tenant(tenant).select_related(*ACCOUNT_RELATED)
                         .filter(user=user), reason=reason)


def upstream_accounts_end(*, upstream, reason: str) -> int:
    """End every account connected at `upstream` (it goes, or what its grants were for changed)."""
    return _accounts_end(list(_accounts_at(upstream)), reason=reason)


def member_accounts_end(sender, *, tenant, user, **kwargs) -> None:
    """`tenancy.signals.member_left`: the person's accounts in the tenant end with their membership."""
    accounts_end_for(tenant=tenant, user=user, reason="membership_removed")


def listing_account_take(*, server: McpServer, user) -> UpstreamAccount:
    """Let an operator's own connection list the server's tools."""
    account = UpstreamAccount.objects.for_tenant(server.tenant_id).filter(mcp_server=server, user=user).first()
    if account is None:
        raise ServiceError("connect your account first")
    with transaction.atomic():
        McpServer.objects.for_tenant(server.tenant_id).filter(pk=server.pk).update(listing_account=account)
        audit_record(tenant=server.tenant, actor=user, verb="mcp_server.listing_account_set",
                     target=_target(server), data={"user": user.get_username()})
    return account
