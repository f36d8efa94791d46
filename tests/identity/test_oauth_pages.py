"""Toolkeeper's authorization server, its records and pages (docs/identity.md, "OAuth for MCP clients"): what a
client may register, what the consent page offers and grants, codes and refresh tokens used once, tokens bound
to `/mcp/`, and grants that end with a disconnect or a membership. The whole flow with the SDK's client:
test_mcp_oauth.py."""
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from audit.models import Event
from common.errors import ServiceError
from tenancy.entry.admission import INVALID_TOKEN, TOKEN_FOR_MCP, Entry, NotAuthenticated, api_key_for_token
from tenancy.models import ApiKey, OAuthGrant, OAuthToken, Role
from tenancy.oauth import services
from tenancy.oauth.consent import consent_url
from tenancy.selectors import issuer, mcp_resource
from tenancy.services import membership_remove, membership_set, tenant_create

pytestmark = pytest.mark.django_db

User = get_user_model()
REDIRECT = "http://127.0.0.1:53682/callback"
CHALLENGE = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


@pytest.fixture
def people():
    admin = User.objects.create_user(username="oauth-admin", password="x" * 12, email="admin@example.com")
    member = User.objects.create_user(username="oauth-member", password="x" * 12, email="member@example.com")
    viewer = User.objects.create_user(username="oauth-viewer", password="x" * 12)
    outsider = User.objects.create_user(username="oauth-outsider", password="x" * 12)
    tenant = tenant_create(slug="oauth-one", name="One", admin=admin)
    other = tenant_create(slug="oauth-two", name="Two", admin=outsider)
    membership_set(tenant=tenant, user=member, role=Role.REVIEWER)
    membership_set(tenant=tenant, user=viewer, role=Role.VIEWER)
    return {"admin": admin, "member": member, "viewer": viewer, "outsider": outsider, "tenant": tenant,
            "other": other}


def client_of(**metadata):
    return services.client_register(metadata={"client_id": "cid-1", "client_name": "Test IDE",
                                              "redirect_uris": [REDIRECT], "token_endpoint_auth_method": "none",
                                              "scope": "agent external admin", **metadata}, client_secret=None)


def consent(scopes=("agent",), state="st-1"):
    return services.Consent(client_id="cid-1", redirect_uri=REDIRECT, redirect_uri_provided_explicitly=True,
                            code_challenge=CHALLENGE, scopes=tuple(scopes), state=state, resource=mcp_resource())


def signed_in(user) -> Client:
    browser = Client()
    browser.force_login(user)
    return browser


def path_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}"


@pytest.mark.parametrize("uri, said", [
    ("http://tools.example.com/cb", "must be HTTPS, or HTTP to localhost"),
    ("https://app.example.com/cb#x", "fragment"),
    ("https://user:pw@app.example.com/cb", "credentials"),
    ("javascript:alert(1)", "must be HTTPS"),
    ("https://" + "a" * 2000 + ".example.com/", "too long"),
])
def test_a_client_is_sent_back_only_to_https_or_this_machine(uri, said):
    with pytest.raises(ServiceError) as refused:
        client_of(redirect_uris=[uri])
    assert said in refused.value.message
    for fine in ("https://app.example.com/cb", "http://localhost:8765/cb", "http://[::1]:9/cb", REDIRECT):
        assert services.redirect_uri_problem(fine) is None


def test_a_clients_name_is_short_and_on_one_line():
    with pytest.raises(ServiceError, match="client_name"):
        client_of(client_name="x" * 101)
    with pytest.raises(ServiceError, match="client_name"):
        client_of(client_name="IDE\nAdmin approved")
    with pytest.raises(ServiceError, match="at most 10"):
        client_of(redirect_uris=[f"http://127.0.0.1:{port}/cb" for port in range(1000, 1011)])


