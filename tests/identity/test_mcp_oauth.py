"""OAuth for MCP clients end to end (docs/identity.md, "OAuth for MCP clients"): the `mcp` SDK's own OAuth client
(`OAuthClientProvider`) finds Toolkeeper's authorization server from `/mcp/`'s 401, registers itself, sends the
person to the consent page (Chromium, driven by Playwright: the console's login, then the tenant and the agent),
and connects with the tokens it gets. Its calls are the person's, verified; tokens for another audience, expired
ones and revoked ones are refused."""
from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import urllib.error
import urllib.parse
import urllib.request
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
import pytest
from mcp.client import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata

from tests.browser import CHROMIUM, CHROMIUM_ARGS, chromium_or_skip
from tests.identity.documents import DocumentServer
from tests.live.server import LiveServer, free_port

pytestmark = [pytest.mark.live, pytest.mark.xdist_group("mcp-oauth")]

STEP_MS = 20_000


@pytest.fixture(scope="module")
def documents():
    """Clients' metadata documents over HTTPS on this machine (tests/identity/documents.py)."""
    served = DocumentServer()
    yield served
    served.stop()


@pytest.fixture(scope="module")
def server(documents):
    chromium_or_skip()
    # the document server is on this machine and under a test authority: Toolkeeper may reach it and trust it
    env = {"TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS": "127.0.0.1", "TOOLKEEPER_OUTBOUND_CA_FILE": str(documents.ca_file)}
    with LiveServer(extra_env=env) as live:
        yield live
        print(f"--- server log ---\n{live.log_tail(20000)}")


class MemoryStorage:
    """The client's token storage (the SDK's `TokenStorage` protocol), in memory."""

    def __init__(self):
        self.tokens = None
        self.client_info = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client_info

    async def set_client_info(self, client_info):
        self.client_info = client_info


class Person:
    """The person at the browser: signs in to the console when the consent page asks, then answers it."""

    def __init__(self, server, who: str, *, agent: str, tenant: str = "demo", allow: bool = True):
        self.server, self.who, self.agent, self.tenant, self.allow = server, who, agent, tenant, allow
        self.callback_port = free_port()
        self.redirect_uri = f"http://127.0.0.1:{self.callback_port}/callback"
        self.returned: str | None = None
        self.consent_text = ""

    def answer(self, authorization_url: str) -> None:
        from playwright.sync_api import sync_playwright

        member = self.server.credentials[self.who]
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_context().new_page()
                page.set_default_timeout(STEP_MS)
                # the client's callback listener: the browser's last stop, caught here
                page.route(f"{self.redirect_uri}**", self._caught)
                page.goto(authorization_url)
                page.wait_for_url(re.compile(r"/login/\?next="))
                page.fill("#id_username", member["username"])
                page.fill("#id_password", member["password"])
                page.click("button[type=submit]")
                page.wait_for_url(re.compile(r"/oauth/consent/\?request="))
                self.consent_text = page.inner_text("main")
                page.select_option("select[name=tenant]", self.tenant)
                page.fill("input[name=agent]", self.agent)
                page.click("#allow" if self.allow else "#deny")
                page.wait_for_url(f"{self.redirect_uri}**")
                self.returned = page.url
            finally:
                browser.close()

    @staticmethod
    def _caught(route) -> None:
        route.fulfill(status=200, body="You can close this window.")

    async def redirect_handler(self, url: str) -> None:
        await anyio.to_thread.run_sync(self.answer, url)

    async def callback_handler(self) -> AuthorizationCodeResult:
        query = parse_qs(urlsplit(self.returned).query)
        if "error" in query:
            raise RuntimeError(f"refused: {query['error'][0]}")
        return AuthorizationCodeResult(code=query["code"][0], state=query["state"][0], iss=query.get("iss", [None])[0])


