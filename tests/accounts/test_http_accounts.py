"""HTTP tools' OAuth providers, in process (docs/accounts.md): the checks of a provider, a service account's
client credentials (got once, again on expiry, hidden from answers), each person's own account connected through
the operator's endpoints, what changing or deleting a provider does, and the API and pages. The same against a
real authorization server: tests/accounts/test_upstream_accounts_live.py."""
import base64
import json
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db.models.deletion import Collector
from django.test import override_settings

from audit.models import Event
from common.errors import ServiceError
from tests.tools.http_endpoint import serve
from tools.accounts import providers, vault
from tools.catalog.services import session_create
from tools.http_tools.services import HttpSource, http_tool_create, http_tool_update
from tools.models import HttpEndpoint, OAuthProvider, Tool, UpstreamAccount
from tools.python.decorators import ToolError

pytestmark = pytest.mark.django_db
LOCAL = override_settings(TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS=("127.0.0.1",))
CLIENT_SECRET = "cl1ent-s3cret-of-the-api"  # noqa: S105


@pytest.fixture
def api(settings):
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1"]
    yield from serve()


def provider_of(world, stand_in, api=None, **fields) -> OAuthProvider:
    values = {"name": "crm", "accounts": "service", "api_url": api.url if api else "https://93.184.215.14",
              "token_endpoint": f"{stand_in.url}/token",
              "revocation_endpoint": f"{stand_in.url}/revoke", "scopes": "items:read",
              "client": {"client_id": "toolkeeper", "client_secret": CLIENT_SECRET}, **fields}
    with LOCAL:
        return providers.provider_create(tenant=world.a.tenant, **values)


def tool_of(world, api, provider, **fields) -> Tool:
    return http_tool_create(tenant=world.a.tenant, name="crm_items", method="GET", url=api.url + "/echo/items",
                            oauth_provider=provider.name, **fields)


def invoke(tool, session):
    fresh = Tool.objects.for_tenant(tool.tenant_id).get(pk=tool.pk)
    return HttpSource().invoke(fresh, {}, SimpleNamespace(session=session, cancel_signal=None))


def token_requests(stand_in) -> list[dict]:
    return [parse_qs(body.decode()) for _, path, body in stand_in.requests if path == "/token"]


# --- a provider's settings ---------------------------------------------------------------------------

@pytest.mark.parametrize(("fields", "field", "refusal"), [
    ({"client": {"client_id": "toolkeeper"}}, "client", "client_secret"),
    ({"accounts": "person"}, "authorization_endpoint", "required"),
    ({"authorization_endpoint": "https://93.184.215.14/authorize"}, "authorization_endpoint", "leave it empty"),
    ({"token_endpoint": ""}, "token_endpoint", "required"),
    ({"token_endpoint": "http://10.0.0.5/token"}, "token_endpoint", "private"),
    ({"token_endpoint": "http://93.184.215.14/token"}, "token_endpoint", "not an HTTPS address"),
    ({"revocation_endpoint": "https://user:pw@93.184.215.14/revoke"}, "revocation_endpoint", "user name"),
    ({"scopes": 'items "read"'}, "scopes", "scope names"),
    ({"client": {"client_id": "x", "extra": "y"}}, "client", "an object with"),
    ({"accounts": "tenant"}, "accounts", "one of"),
    ({"name": "Bad Name"}, "name", "lowercase"),
    ({"colour": "red"}, "colour", "not a field"),
])
def test_a_providers_settings_are_checked(world, stand_in, fields, field, refusal):
    with pytest.raises(ServiceError) as refused:
        provider_of(world, stand_in, **fields)
    assert any(refusal in message for message in refused.value.detail[field]), refused.value.detail


def test_an_http_tool_names_a_provider_of_its_tenant_and_leaves_the_authorization_to_it(world, stand_in, api):
    provider = provider_of(world, stand_in, api)
    with pytest.raises(ServiceError) as refused:
        http_tool_create(tenant=world.a.tenant, name="t1", url=api.url + "/echo", oauth_provider="nope")
    assert "OAuth providers" in refused.value.detail["oauth_provider"][0]
    with pytest.raises(ServiceError) as refused:
        http_tool_create(tenant=world.a.tenant, name="t1", url=api.url + "/echo", oauth_provider=provider.name,
                         headers={"authorization": "Bearer {secret:t}"}, secrets={"t": "x" * 8})
    assert "leave it out" in refused.value.detail["headers"][0]
    with pytest.raises(ServiceError) as refused:  # another tenant's provider of the same name is not there
        http_tool_create(tenant=world.b.tenant, name="t1", url=api.url + "/echo", oauth_provider=provider.name)
    assert "oauth_provider" in refused.value.detail