def test_the_consent_page_offers_the_persons_tenants_and_grants_a_code(people):
    client_of(client_name="<b>Evil</b> IDE")
    browser = signed_in(people["member"])
    url = path_of(consent_url(consent(scopes=("agent", "admin"))))
    page = browser.get(url)
    assert page.status_code == 200
    text = page.content.decode()
    assert "&lt;b&gt;Evil&lt;/b&gt; IDE" in text and "<b>Evil</b>" not in text
    assert 'value="oauth-one"' in text and "oauth-two" not in text
    # its form ends at the client: that origin, and no other, joins form-action
    assert "form-action 'self' http://127.0.0.1:53682;" in page["Content-Security-Policy"]

    # another person's tenant is no choice
    refused = browser.post(url, {"tenant": "oauth-two", "agent": "ide-bot", "scopes": ["agent"], "allow": "1"})
    assert refused.status_code == 400
    # a reviewer cannot let a client administer the tenant
    refused = browser.post(url, {"tenant": "oauth-one", "agent": "ide-bot", "scopes": ["agent", "admin"],
                                 "allow": "1"})
    assert refused.status_code == 400 and "cannot grant admin" in refused.content.decode()
    refused = browser.post(url, {"tenant": "oauth-one", "agent": "toolkeeper", "allow": "1"})
    assert refused.status_code == 400 and "reserved" in refused.content.decode()

    granted = browser.post(url, {"tenant": "oauth-one", "agent": "ide-bot", "scopes": ["agent"], "allow": "1"})
    assert granted.status_code == 302
    back = urlsplit(granted["Location"])
    query = parse_qs(back.query)
    assert f"{back.scheme}://{back.netloc}{back.path}" == REDIRECT
    assert query["state"] == ["st-1"] and query["iss"] == [issuer()] and len(query["code"][0]) > 40
    row = services.code_load(client_id="cid-1", code=query["code"][0])
    assert (row.user, row.tenant, row.agent, row.scopes) == (people["member"], people["tenant"], "ide-bot", ["agent"])
    assert Event.objects.filter(tenant=people["tenant"], verb="oauth.consented").count() == 1


def test_denying_sends_the_client_back_with_access_denied(people):
    client_of()
    browser = signed_in(people["member"])
    denied = browser.post(path_of(consent_url(consent(state="s2"))), {"deny": "1"})
    query = parse_qs(urlsplit(denied["Location"]).query)
    assert query["error"] == ["access_denied"] and query["state"] == ["s2"] and "code" not in query


def test_a_changed_or_old_request_and_a_viewer_get_a_page_not_a_code(people):
    client_of()
    url = path_of(consent_url(consent()))
    tampered = url.replace("request=", "request=x")
    assert signed_in(people["member"]).get(tampered).status_code == 400
    page = signed_in(people["viewer"]).get(url).content.decode()
    assert 'id="no-tenant"' in page and 'id="allow"' not in page
    # signed out: the console's sign-in page first, then back here
    assert Client().get(url)["Location"].startswith("/login/?next=/oauth/consent/")


def grant_for(people, who="member", agent="ide-bot"):
    client_of()
    code = services.code_issue(consent=consent(), user=people[who], tenant=people["tenant"], agent=agent,
                               scopes=["agent"])
    row = services.code_load(client_id="cid-1", code=code)
    return code, row, services.code_exchange(code=row)


def test_a_code_works_once_and_a_second_use_ends_what_the_first_bought(people):
    code, row, tokens = grant_for(people)
    key = api_key_for_token(f"Bearer {tokens.access_token}", entry=Entry.MCP)
    assert key.agent == "ide-bot" and key.acting_for == people["member"] and key.scopes == ["agent"]
    with pytest.raises(ServiceError):
        services.code_exchange(code=row)
    assert services.code_load(client_id="cid-1", code=code) is None  # replayed
    assert OAuthGrant.all_tenants.get().revoked_at is not None
    with pytest.raises(NotAuthenticated, match="Invalid, expired or revoked"):
        api_key_for_token(f"Bearer {tokens.access_token}", entry=Entry.MCP)


def test_a_refresh_token_is_used_once(people):
    _, _, tokens = grant_for(people)
    row = services.refresh_load(client_id="cid-1", token=tokens.refresh_token)
    renewed = services.refresh_exchange(token=row)
    assert api_key_for_token(f"Bearer {renewed.access_token}", entry=Entry.MCP).agent == "ide-bot"
    assert services.refresh_load(client_id="other-client", token=renewed.refresh_token) is None
    # the old refresh token again: a copy is loose, so the grant ends
    assert services.refresh_load(client_id="cid-1", token=tokens.refresh_token) is None
    with pytest.raises(NotAuthenticated):
        api_key_for_token(f"Bearer {renewed.access_token}", entry=Entry.MCP)


def test_an_access_token_is_for_mcp_only_and_only_while_it_stands(people):
    _, _, tokens = grant_for(people)
    bearer = f"Bearer {tokens.access_token}"
    for entry in (Entry.REST, Entry.WEBSOCKET, Entry.CONSOLE):
        with pytest.raises(NotAuthenticated) as refused:
            api_key_for_token(bearer, entry=entry)
        assert refused.value.message == TOKEN_FOR_MCP
    grant = OAuthGrant.all_tenants.get()
    OAuthGrant.all_tenants.filter(pk=grant.pk).update(resource="http://testserver/api/v1/")  # another audience
    with pytest.raises(NotAuthenticated, match=INVALID_TOKEN):
        api_key_for_token(bearer, entry=Entry.MCP)
    OAuthGrant.all_tenants.filter(pk=grant.pk).update(resource=mcp_resource())
    assert api_key_for_token(bearer, entry=Entry.MCP)
    OAuthToken.objects.filter(kind="access").update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(NotAuthenticated):
        api_key_for_token(bearer, entry=Entry.MCP)


