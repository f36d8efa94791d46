"""People's own accounts at upstream servers, in process (docs/accounts.md): what a server's documents may say
before Toolkeeper trusts them (a stand-in on 127.0.0.1 that answers as the MCP authorization specification has a
server answer, with one thing wrong at a time), the callback bound to the person who started it, the checks of a
server's settings, and what a call without a usable account is told. The whole flow against a real upstream and
authorization server is tests/accounts/test_upstream_accounts_live.py."""
import base64

import pytest
from django.test import override_settings

from common.errors import ServiceError
from tenancy.services import membership_remove
from tests.accounts.stand_in import StandIn
from tools.accounts import oauth, vault
from tools.catalog.services import session_create
from tools.models import McpServer, UpstreamAccount
from tools.upstream.servers import mcp_server_create, mcp_server_update

LOCAL = override_settings(TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS=("127.0.0.1",))


@pytest.fixture
def person_server(world, stand_in):
    with LOCAL:
        server = mcp_server_create(tenant=world.a.tenant, name="files", transport="streamable_http",
                                   url=stand_in.resource, accounts="person")
    return server


# --- what the documents may say -----------------------------------------------------------------------

def test_discovery_follows_the_401_to_the_authorization_server(stand_in):
    with LOCAL:
        found = oauth.discover(stand_in.resource)
    assert (found.issuer, found.token_endpoint, found.resource, found.scopes) == (
        stand_in.url, f"{stand_in.url}/token", stand_in.resource, "files")
    assert [path for _, path, _ in stand_in.requests[:3]] == [
        "/mcp", "/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-authorization-server"]


@pytest.mark.parametrize(("path", "change", "refusal"), [
    ("/mcp", (200, {"jsonrpc": "2.0"}, {}), "did not ask for authorization"),
    ("/.well-known/oauth-protected-resource/mcp", (200, {"resource": "https://elsewhere.example/mcp",
                                                          "authorization_servers": ["https://as.example"]}, {}),
     "names another resource"),
    ("/.well-known/oauth-authorization-server", "issuer", "names another issuer"),
    ("/.well-known/oauth-authorization-server", "pkce", "PKCE"),
    ("/.well-known/oauth-authorization-server", "plain-http", "not an HTTPS address"),
])
def test_discovery_refuses_documents_that_do_not_hold_together(stand_in, path, change, refusal):
    if isinstance(change, str):
        status, document, headers = stand_in.documents[path]
        document = dict(document)
        if change == "issuer":
            document["issuer"] = "https://someone-else.example"
        elif change == "pkce":
            document["code_challenge_methods_supported"] = ["plain"]
        else:
            document["authorization_endpoint"] = "http://login.example/authorize"
        change = (status, document, headers)
    stand_in.documents[path] = change
    with LOCAL, pytest.raises(oauth.OAuthFailed, match=refusal):
        oauth.discover(stand_in.resource)


def test_discovery_goes_through_the_outbound_guard(stand_in):
    # without the admin's allow-list, this machine is an internal address like any other
    with pytest.raises(oauth.OAuthFailed, match="loopback"):
        oauth.discover(stand_in.resource)
    # a metadata document pointing at an internal authorization server is refused at its connection too
    stand_in.documents["/.well-known/oauth-protected-resource/mcp"] = (200, {
        "resource": stand_in.resource, "authorization_servers": ["http://169.254.169.254"]}, {})
    with LOCAL, pytest.raises(oauth.OAuthFailed, match="169.254.169.254: .*metadata"):
        oauth.discover(stand_in.resource)


def test_an_oversized_document_is_not_read(stand_in):
    stand_in.documents["/.well-known/oauth-protected-resource/mcp"] = (
        200, b'{"resource": "' + b"x" * (oauth.DOCUMENT_MAX_BYTES + 10) + b'"}', {})
    with LOCAL, pytest.raises(oauth.OAuthFailed, match="no protected-resource metadata"):
        oauth.discover(stand_in.resource)


# --- connecting --------------------------------------------------------------------------------------