# --- a service account ---------------------------------------------------------------------------------

def test_a_service_account_gets_its_token_once_and_again_on_expiry(world, stand_in, api):
    provider = provider_of(world, stand_in, api, resource="https://93.184.215.14/api")
    tool = tool_of(world, api, provider)
    stand_in.documents["/token"] = (200, {"access_token": "service-1", "token_type": "Bearer", "expires_in": 600}, {})
    session = session_create(tenant=world.a.tenant, agent="bot")  # no person needed: the service acts
    with LOCAL:
        first = invoke(tool, session)
        invoke(tool, session)
    assert [sent.headers["Authorization"] for sent in api.received] == ["Bearer service-1"] * 2
    [grant] = token_requests(stand_in)  # one grant for both calls
    assert (grant["grant_type"], grant["scope"], grant["resource"]) == (
        ["client_credentials"], ["items:read"], ["https://93.184.215.14/api"])
    sent = [headers for (_, path, _), headers in zip(stand_in.requests, stand_in.headers, strict=True)
            if path == "/token"][0]
    assert sent["Authorization"].startswith("Basic ")  # the client's secret, by HTTP Basic
    assert "service-1" not in json.dumps(first)  # the echoed header is hidden as a stored secret is
    account = UpstreamAccount.objects.for_tenant(world.a.tenant).get(oauth_provider=provider)
    assert account.user_id is None and account.refresh_count == 1
    connected = Event.objects.for_tenant(world.a.tenant).get(verb="upstream_account.connected")
    assert connected.target == "oauth_provider:crm" and connected.data["user"] == "service account"

    UpstreamAccount.objects.for_tenant(world.a.tenant).filter(pk=account.pk).update(expires_at="2000-01-01T00:00Z")
    stand_in.documents["/token"] = (200, {"access_token": "service-2", "token_type": "Bearer", "expires_in": 600}, {})
    with LOCAL:
        invoke(tool, session)
    assert api.received[-1].headers["Authorization"] == "Bearer service-2"
    assert len(token_requests(stand_in)) == 2


def test_a_token_the_api_refuses_before_its_end_is_renewed_once_and_the_request_sent_again(world, stand_in, api):
    provider = provider_of(world, stand_in, api)
    tool = http_tool_create(tenant=world.a.tenant, name="crm_items", method="GET", url=api.url + "/bearer/service-2",
                            oauth_provider=provider.name)
    session = session_create(tenant=world.a.tenant, agent="bot")
    stand_in.documents["/token"] = (200, {"access_token": "service-1", "token_type": "Bearer", "expires_in": 600}, {})
    with LOCAL:
        vault.call_token(upstream=provider, session=session)  # the token the vault holds: revoked at the API
    UpstreamAccount.objects.for_tenant(world.a.tenant).filter(oauth_provider=provider).update(
        refreshed_at="2000-01-01T00:00Z")  # got a while ago (one renewed moments ago is not renewed again)
    stand_in.documents["/token"] = (200, {"access_token": "service-2", "token_type": "Bearer", "expires_in": 600}, {})
    with LOCAL:
        result = invoke(tool, session)
    assert result["structured"] == {"taken": True}
    assert [sent.headers["Authorization"] for sent in api.received] == ["Bearer service-1", "Bearer service-2"]
    assert len(token_requests(stand_in)) == 2
    # a token renewed moments ago is not renewed again (a route that always answers 401 cannot make every call a
    # round trip to the authorization server): the call fails with the API's answer, sent once
    http_tool_update(tool=tool, url=api.url + "/bearer/never")
    with LOCAL, pytest.raises(ToolError) as failed:
        invoke(tool, session)
    assert "401" in str(failed.value) and len(token_requests(stand_in)) == 2
    assert [sent.headers["Authorization"] for sent in api.received][2:] == ["Bearer service-2"]
    # once it is older, a refusal renews it once, and a second refusal fails the call
    stand_in.documents["/token"] = (200, {"access_token": "service-3", "token_type": "Bearer", "expires_in": 600}, {})
    UpstreamAccount.objects.for_tenant(world.a.tenant).filter(oauth_provider=provider).update(
        refreshed_at="2000-01-01T00:00Z")
    with LOCAL, pytest.raises(ToolError):
        invoke(tool, session)
    assert len(token_requests(stand_in)) == 3
    assert [sent.headers["Authorization"] for sent in api.received][3:] == ["Bearer service-2", "Bearer service-3"]