def oauth_client(server, person: Person, storage: MemoryStorage, **more) -> OAuthClientProvider:
    metadata = OAuthClientMetadata(client_name="Test IDE", redirect_uris=[person.redirect_uri],
                                   grant_types=["authorization_code", "refresh_token"], response_types=["code"],
                                   **({"token_endpoint_auth_method": "none"} if more else {}))
    return OAuthClientProvider(server_url=f"{server.url}/mcp/", client_metadata=metadata, storage=storage,
                               redirect_handler=person.redirect_handler, callback_handler=person.callback_handler,
                               **more)


def connect(server, auth, work):
    async def main():
        async with httpx2.AsyncClient(auth=auth, timeout=60) as http_client:
            transport = streamable_http_client(f"{server.url}/mcp/", http_client=http_client)
            async with Client(transport) as client:
                return await work(client)
    return anyio.run(main)


def leaves(error: BaseException) -> list[BaseException]:
    """The exceptions an exception group holds, however deep."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


def rows(server, sql: str, *args) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(server.data_dir / "common.sqlite3")) as db:
        return db.execute(sql, args).fetchall()


def post_mcp(server, token: str, path: str = "/mcp/") -> tuple[int, dict, str]:
    """A connection's opening request (`initialize`) with `token`: 200 when the token is good."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}).encode()
    request = urllib.request.Request(f"{server.url}{path}", data=body, method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, {k.lower(): v for k, v in refused.headers.items()}, refused.read().decode()


def test_the_sdk_client_connects_through_consent_and_its_calls_are_the_persons(server):
    person = Person(server, "reviewer", agent="ide-bot")
    storage = MemoryStorage()

    async def work(client):
        tools = [tool.name for tool in (await client.list_tools()).tools]
        result = await client.call_tool("current_time", {"timezone": "UTC"})
        return tools, result

    tools, result = connect(server, oauth_client(server, person, storage), work)
    assert "current_time" in tools and not result.is_error
    # the consent page said who asks, as whom, and where the browser goes next
    assert "Test IDE asks to use Toolkeeper as you, reviewer" in " ".join(person.consent_text.split())
    assert f"127.0.0.1:{person.callback_port}" in person.consent_text

    reviewer = server.credentials["reviewer"]["username"]
    sessions = rows(server, "SELECT s.user, s.user_verified, s.agent, s.id FROM tools_agentsession s "
                            "WHERE s.agent = 'ide-bot'")
    assert [(user, verified, agent) for user, verified, agent, _ in sessions] == [(reviewer, 1, "ide-bot")]
    calls = rows(server, "SELECT tool_name, status FROM tools_toolcall WHERE session_id = ?",
                 sessions[0][3].replace("-", ""))
    assert calls == [("current_time", "succeeded")]
    verbs = [verb for (verb,) in rows(server, "SELECT verb FROM audit_event WHERE verb LIKE 'oauth.%' ORDER BY id")]
    assert verbs == ["oauth.consented", "oauth.granted"]

    token = storage.tokens.access_token
    assert token.startswith("tko_")
    # the token is bound to /mcp/: the REST API refuses it
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(f"{server.url}/api/v1/sessions",
                                                      headers={"Authorization": f"Bearer {token}"}), timeout=30)
    assert refused.value.code == 401
    # stored as a hash only
    assert rows(server, "SELECT count(*) FROM tenancy_oauthtoken WHERE token_hash = ?", token) == [(0,)]


def test_a_401_names_the_resource_metadata_and_the_documents_lead_to_the_server(server):
    status, headers, _ = post_mcp(server, "tko_not-a-token")
    assert status == 401
    challenge = headers["www-authenticate"]
    assert 'error="invalid_token"' in challenge
    assert f'resource_metadata="{server.url}/.well-known/oauth-protected-resource/mcp"' in challenge
    with urllib.request.urlopen(f"{server.url}/.well-known/oauth-protected-resource/mcp", timeout=30) as response:
        resource = json.loads(response.read())
    assert resource["resource"] == f"{server.url}/mcp/"
    assert resource["authorization_servers"] == [server.url]
    with urllib.request.urlopen(f"{server.url}/.well-known/oauth-authorization-server", timeout=30) as response:
        metadata = json.loads(response.read())
    assert metadata["issuer"] == server.url
    assert metadata["code_challenge_methods_supported"] == ["S256"]
    assert metadata["authorization_endpoint"] == f"{server.url}/oauth/authorize"