def test_a_person_disabled_here_has_no_working_token(people):
    _, _, tokens = grant_for(people)
    User.objects.filter(pk=people["member"].pk).update(is_active=False)
    with pytest.raises(NotAuthenticated):
        api_key_for_token(f"Bearer {tokens.access_token}", entry=Entry.MCP)


def test_removing_a_member_ends_the_clients_they_connected_there(people):
    _, _, tokens = grant_for(people)
    grant = OAuthGrant.all_tenants.get()
    membership_remove(tenant=people["tenant"], user=people["member"], actor=people["admin"])
    grant.refresh_from_db()
    assert grant.revoked_at is not None
    assert ApiKey.all_tenants.get(pk=grant.api_key_id).revoked_at is not None  # its streams end (tenancy.grants)
    assert not OAuthToken.objects.filter(grant=grant).exists()
    revoked = Event.objects.get(tenant=people["tenant"], verb="oauth.revoked")
    assert revoked.data["reason"] == "membership_removed"


def test_a_person_disconnects_their_own_clients_and_no_one_elses(people):
    grant_for(people)
    grant = OAuthGrant.all_tenants.get()
    page = signed_in(people["member"]).get("/account/connections/").content.decode()
    assert "Test IDE" in page and "ide-bot" in page
    assert signed_in(people["admin"]).post(f"/account/connections/{grant.pk}/disconnect/").status_code == 404
    grant.refresh_from_db()
    assert grant.revoked_at is None
    done = signed_in(people["member"]).post(f"/account/connections/{grant.pk}/disconnect/")
    assert done.status_code == 302
    grant.refresh_from_db()
    assert grant.revoked_at is not None
    assert 'id="no-connections"' in signed_in(people["member"]).get("/account/connections/").content.decode()


def test_a_tenants_admin_sees_and_disconnects_its_members_clients(people):
    grant_for(people)
    grant = OAuthGrant.all_tenants.get()
    admin = signed_in(people["admin"])
    page = admin.get("/t/oauth-one/members/").content.decode()
    assert 'id="connected-clients"' in page and "Test IDE" in page and "oauth-member" in page
    # the grant's key is not among the tenant's API keys: it is never shown and never pasted
    assert "MCP client: Test IDE" not in admin.get("/t/oauth-one/keys/").content.decode()
    assert signed_in(people["member"]).post(f"/t/oauth-one/members/clients/{grant.pk}/disconnect/").status_code == 403
    done = admin.post(f"/t/oauth-one/members/clients/{grant.pk}/disconnect/")
    assert done.status_code == 302
    grant.refresh_from_db()
    assert grant.revoked_at is not None
    assert Event.objects.get(tenant=people["tenant"], verb="oauth.revoked").actor == people["admin"]