def test_a_refused_client_fails_the_call_and_is_audited_without_its_secret(world, stand_in, api):
    provider = provider_of(world, stand_in, api)
    tool = tool_of(world, api, provider)
    stand_in.documents["/token"] = (401, {"error": "invalid_client"}, {})
    with LOCAL, pytest.raises(ToolError) as failed:
        invoke(tool, session_create(tenant=world.a.tenant, agent="bot"))
    assert failed.value.error_type == "UpstreamUnavailable" and "invalid_client" in str(failed.value)
    assert api.received == []  # nothing reached the API
    event = Event.objects.for_tenant(world.a.tenant).get(verb="upstream_account.failed")
    assert event.target == "oauth_provider:crm" and event.data["stage"] == "client_credentials"
    assert CLIENT_SECRET not in json.dumps([e.data for e in Event.objects.for_tenant(world.a.tenant)])


# --- each person's own account -------------------------------------------------------------------------

def person_provider(world, stand_in, api, **fields):
    values = {"accounts": "person", "authorization_endpoint": f"{stand_in.url}/authorize",
              "client": {"client_id": "toolkeeper"}, "scopes": "items:read offline_access", **fields}
    return provider_of(world, stand_in, api, **values)


def connect(world, provider, stand_in, role: str, code: str = "c"):
    store: dict = {}
    user = world.a.users[role]
    with LOCAL:
        url = vault.connect_start(upstream=provider, user=user, session_store=store)
        state = next(iter(store[vault.PENDING_KEY]))
        vault.connect_finish(user=user, session_store=store, state=state, code=code, error=None,
                             issuer=stand_in.url)
    return url


def test_each_person_connects_through_the_operators_endpoints_and_calls_with_their_own_token(world, stand_in, api):
    provider = person_provider(world, stand_in, api)
    tool = tool_of(world, api, provider)
    reviewer = world.a.users["reviewer"]
    verified = session_create(tenant=world.a.tenant, agent="bot", user=reviewer.username, user_verified=True,
                              person=reviewer)
    with pytest.raises(ToolError) as refused:
        invoke(tool, verified)
    assert refused.value.error_type == "AccountNotConnected"
    assert f"/t/{world.a.tenant.slug}/accounts/?connect=http%3Acrm" in str(refused.value)
    asserted = session_create(tenant=world.a.tenant, agent="bot", user=reviewer.username)
    with pytest.raises(ToolError) as refused:
        invoke(tool, asserted)
    assert refused.value.error_type == "VerifiedUserRequired"

    url = connect(world, provider, stand_in, "reviewer")
    query = parse_qs(urlsplit(url).query)
    assert url.startswith(f"{stand_in.url}/authorize?") and query["scope"] == ["items:read offline_access"]
    assert query["code_challenge_method"] == ["S256"] and "resource" not in query  # the provider names none
    exchange = token_requests(stand_in)[-1]
    assert exchange["grant_type"] == ["authorization_code"] and "resource" not in exchange
    with LOCAL:
        invoke(tool, verified)
    assert api.received[-1].headers["Authorization"] == "Bearer access-1"
    account = UpstreamAccount.objects.for_tenant(world.a.tenant).get(oauth_provider=provider)
    assert account.user == reviewer and account.mcp_server is None

    page = world.a.console("reviewer").get(f"/t/{world.a.tenant.slug}/accounts/?connect=http:crm")
    text = page.content.decode()
    assert 'id="account-httpcrm"' in text and "HTTP tools" in text and "connected" in text


