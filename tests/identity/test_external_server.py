"""An external authorization server's tokens on `/mcp/` (docs/identity.md, "An external authorization server"):
with `TOOLKEEPER_MCP_OAUTH=external`, the `mcp` SDK's OAuth client finds the company's server (here the npm
`oidc-provider`, which also signs people in to the console) from `/mcp/`'s metadata, registers there, gets a JWT
access token for the MCP endpoint, and calls as the person, verified."""
import contextlib
import re
import sqlite3
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
import pytest
from mcp.client import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata

from tests.browser import CHROMIUM, CHROMIUM_ARGS, chromium_or_skip
from tests.identity.provider import deployment_with
from tests.identity.test_mcp_oauth import MemoryStorage
from tests.live.server import free_port

pytestmark = [pytest.mark.live, pytest.mark.xdist_group("external-as")]

STEP_MS = 20_000


@pytest.fixture(scope="module")
def setup():
    chromium_or_skip()
    accounts = {"heidi": {"email": "heidi@example.com", "groups": ["toolkeeper:demo:operator"]}}
    with deployment_with(accounts, TOOLKEEPER_OIDC_ROLES_CLAIM="groups", TOOLKEEPER_MCP_OAUTH="external",
                         TOOLKEEPER_MCP_OAUTH_ISSUER="{issuer}") as both:  # the provider is the company's server too
        yield both


def rows(server, sql: str, *args) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(server.data_dir / "common.sqlite3")) as db:
        return db.execute(sql, args).fetchall()


def test_the_sdk_client_calls_with_the_company_servers_token(setup):
    provider, server = setup
    callback = f"http://127.0.0.1:{free_port()}/callback"
    returned = {}

    def browse(url: str | None) -> None:
        from playwright.sync_api import sync_playwright
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_context().new_page()
                page.set_default_timeout(STEP_MS)
                if url is None:  # the person signs in to the console once: Toolkeeper knows them from then on
                    page.goto(f"{server.url}/t/demo/")
                    page.click("#sso")
                else:
                    page.route(f"{callback}**", lambda route: route.fulfill(status=200, body="done"))
                    page.goto(url)
                page.wait_for_url(f"{provider.issuer}/interaction/**")
                page.fill("input[name=login]", "heidi")
                page.fill("input[name=password]", "any password")
                page.click("button[type=submit]")
                if url is None:
                    page.wait_for_url(f"{server.url}/t/demo/")
                    return
                page.wait_for_url(re.compile(rf"^{re.escape(callback)}|/interaction/"))
                if "/interaction/" in page.url:  # the provider asks the person to consent to the client
                    assert "agent" in page.inner_text("body")
                    page.click("button[type=submit]")
                    page.wait_for_url(f"{callback}**")
                returned["url"] = page.url
            finally:
                browser.close()

    browse(None)
    assert rows(server, "SELECT subject FROM tenancy_identity") == [("heidi",)]

    async def redirect_handler(url: str) -> None:
        await anyio.to_thread.run_sync(browse, url)

    async def callback_handler() -> AuthorizationCodeResult:
        query = parse_qs(urlsplit(returned["url"]).query)
        return AuthorizationCodeResult(code=query["code"][0], state=query["state"][0],
                                       iss=query.get("iss", [None])[0])

    storage = MemoryStorage()
    auth = OAuthClientProvider(
        server_url=f"{server.url}/mcp/", storage=storage, redirect_handler=redirect_handler,
        callback_handler=callback_handler,
        client_metadata=OAuthClientMetadata(client_name="Company IDE", redirect_uris=[callback],
                                            grant_types=["authorization_code"], response_types=["code"]))

    async def main():
        headers = {"X-Toolkeeper-Tenant": "demo", "X-Toolkeeper-Agent": "heidi-ide"}
        async with (httpx2.AsyncClient(auth=auth, headers=headers, timeout=60) as http_client,
                    Client(streamable_http_client(f"{server.url}/mcp/", http_client=http_client)) as client):
            tools = [tool.name for tool in (await client.list_tools()).tools]
            result = await client.call_tool("current_time", {"timezone": "UTC"})
            return tools, result

    tools, result = anyio.run(main)
    assert "current_time" in tools and not result.is_error
    assert storage.tokens.access_token.count(".") == 2  # the company server's JWT, not one of Toolkeeper's
    assert storage.client_info.client_id and rows(server, "SELECT count(*) FROM tenancy_oauthclient "
                                                          "WHERE kind = 'registered'") == [(0,)]
    assert rows(server, "SELECT user, user_verified FROM tools_agentsession WHERE agent = 'heidi-ide'") == [
        ("heidi@example.com", 1)]
    assert rows(server, "SELECT count(*) FROM audit_event WHERE verb = 'oauth.granted'") == [(1,)]