def test_connecting_registers_once_and_binds_the_callback_to_the_person(world, person_server, stand_in):
    operator, reviewer = world.a.users["operator"], world.a.users["reviewer"]
    store: dict = {}
    with LOCAL:
        url = vault.connect_start(upstream=person_server, user=operator, session_store=store)
    assert url.startswith(f"{stand_in.url}/authorize?") and "code_challenge_method=S256" in url
    assert "resource=" in url and "scope=files" in url
    state = next(iter(store[vault.PENDING_KEY]))
    person_server.refresh_from_db()
    assert person_server.oauth_client["client_id"] == "registered-client"  # kept, encrypted, for the next person
    assert "s3cret" not in McpServer.objects.for_tenant(world.a.tenant).filter(pk=person_server.pk).values_list(
        "oauth_client", flat=True)[0]

    # someone else's browser with this state gets nothing (and the state is spent)
    stolen = {vault.PENDING_KEY: dict(store[vault.PENDING_KEY])}
    with LOCAL, pytest.raises(ServiceError, match="started by someone else"):
        vault.connect_finish(user=reviewer, session_store=stolen, state=state, code="c", error=None,
                             issuer=stand_in.url)
    # an answer this browser did not ask for
    with LOCAL, pytest.raises(ServiceError, match="not one this browser asked for"):
        vault.connect_finish(user=operator, session_store=store, state="forged", code="c", error=None, issuer=None)
    # an answer naming another issuer
    with LOCAL, pytest.raises(ServiceError, match="another issuer"):
        vault.connect_finish(user=operator, session_store=dict(store), state=state, code="c", error=None,
                             issuer="https://evil.example")
    with LOCAL:
        connected = vault.connect_finish(user=operator, session_store=store, state=state, code="the-code", error=None,
                                         issuer=stand_in.url)
    token_request = [body for method, path, body in stand_in.requests if path == "/token"][-1].decode()
    assert "code=the-code" in token_request and "code_verifier=" in token_request and "resource=" in token_request
    assert connected.account.tokens["access_token"] == "access-1"
    person_server.refresh_from_db()
    assert person_server.listing_account_id == connected.account.pk  # an operator's connection lists the tools
    # the state was used: the same answer again is refused
    with LOCAL, pytest.raises(ServiceError, match="not one this browser asked for"):
        vault.connect_finish(user=operator, session_store=store, state=state, code="the-code", error=None,
                             issuer=stand_in.url)
    registrations = [path for _, path, _ in stand_in.requests if path == "/register"]
    with LOCAL:
        vault.connect_start(upstream=person_server, user=reviewer, session_store={})
    assert [path for _, path, _ in stand_in.requests if path == "/register"] == registrations  # not again


def test_a_person_who_left_the_tenant_cannot_finish_connecting(world, person_server, stand_in):
    reviewer = world.a.users["reviewer"]
    store: dict = {}
    with LOCAL:
        vault.connect_start(upstream=person_server, user=reviewer, session_store=store)
    membership_remove(tenant=world.a.tenant, user=reviewer)
    with LOCAL, pytest.raises(ServiceError, match="membership"):
        vault.connect_finish(user=reviewer, session_store=store, state=next(iter(store[vault.PENDING_KEY])),
                             code="c", error=None, issuer=stand_in.url)


def connected_account(world, server, stand_in, role="operator") -> UpstreamAccount:
    store: dict = {}
    user = world.a.users[role]
    with LOCAL:
        vault.connect_start(upstream=server, user=user, session_store=store)
        return vault.connect_finish(user=user, session_store=store, state=next(iter(store[vault.PENDING_KEY])),
                                    code="c", error=None, issuer=stand_in.url).account


# --- calls -------------------------------------------------------------------------------------------

def test_a_call_needs_a_verified_member_with_a_connection(world, person_server, stand_in):
    operator, reviewer = world.a.users["operator"], world.a.users["reviewer"]
    asserted = session_create(tenant=world.a.tenant, agent="bot", user=operator.username)
    with pytest.raises(vault.AccountNeeded) as refused:
        vault.call_token(upstream=person_server, session=asserted)
    assert refused.value.error_type == "VerifiedUserRequired"

    verified = session_create(tenant=world.a.tenant, agent="bot", user=reviewer.username, user_verified=True,
                              person=reviewer)
    with pytest.raises(vault.AccountNeeded) as refused:
        vault.call_token(upstream=person_server, session=verified)
    assert refused.value.error_type == "AccountNotConnected"
    assert refused.value.connect_url.endswith(f"/t/{world.a.tenant.slug}/accounts/?connect=files")
    assert refused.value.connect_url in str(refused.value)

    connected_account(world, person_server, stand_in, role="reviewer")
    with LOCAL:
        assert vault.call_token(upstream=person_server, session=verified) == "access-1"
    # an account of the same person at the other tenant's server of the same name is not theirs here
    assert UpstreamAccount.objects.for_tenant(world.b.tenant).count() == 0

    membership_remove(tenant=world.a.tenant, user=reviewer)  # leaving ends the account and its use
    assert UpstreamAccount.objects.for_tenant(world.a.tenant).filter(user=reviewer).count() == 0
    with pytest.raises(vault.AccountNeeded) as refused:
        vault.call_token(upstream=person_server, session=verified)
    assert refused.value.error_type == "VerifiedUserRequired"