def test_changing_what_the_grants_were_for_ends_the_accounts(world, stand_in, api,
                                                              django_capture_on_commit_callbacks):
    provider = person_provider(world, stand_in, api, client={"client_id": "toolkeeper", "client_secret": CLIENT_SECRET})
    connect(world, provider, stand_in, "reviewer")
    with LOCAL, django_capture_on_commit_callbacks(execute=True):
        providers.provider_update(provider=provider, scopes="items:read")  # a person's grant keeps its scopes
    assert UpstreamAccount.objects.for_tenant(world.a.tenant).count() == 1
    with LOCAL, django_capture_on_commit_callbacks(execute=True):
        providers.provider_update(provider=provider, client={"client_id": "another"})
    assert UpstreamAccount.objects.for_tenant(world.a.tenant).count() == 0
    revocation = [parse_qs(body.decode()) for _, path, body in stand_in.requests if path == "/revoke"]
    assert revocation[-1]["token"] == ["refresh-1"]
    revoked_with = [h for (_, path, _), h in zip(stand_in.requests, stand_in.headers, strict=True)
                    if path == "/revoke"][-1]["Authorization"]
    assert revoked_with == "Basic " + base64.b64encode(f"toolkeeper:{CLIENT_SECRET}".encode()).decode()  # the old
    updated = Event.objects.for_tenant(world.a.tenant).filter(verb="oauth_provider.updated").latest("pk")
    assert updated.data["fields"] == ["client"] and updated.data["accounts_ended"] == 1


def test_a_provider_in_use_is_not_deleted(world, stand_in, api):
    provider = provider_of(world, stand_in, api)
    tool = tool_of(world, api, provider)
    with pytest.raises(ServiceError, match="crm_items"):
        providers.provider_delete(provider=provider)
    http_tool_update(tool=tool, oauth_provider=None)
    providers.provider_delete(provider=provider)
    assert not OAuthProvider.objects.for_tenant(world.a.tenant).exists()


# --- API and pages -------------------------------------------------------------------------------------