def test_expired_revoked_and_denied_tokens_are_refused(server):
    person = Person(server, "operator", agent="expiring-bot")
    storage = MemoryStorage()
    auth = oauth_client(server, person, storage)

    async def listed(client):
        return [tool.name for tool in (await client.list_tools()).tools]

    assert "current_time" in connect(server, auth, listed)
    token = storage.tokens.access_token
    assert post_mcp(server, token)[0] == 200

    # expired: the SDK client refreshes; the old token stays refused
    server.manage("shell", "-c", "from django.utils import timezone; from datetime import timedelta; "
                                 "from tenancy.models import OAuthToken; OAuthToken.objects.filter(kind='access')"
                                 ".update(expires_at=timezone.now() - timedelta(seconds=1))")
    assert post_mcp(server, token)[0] == 401
    assert "current_time" in connect(server, auth, listed)  # with a refreshed token, without the browser
    fresh = storage.tokens.access_token
    assert fresh != token and post_mcp(server, fresh)[0] == 200

    # revoked by the client at the revocation endpoint: every token of the grant stops
    client_info = storage.client_info
    form = {"token": fresh, "client_id": client_info.client_id}
    if client_info.client_secret:
        form["client_secret"] = client_info.client_secret
    request = urllib.request.Request(f"{server.url}/oauth/revoke", method="POST",
                                     data=urllib.parse.urlencode(form).encode(),
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    assert post_mcp(server, fresh)[0] == 401
    assert rows(server, "SELECT count(*) FROM tenancy_apikey k JOIN tenancy_oauthgrant g ON g.api_key_id = k.id "
                        "WHERE k.agent = 'expiring-bot' AND k.revoked_at IS NULL") == [(0,)]

    # a person who denies: the client hears access_denied, nothing is granted
    denier = Person(server, "reviewer2", agent="denied-bot", allow=False)
    with pytest.raises(BaseException) as refused:
        connect(server, oauth_client(server, denier, MemoryStorage()), listed)
    assert "refused: access_denied" in " ".join(str(e) for e in leaves(refused.value))
    assert rows(server, "SELECT count(*) FROM tenancy_apikey WHERE agent = 'denied-bot'") == [(0,)]


def test_a_client_named_by_its_metadata_document_connects_without_registering(server, documents):
    person = Person(server, "operator", agent="doc-bot")
    url = documents.url("/clients/doc-ide.json")
    documents.put("/clients/doc-ide.json", {
        "client_id": url, "client_name": "Document IDE", "redirect_uris": [person.redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
        "token_endpoint_auth_method": "none"})
    registered = rows(server, "SELECT count(*) FROM tenancy_oauthclient WHERE kind = 'registered'")
    storage = MemoryStorage()

    async def listed(client):
        return [tool.name for tool in (await client.list_tools()).tools]

    assert "current_time" in connect(server, oauth_client(server, person, storage, client_metadata_url=url), listed)
    assert storage.client_info.client_id == url
    assert "Document IDE asks to use Toolkeeper" in " ".join(person.consent_text.split())
    assert f"identified by its metadata document at 127.0.0.1:{documents.port}" in person.consent_text
    assert rows(server, "SELECT count(*) FROM tenancy_oauthclient WHERE kind = 'registered'") == registered
    assert rows(server, "SELECT kind FROM tenancy_oauthclient WHERE client_id = ?", url) == [("document",)]