def _oauth_requests(*requests):
    """Send (method, path, body) requests from one address to the HTTP entry; their (status, headers, JSON)."""
    import asyncio

    import httpx
    from django.core.asgi import get_asgi_application

    from toolkeeper.handlers import http_application

    async def main():
        transport = httpx.ASGITransport(app=http_application(get_asgi_application()), client=("192.0.2.7", 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:
            answers = []
            for method, path, body in requests:
                response = await http.request(method, path, content=body,
                                              headers={"Content-Type": "application/json"} if body else {})
                answers.append((response.status_code, response.headers, response.json() if response.content else {}))
            return answers
    return asyncio.run(main())


@pytest.mark.django_db(transaction=True)
def test_the_oauth_endpoints_refuse_bad_registrations_and_count_each_address(settings):
    settings.TOOLKEEPER_ADDRESS_REQUESTS_PER_MINUTE = 4
    from tenancy.entry.limits import counter_store
    counter_store().clear()
    bad_uri = b'{"redirect_uris": ["http://evil.example.com/cb"], "client_name": "x"}'
    answers = _oauth_requests(
        ("POST", "/oauth/register", b"{not json"),
        ("POST", "/oauth/register", bad_uri),
        ("POST", "/oauth/token", b""),
        ("GET", "/.well-known/oauth-authorization-server", None),
        ("GET", "/.well-known/oauth-protected-resource/mcp", None),
    )
    (status, _, body), (status2, _, body2), (status3, _, body3), (status4, _, _), (status5, headers5, body5) = answers
    assert status == 400 and body["error"] == "invalid_client_metadata"
    assert status2 == 400 and body2["error"] == "invalid_redirect_uri"
    assert status3 in (400, 401) and body3["error"] in ("invalid_request", "invalid_client")
    assert status4 == 200
    assert status5 == 429 and int(headers5["retry-after"]) >= 1 and body5["error"] == "rate_limited"
    assert not services.OAuthClient.objects.exists()


# -- clients named by their metadata document -------------------------------------------------------------------

@pytest.fixture(scope="module")
def documents():
    from tests.identity.documents import DocumentServer
    server = DocumentServer()
    yield server
    server.stop()


@pytest.fixture
def trusting(documents, settings):
    """Outbound requests may reach the document server (on this machine) and trust its test authority."""
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.TOOLKEEPER_OUTBOUND_CA_FILE = str(documents.ca_file)
    return documents


def document(url, **more):
    return {"client_id": url, "client_name": "Doc IDE", "redirect_uris": [REDIRECT],
            "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
            "token_endpoint_auth_method": "none", **more}


def test_a_client_named_by_its_document_is_read_once_an_hour(trusting):
    url = trusting.url("/clients/ok.json")
    trusting.put("/clients/ok.json", document(url))
    client = services.client_get(url)
    assert (client.kind, client.name, client.secret) == ("document", "Doc IDE", None)
    assert services.client_get(url).pk == client.pk
    assert trusting.requests.count("/clients/ok.json") == 1  # kept, not fetched at every step


@pytest.mark.parametrize("path, body, said", [
    ("/clients/other.json", lambda url: document("https://elsewhere.example.com/c.json"), "own URL"),
    ("/clients/secret.json", lambda url: document(url, token_endpoint_auth_method="client_secret_basic"), "public"),
    ("/clients/bad-uri.json", lambda url: document(url, redirect_uris=["http://evil.example.com/cb"]), "HTTPS"),
    ("/clients/no-uris.json", lambda url: document(url, redirect_uris=[]), "no redirect"),
    ("/clients/big.json", lambda url: document(url, client_name="x", padding="y" * 10_000), "larger than"),
    ("/clients/not-json.json", lambda url: b"<html>", "not JSON"),
    ("/clients/missing.json", None, "answered 404"),
])
def test_a_document_that_does_not_hold_names_no_client(trusting, caplog, path, body, said):
    url = trusting.url(path)
    if body is not None:
        trusting.put(path, body(url))
    with caplog.at_level("INFO", logger="toolkeeper.oauth"):
        assert services.client_get(url) is None
    assert said in caplog.text
    assert not services.OAuthClient.objects.filter(client_id=url).exists()


def test_a_document_is_fetched_through_the_outbound_guard_within_its_time(documents, settings, caplog):
    settings.TOOLKEEPER_OUTBOUND_CA_FILE = str(documents.ca_file)
    url = documents.url("/clients/guarded.json")
    documents.put("/clients/guarded.json", document(url))
    with caplog.at_level("INFO", logger="toolkeeper.oauth"):
        assert services.client_get(url) is None  # 127.0.0.1 is not allow-listed here
    assert "cannot be fetched" in caplog.text and "/clients/guarded.json" not in documents.requests
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1"]
    documents.slow_s = services.DOCUMENT_TIMEOUT_S + 1
    slow = documents.url("/slow/ide.json")
    documents.put("/slow/ide.json", document(slow))
    started = timezone.now()
    assert services.client_get(slow) is None
    assert (timezone.now() - started).total_seconds() < services.DOCUMENT_TIMEOUT_S + 3
    documents.slow_s = 0
    # an id that is no HTTPS URL with a path is never fetched
    for not_a_document in ("http://127.0.0.1:1/c.json", f"https://127.0.0.1:{documents.port}/"):
        assert services.client_get(not_a_document) is None


def test_a_clients_token_reaches_only_its_own_sessions(people):
    from tools.catalog.services import session_create
    from tools.gateway.protocol import McpAccessError, mcp_session
    _, _, tokens = grant_for(people)
    key = api_key_for_token(f"Bearer {tokens.access_token}", entry=Entry.MCP)
    own = mcp_session(api_key=key, agent="ide-bot", opening=True).session
    assert own.user == "member@example.com" and own.user_verified
    assert mcp_session(api_key=key, named=str(own.pk)).session.pk == own.pk
    # the same agent's session of someone else in the tenant, and a session of another tenant: not found
    admins = services.code_issue(consent=consent(), user=people["admin"], tenant=people["tenant"], agent="ide-bot",
                                 scopes=["agent"])
    other_key = services.code_exchange(code=services.code_load(client_id="cid-1", code=admins)).access_token
    theirs = mcp_session(api_key=api_key_for_token(f"Bearer {other_key}", entry=Entry.MCP), agent="ide-bot",
                         opening=True).session
    elsewhere = session_create(tenant=people["other"], agent="ide-bot", user="outsider@example.com")
    for foreign in (theirs, elsewhere):
        with pytest.raises(McpAccessError) as refused:
            mcp_session(api_key=key, named=str(foreign.pk))
        assert refused.value.status == 404