def test_the_api_writes_the_client_and_never_shows_its_secret(world, stand_in):
    client = world.a.client("admin")
    body = {"name": "crm", "accounts": "service", "api_url": stand_in.url, "token_endpoint": f"{stand_in.url}/token",
            "client": {"client_id": "toolkeeper", "client_secret": CLIENT_SECRET}}
    with LOCAL:
        created = client.post("/api/v1/oauth-providers", body, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["client_id"] == "toolkeeper" and CLIENT_SECRET not in created.content.decode()
    listed = client.get("/api/v1/oauth-providers")
    assert [p["name"] for p in listed.json()["results"]] == ["crm"] and CLIENT_SECRET not in listed.content.decode()
    with LOCAL:
        changed = client.patch(f"/api/v1/oauth-providers/{created.json()['id']}", {"scopes": "a b"}, format="json")
    assert changed.status_code == 200 and changed.json()["client_id"] == "toolkeeper"  # the stored client stays
    refused = client.post("/api/v1/oauth-providers", {**body, "name": "other", "client": {"client_id": "x"}},
                          format="json")
    assert refused.status_code == 400 and "client" in refused.json()["error"]["fields"]
    assert world.b.client("admin").get(f"/api/v1/oauth-providers/{created.json()['id']}").status_code == 404
    assert world.a.client("agent").get("/api/v1/oauth-providers").status_code == 403


def test_the_console_form_keeps_the_stored_client_and_never_shows_it(world, stand_in):
    provider = provider_of(world, stand_in)
    console = world.a.console("admin")
    page = console.get(f"/t/{world.a.tenant.slug}/oauth-providers/{provider.pk}/")
    assert page.status_code == 200 and CLIENT_SECRET not in page.content.decode()
    assert "A client is stored" in page.content.decode()
    with LOCAL:
        saved = console.post(f"/t/{world.a.tenant.slug}/oauth-providers/{provider.pk}/", {
            "accounts": "service", "api_url": "https://93.184.215.14", "token_endpoint": f"{stand_in.url}/token",
            "scopes": "items:write"})
    assert saved.status_code == 302, saved.content.decode()[:2000]
    provider.refresh_from_db()
    assert provider.scopes == "items:write" and provider.client["client_secret"] == CLIENT_SECRET
    assert world.a.console("operator").get(f"/t/{world.a.tenant.slug}/oauth-providers/new/").status_code == 403


def test_a_persons_token_the_api_refuses_is_refreshed_with_their_refresh_token(world, stand_in, api):
    provider = person_provider(world, stand_in, api)
    tool = http_tool_create(tenant=world.a.tenant, name="crm_items", method="GET", url=api.url + "/bearer/access-2",
                            oauth_provider=provider.name)
    reviewer = world.a.users["reviewer"]
    verified = session_create(tenant=world.a.tenant, agent="bot", user=reviewer.username, user_verified=True,
                              person=reviewer)
    connect(world, provider, stand_in, "reviewer")
    stand_in.documents["/token"] = (200, {"access_token": "access-2", "token_type": "Bearer", "expires_in": 600,
                                          "refresh_token": "refresh-2"}, {})
    with LOCAL:
        assert invoke(tool, verified)["structured"] == {"taken": True}
    renewal = token_requests(stand_in)[-1]
    assert renewal["grant_type"] == ["refresh_token"] and renewal["refresh_token"] == ["refresh-1"]
    account = UpstreamAccount.objects.for_tenant(world.a.tenant).get(oauth_provider=provider, user=reviewer)
    assert account.tokens == {"access_token": "access-2", "refresh_token": "refresh-2"} and account.refresh_count == 1


# --- where the tokens may go ---------------------------------------------------------------------------

@pytest.mark.parametrize(("url", "under"), [
    ("https://api.example/v1", True), ("https://API.example/v1/items?x=1", True), ("https://api.example/v1/", True),
    ("https://api.example/v1x", False), ("https://api.example/v2/items", False), ("http://api.example/v1", False),
    ("https://api.example:8443/v1", False), ("https://evil.example/v1", False), ("https://api.example.evil/v1", False),
])
def test_a_url_is_under_the_api_url_by_origin_and_whole_segments(url, under):
    assert providers.url_under(url, "https://api.example/v1") is under


def test_a_tools_url_stays_under_its_providers_api_url(world, stand_in, api):
    """An operator edits tools, an admin providers: the tool cannot send the provider's tokens elsewhere."""
    provider = provider_of(world, stand_in, api, api_url=api.url + "/echo")
    with pytest.raises(ServiceError) as refused:
        http_tool_create(tenant=world.a.tenant, name="leak", url="https://93.184.215.14/collect",
                         oauth_provider=provider.name)
    assert "under" in refused.value.detail["oauth_provider"][0]
    tool = tool_of(world, api, provider)
    with pytest.raises(ServiceError) as refused:  # moving it elsewhere is refused too
        http_tool_update(tool=tool, url="https://93.184.215.14/collect")
    assert "oauth_provider" in refused.value.detail
    with LOCAL, pytest.raises(ServiceError) as refused:  # and the admin cannot move the API away from its tools
        providers.provider_update(provider=provider, api_url=api.url + "/other")
    assert "crm_items" in refused.value.detail["api_url"][0]
    # a row changed behind the services' back is still refused at the call, before any token is got
    OAuthProvider.objects.for_tenant(world.a.tenant).filter(pk=provider.pk).update(api_url=api.url + "/other")
    with LOCAL, pytest.raises(ToolError) as failed:
        invoke(tool, session_create(tenant=world.a.tenant, agent="bot"))
    assert failed.value.error_type == "OutboundRefused"
    assert api.received == [] and token_requests(stand_in) == []


def test_a_connection_under_way_when_the_provider_changes_is_refused(world, stand_in, api):
    provider = person_provider(world, stand_in, api)
    store: dict = {}
    user = world.a.users["reviewer"]
    with LOCAL:
        vault.connect_start(upstream=provider, user=user, session_store=store)
        providers.provider_update(provider=provider, client={"client_id": "another"})
        with pytest.raises(ServiceError, match="changed meanwhile"):
            vault.connect_finish(user=user, session_store=store, state=next(iter(store[vault.PENDING_KEY])),
                                 code="c", error=None, issuer=None)
    assert not UpstreamAccount.objects.for_tenant(world.a.tenant).exists()
    assert token_requests(stand_in) == []  # the code was not even exchanged


def test_a_tenant_whose_tools_name_a_provider_can_be_deleted(world, stand_in, api):
    """The tool holds its provider back from a delete of its own (409 above), not from the tenant's delete, which
    takes both: collecting what that delete takes raises nothing."""
    tool = tool_of(world, api, provider_of(world, stand_in, api))
    collector = Collector(using="default")
    collector.collect([world.a.tenant])
    taken = {model: {row.pk for row in rows} for model, rows in collector.data.items()}
    for rows in collector.fast_deletes:
        taken.setdefault(rows.model, set()).update(rows.values_list("pk", flat=True))
    assert tool.http.pk in taken[HttpEndpoint] and taken[OAuthProvider]