def test_a_refused_refresh_ends_the_account_and_says_connect_again(world, person_server, stand_in):
    account = connected_account(world, person_server, stand_in)
    UpstreamAccount.objects.for_tenant(world.a.tenant).filter(pk=account.pk).update(
        expires_at="2000-01-01T00:00:00Z")
    account.refresh_from_db()
    stand_in.documents["/token"] = (400, {"error": "invalid_grant"}, {})
    with LOCAL, pytest.raises(vault.AccountNeeded, match="connect it again"):
        vault.account_token(account)
    assert not UpstreamAccount.objects.for_tenant(world.a.tenant).filter(pk=account.pk).exists()


def test_a_refresh_replaces_the_tokens_and_is_counted(world, person_server, stand_in):
    account = connected_account(world, person_server, stand_in)
    UpstreamAccount.objects.for_tenant(world.a.tenant).filter(pk=account.pk).update(
        expires_at="2000-01-01T00:00:00Z")
    account.refresh_from_db()
    stand_in.documents["/token"] = (200, {"access_token": "access-2", "token_type": "bearer", "expires_in": 600,
                                          "refresh_token": "refresh-2"}, {})
    with LOCAL:
        assert vault.account_token(account) == "access-2"
    account.refresh_from_db()
    assert (account.tokens["refresh_token"], account.refresh_count, account.refresh_started_at) == (
        "refresh-2", 1, None)
    refresh_request = [body for _, path, body in stand_in.requests if path == "/token"][-1].decode()
    assert "grant_type=refresh_token" in refresh_request and "refresh_token=refresh-1" in refresh_request


def test_disconnecting_revokes_upstream(world, person_server, stand_in):
    account = connected_account(world, person_server, stand_in)
    with LOCAL:
        assert vault.account_disconnect(account=account, actor=world.a.users["operator"]) is True
    revocation = [body for _, path, body in stand_in.requests if path == "/revoke"][-1].decode()
    assert "token=refresh-1" in revocation and "token_type_hint=refresh_token" in revocation
    assert not UpstreamAccount.objects.for_tenant(world.a.tenant).exists()


# --- the server's settings ---------------------------------------------------------------------------

@pytest.mark.parametrize(("fields", "field", "refusal"), [
    ({"transport": "stdio", "command": "nothing", "accounts": "person"}, "accounts", "only an HTTP server"),
    ({"headers": {"Authorization": "Bearer x"}, "accounts": "person"}, "headers", "leave it out"),
    ({"oauth_client": {"client_id": "x"}}, "oauth_client", "only a server where each person"),
    ({"accounts": "person", "oauth_client": {"client_secret": "x"}}, "oauth_client", "client_id is required"),
    ({"accounts": "person", "oauth_client": {"client_id": "x", "extra": "y"}}, "oauth_client", "an object with"),
    ({"accounts": "person", "oauth_client": {"client_id": "x\ny"}}, "oauth_client", "visible characters"),
    ({"accounts": "person", "oauth_scopes": 'files "quoted"'}, "oauth_scopes", "scope names"),
    ({"accounts": "everyone"}, "accounts", "one of"),
])
def test_a_servers_account_settings_are_checked(world, stand_in, fields, field, refusal):
    values = {"name": "files", "transport": "streamable_http", "url": stand_in.resource, **fields}
    if values["transport"] == "stdio":
        values.pop("url")
    with LOCAL, pytest.raises(ServiceError) as refused:
        mcp_server_create(tenant=world.a.tenant, **values)
    assert any(refusal in message for message in refused.value.detail[field]), refused.value.detail


def test_moving_a_server_ends_the_accounts_and_needs_its_client_again(world, person_server, stand_in,
                                                                     django_capture_on_commit_callbacks):
    account = connected_account(world, person_server, stand_in)
    with LOCAL, django_capture_on_commit_callbacks(execute=True):
        mcp_server_update(server=person_server, oauth_client={"client_id": "operators-client"})
    assert not UpstreamAccount.objects.for_tenant(world.a.tenant).filter(pk=account.pk).exists()
    assert [path for _, path, _ in stand_in.requests if path == "/revoke"] == ["/revoke"]  # after the commit
    revoked_with = [h for (_, path, _), h in zip(stand_in.requests, stand_in.headers, strict=True)
                    if path == "/revoke"][0]["Authorization"]
    # with the client the grant was made with (its registration, and its secret), not the one replacing it
    assert revoked_with == "Basic " + base64.b64encode(b"registered-client:s3cret-of-the-client").decode()
    other = StandIn()
    try:
        with LOCAL, pytest.raises(ServiceError) as refused:
            mcp_server_update(server=person_server, url=other.resource)
        assert "send the OAuth client again" in refused.value.detail["oauth_client"][0]
    finally:
        other.stop()


# --- pages -------------------------------------------------------------------------------------------

def test_the_accounts_page_lists_the_tenants_person_servers_only(world, person_server, stand_in):
    with LOCAL:
        mcp_server_create(tenant=world.a.tenant, name="shared", transport="streamable_http", url=stand_in.resource)
    page = world.a.console("viewer").get(f"/t/{world.a.tenant.slug}/accounts/?connect=files")
    text = page.content.decode()
    assert page.status_code == 200 and 'id="account-files"' in text and "shared" not in text
    assert "a call needs it" in text
    assert world.b.console("admin").get(f"/t/{world.a.tenant.slug}/accounts/").status_code in (403, 404)


def test_connecting_from_the_page_continues_to_the_authorization_server(world, person_server, stand_in):
    console = world.a.console("viewer")
    with LOCAL:
        page = console.post(f"/t/{world.a.tenant.slug}/accounts/{person_server.pk}/connect/")
    text = page.content.decode()
    assert page.status_code == 200 and f'content="0;url={stand_in.url}/authorize?' in text
    state = next(iter(console.session[vault.PENDING_KEY]))
    with LOCAL:
        back = console.get("/account/upstream/callback/", {"state": state, "code": "c", "iss": stand_in.url})
    assert back.status_code == 302 and back["Location"] == f"/t/{world.a.tenant.slug}/accounts/"
    assert UpstreamAccount.objects.for_tenant(world.a.tenant).filter(user=world.a.users["viewer"]).exists()
    # the same answer again is a page saying so, not a trace
    with LOCAL:
        again = console.get("/account/upstream/callback/", {"state": state, "code": "c"})
    assert again.status_code == 400 and "connect again" in again.content.decode()


def test_the_client_metadata_document_names_the_callback():
    from django.test import Client

    document = Client().get("/oauth/upstream-client.json").json()
    assert document["client_id"].endswith("/oauth/upstream-client.json")
    assert document["redirect_uris"] == [oauth.redirect_uri()] and document["token_endpoint_auth_method"] == "none"



def test_a_server_that_takes_client_metadata_documents_knows_toolkeeper_by_its_url(world, person_server, stand_in):
    status, document, headers = stand_in.documents["/.well-known/oauth-authorization-server"]
    stand_in.documents["/.well-known/oauth-authorization-server"] = (
        status, {**document, "client_id_metadata_document_supported": True}, headers)
    store: dict = {}
    with LOCAL, override_settings(TOOLKEEPER_PUBLIC_URL="https://tk.example"):
        url = vault.connect_start(upstream=person_server, user=world.a.users["operator"], session_store=store)
    assert "client_id=https%3A%2F%2Ftk.example%2Foauth%2Fupstream-client.json" in url
    assert not any(path == "/register" for _, path, _ in stand_in.requests)  # no registration needed
    # over plain HTTP (a development deployment) it registers instead: a document must be HTTPS
    with LOCAL:
        vault.connect_start(upstream=person_server, user=world.a.users["operator"], session_store=store)
    assert any(path == "/register" for _, path, _ in stand_in.requests)


def test_an_operator_cannot_send_an_issuer_with_the_client(world, person_server):
    with LOCAL, pytest.raises(ServiceError) as refused:
        mcp_server_update(server=person_server, oauth_client={"client_id": "x", "issuer": "https://as.example"})
    assert "an object with" in refused.value.detail["oauth_client"][0]
