"""Each person's own account at an upstream MCP server, end to end (docs/accounts.md): a real upstream that requires
OAuth (tests/accounts/upstream.py, the `mcp` SDK's server authentication) trusting a real authorization server (the
npm `oidc-provider` of the identity tests), a live Toolkeeper, and Chromium for the people.

Toolkeeper's demo members connect their own accounts at the provider (operator is "alice" there, reviewer "bob",
reviewer2 "carol"); their MCP clients reach Toolkeeper with its own OAuth tokens, so each call has a verified
person, and the upstream records whose token each call carried."""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.browser import chromium_context, chromium_or_skip, log_in
from tests.identity.provider import OpenIdProvider
from tests.live.server import ROOT, LiveServer, free_port, port_open

pytestmark = [pytest.mark.live, pytest.mark.xdist_group("upstream-accounts")]

STEP_MS = 20_000
AT_PROVIDER = {"operator": "alice", "reviewer": "bob", "reviewer2": "carol"}
TOOL = "mcp__files__whoami"


class Upstream:
    def __init__(self, issuer: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.api_url = f"http://127.0.0.1:{self.port}/api"  # the HTTP API beside it (tests/accounts/upstream.py)
        self.state = Path(tempfile.mkdtemp(prefix="tk-upstream-")) / "calls.jsonl"
        self.state.touch()
        self.issuer = issuer
        self.process = None

    def start(self) -> Upstream:
        self.process = subprocess.Popen([sys.executable, "-m", "tests.accounts.upstream", str(self.port), self.issuer,
                                         str(self.state)], cwd=ROOT, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not port_open("127.0.0.1", self.port):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the upstream MCP server did not start")
            time.sleep(0.1)
        return self

    def calls(self) -> list[dict]:
        return [json.loads(line) for line in self.state.read_text().splitlines()]

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)


@pytest.fixture(scope="module")
def world():
    chromium_or_skip()
    provider = OpenIdProvider({login: {"email": f"{login}@example.com"} for login in AT_PROVIDER.values()})
    upstream = Upstream(provider.issuer)
    provider.resources[upstream.url] = {"scope": "files", "ttl": 300}
    provider.resources[upstream.api_url] = {"scope": "items", "ttl": 300}
    provider.start()
    upstream.start()
    try:
        with LiveServer(extra_env={"TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS": "127.0.0.1"}) as server:
            admin = httpx.Client(base_url=server.url, headers=server.headers(server.admin_api_key), timeout=30)
            group = admin.post("/api/v1/groups", json={"name": "files", "default_active": True})
            assert group.status_code == 201, group.text
            created = admin.post("/api/v1/mcp-servers", json={
                "name": "files", "transport": "streamable_http", "url": upstream.url, "accounts": "person"})
            assert created.status_code == 201, created.text
            # the server is not trusted: its tools' calls would wait for a reviewer without a rule that allows them
            allowed = admin.post("/api/v1/rules", json={"behavior": "allow", "tool_pattern": "mcp__files__*"})
            assert allowed.status_code == 201, allowed.text
            yield {"server": server, "provider": provider, "upstream": upstream, "admin": admin,
                   "mcp_server": created.json()["id"], "group": group.json()["id"]}
            print(f"--- server log ---\n{server.log_tail(20000)}\n--- provider log ---\n{provider.log_tail()}")
    finally:
        upstream.stop()
        provider.stop()


def rows(server, sql: str, *args) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(server.data_dir / "common.sqlite3")) as db:
        return db.execute(sql, args).fetchall()


def execute(server, sql: str, *args) -> None:
    with contextlib.closing(sqlite3.connect(server.data_dir / "common.sqlite3", timeout=30)) as db:
        db.execute(sql, args)
        db.commit()


def connect_account(world, who: str, *, start: str = "/t/demo/accounts/", at_provider: str | None = None,
                    row: str = "#account-files", scope: str = "files") -> str:
    """`who` signs in to the console and connects their account at the upstream of `row` (`files`; as `at_provider`
    there); the text of the accounts page they come back to."""
    server, provider = world["server"], world["provider"]
    with chromium_context(server.url, step_ms=STEP_MS) as (context, csp):
        page = context.new_page()
        log_in(page, server, start, who=who)
        if "connect=" in start:
            assert "a call needs it" in page.inner_text(row)
        page.click(f"{row} button.connect")
        page.wait_for_url(f"{provider.issuer}/interaction/**")
        page.fill("input[name=login]", at_provider or AT_PROVIDER[who])
        page.fill("input[name=password]", "any password")
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(rf"{re.escape(server.url)}/t/demo/accounts/|/interaction/"))
        if "/interaction/" in page.url:  # the provider's consent page: Toolkeeper asks for the upstream's scope
            assert scope in page.inner_text("body")
            page.click("button[type=submit]")
            page.wait_for_url(f"{server.url}/t/demo/accounts/")
        text = page.inner_text("main")
        csp.assert_clean()
        return text


def mint_clients(server, *people: str) -> dict[str, str]:
    """An MCP client connected to Toolkeeper with OAuth by each of `people` (agent `files-bot`): their tokens.
    (The consent flow itself is tests/identity/test_mcp_oauth.py's; here it only gives each call a person.)"""
    names = {who: server.credentials[who]["username"] for who in people}
    script = ("import json\nfrom django.contrib.auth import get_user_model\nfrom tenancy.models import Tenant\n"
              "from tests.identity.grants import client_connect\n"
              "tenant = Tenant.objects.get(slug='demo')\nout = {}\n"
              f"for who, name in {names!r}.items():\n"
              "    user = get_user_model().objects.get(username=name)\n"
              "    out[who] = client_connect(tenant=tenant, user=user, agent='files-bot', client_id='ide-' + who)[1]\n"
              "print('TOKENS' + json.dumps(out))\n")
    output = server.manage("shell", "-c", script)
    return json.loads(output.split("TOKENS", 1)[1])


def call(server, token: str, *, tool: str = TOOL, arguments: dict | None = None, elicitation=None):
    async def main():
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
            transport = streamable_http_client(f"{server.url}/mcp/", http_client=http)
            async with Client(transport, elicitation_callback=elicitation) as client:
                try:
                    return await client.call_tool(tool, arguments or {})
                except MCPError as exc:  # raised here, not from inside the client's task groups
                    return exc
    outcome = anyio.run(main)
    if isinstance(outcome, MCPError):
        raise outcome
    return outcome


def upstream_saw(result) -> dict:
    """What the upstream's `whoami` answered: whose token the call carried."""
    return json.loads(result.content[0].text)


async def accepts_urls(context, params):  # an MCP client that can open a URL for its person
    raise AssertionError("a URL elicitation comes as the call's error, not as a request")


def sync(world) -> None:
    """List the server's tools (with the listing connection) and offer them to every session."""
    admin = world["admin"]
    synced = admin.post(f"/api/v1/mcp-servers/{world['mcp_server']}/sync")
    assert synced.status_code == 200 and synced.json()["sync"]["status"] == "ok", synced.text
    tools = [tool["name"] for tool in synced.json()["server"]["tools"]]
    assert len(tools) == 2
    updated = admin.patch(f"/api/v1/groups/{world['group']}", json={"tools": tools})
    assert updated.status_code == 200, updated.text


@pytest.fixture(scope="module")
def connected(world):
    """operator (alice) and reviewer (bob) connected their accounts; operator's lists the tools."""
    server = world["server"]
    before = world["admin"].post(f"/api/v1/mcp-servers/{world['mcp_server']}/sync").json()["sync"]
    assert before["status"] == "error" and "no operator has connected" in before["error"], before
    for who in ("operator", "reviewer"):
        page = connect_account(world, who)
        assert "connected" in page and "not connected" not in page.split("files", 1)[1].split("\n", 1)[0]
    sync(world)
    tokens = mint_clients(server, "operator", "reviewer", "reviewer2")
    return {**world, "tokens": tokens}


def test_each_person_calls_upstream_as_themselves(connected):
    server, upstream, tokens = connected["server"], connected["upstream"], connected["tokens"]
    assert rows(server, "SELECT u.username FROM tools_mcpserver s JOIN tools_upstreamaccount a "
                        "ON a.id = s.listing_account_id JOIN auth_user u ON u.id = a.user_id") == [
        (server.credentials["operator"]["username"],)]  # the first operator's connection lists the tools
    for who in ("operator", "reviewer"):
        result = call(server, tokens[who])
        assert not result.is_error, result
        assert upstream_saw(result)["sub"] == AT_PROVIDER[who]
    seen = [(c["tool"], c["sub"]) for c in upstream.calls()]
    assert seen[-2:] == [("whoami", "alice"), ("whoami", "bob")]
    assert ("list_files", "alice") not in seen  # listing uses tools/list, never a call
    # stored encrypted: no token in the database's clear text
    (ciphertext,) = rows(server, "SELECT tokens FROM tools_upstreamaccount LIMIT 1")[0]
    assert "access_token" not in ciphertext and "eyJ" not in ciphertext
    verbs = [v for (v,) in rows(server, "SELECT verb FROM audit_event WHERE verb LIKE 'upstream_account.%'")]
    assert verbs.count("upstream_account.connected") == 2


def test_an_expired_token_is_refreshed_once_for_calls_at_once(connected):
    server, upstream, tokens = connected["server"], connected["upstream"], connected["tokens"]
    operator = server.credentials["operator"]["username"]
    account = ("SELECT a.id, a.refresh_count FROM tools_upstreamaccount a JOIN auth_user u ON u.id = a.user_id "
               "WHERE u.username = ?")
    (account_id, refreshes), = rows(server, account, operator)
    first = upstream_saw(call(server, tokens["operator"]))["jti"]
    # The token's end comes (as the clock would bring it): the next calls, four at once, need a fresh one.
    execute(server, "UPDATE tools_upstreamaccount SET expires_at = '2000-01-01 00:00:00' WHERE id = ?", account_id)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: call(server, tokens["operator"]), range(4)))
    assert all(not r.is_error for r in results), [r.content for r in results if r.is_error]
    jtis = {upstream_saw(r)["jti"] for r in results}
    assert len(jtis) == 1 and first not in jtis  # one refresh, whose token every call used
    assert rows(server, account, operator) == [(account_id, refreshes + 1)]
    # the provider rotates refresh tokens and ends a grant whose old one is used again: one refresh kept it alive
    assert not call(server, tokens["operator"]).is_error
    assert upstream.calls()[-1]["sub"] == "alice"
    refreshed = rows(server, "SELECT count(*) FROM audit_event WHERE verb LIKE '%refresh%'")
    assert refreshed == [(0,)]  # counted on the account, not recorded one by one


def test_a_token_the_upstream_refuses_before_its_end_is_refreshed_and_the_call_runs(connected):
    server, upstream, tokens = connected["server"], connected["upstream"], connected["tokens"]
    operator = server.credentials["operator"]["username"]
    # The access token stops being honoured upstream while Toolkeeper still takes it for valid (as a revocation
    # at the authorization server, or a key rotation, would do): the vault holds one the upstream refuses.
    script = ("from tools.models import UpstreamAccount\n"
              f"account = UpstreamAccount.all_tenants.get(user__username={operator!r}, mcp_server__name='files')\n"
              "account.tokens = {**account.tokens, 'access_token': 'no-longer-honoured'}\n"
              "account.refreshed_at = None\naccount.save()\n")  # not renewed moments ago (those are not again)
    server.manage("shell", "-c", script)
    count = "SELECT a.refresh_count FROM tools_upstreamaccount a JOIN auth_user u ON u.id = a.user_id " \
            "WHERE u.username = ? AND a.mcp_server_id IS NOT NULL"
    (before,), = rows(server, count, operator)
    result = call(server, tokens["operator"])
    assert not result.is_error, result.content
    assert upstream_saw(result)["sub"] == "alice" and upstream.calls()[-1]["sub"] == "alice"
    assert rows(server, count, operator) == [(before + 1,)]  # refreshed once, then sent again


def test_a_person_without_a_connection_is_asked_to_connect_then_the_call_runs(connected):
    server, tokens = connected["server"], connected["tokens"]
    # a client that cannot open URLs gets the link in the error
    plain = call(server, tokens["reviewer2"])
    assert plain.is_error
    text = plain.content[0].text
    assert "AccountNotConnected" in text or "not connected" in text
    assert f"{server.url}/t/demo/accounts/?connect=files" in text
    # a client that can is asked to open it (URL elicitation), and the same call made again runs
    with pytest.raises(MCPError) as asked:
        call(server, tokens["reviewer2"], elicitation=accepts_urls)
    assert asked.value.error.code == -32042
    (elicitation,) = asked.value.error.data["elicitations"]
    assert elicitation["mode"] == "url" and elicitation["url"] == f"{server.url}/t/demo/accounts/?connect=files"
    page = connect_account(connected, "reviewer2", start="/t/demo/accounts/?connect=files")
    assert "connected" in page
    again = call(server, tokens["reviewer2"], elicitation=accepts_urls)
    assert not again.is_error and upstream_saw(again)["sub"] == "carol"
    failed = rows(server, "SELECT error FROM tools_toolcall WHERE status = 'failed' AND tool_name = ?", TOOL)
    assert failed and all(json.loads(e)["errorType"] == "AccountNotConnected" for (e,) in failed)


def test_an_approved_call_runs_with_the_requesters_token_not_the_reviewers(connected):
    server, admin, upstream, tokens = (connected["server"], connected["admin"], connected["upstream"],
                                       connected["tokens"])
    rule = admin.post("/api/v1/rules", json={"behavior": "ask", "tool_pattern": TOOL, "agents": ["files-bot"],
                                             "users": [server.credentials["operator"]["username"]]})
    assert rule.status_code == 201, rule.text
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(call, server, tokens["operator"])
            with chromium_context(server.url, step_ms=STEP_MS) as (context, _):
                page = context.new_page()
                log_in(page, server, "/t/demo/inbox/", who="reviewer")  # bob, who has his own account there
                page.locator("#requests tr[data-id] a").first.click()
                page.click("button[value=approve]")
                page.wait_for_selector("text=approved")
            result = waiting.result(timeout=60)
    finally:
        admin.delete(f"/api/v1/rules/{rule.json()['id']}")
    assert not result.is_error, result
    assert upstream_saw(result)["sub"] == "alice" and upstream.calls()[-1]["sub"] == "alice"


def test_disconnecting_and_leaving_stop_the_calls(connected):
    server, tokens = connected["server"], connected["tokens"]
    with chromium_context(server.url, step_ms=STEP_MS) as (context, _):
        page = context.new_page()
        log_in(page, server, "/t/demo/accounts/", who="reviewer")
        page.click("#account-files button.danger")
        page.wait_for_selector("text=disconnected and its grant revoked there")
    refused = call(server, tokens["reviewer"])
    assert refused.is_error and "connect it at" in refused.content[0].text
    (data,), = rows(server, "SELECT data FROM audit_event WHERE verb = 'upstream_account.disconnected' "
                            "ORDER BY id DESC LIMIT 1")
    assert json.loads(data)["revoked"] is True and json.loads(data)["reason"] == "disconnected"

    # reviewer2 (carol) leaves the tenant: her account goes with her membership
    carol = server.credentials["reviewer2"]["username"]
    server.manage("shell", "-c", "from django.contrib.auth import get_user_model\nfrom tenancy.models import Tenant\n"
                                 "from tenancy.services import membership_remove\n"
                                 f"membership_remove(tenant=Tenant.objects.get(slug='demo'), "
                                 f"user=get_user_model().objects.get(username={carol!r}))\n")
    assert rows(server, "SELECT count(*) FROM tools_upstreamaccount a JOIN auth_user u ON u.id = a.user_id "
                        "WHERE u.username = ?", carol) == [(0,)]
    (data,), = rows(server, "SELECT data FROM audit_event WHERE verb = 'upstream_account.disconnected' "
                            "ORDER BY id DESC LIMIT 1")
    assert json.loads(data)["reason"] == "membership_removed"
    with pytest.raises(Exception):  # noqa: B017 - her MCP client's grant ended too: the connection is refused
        call(server, tokens["reviewer2"])


# --- HTTP tools: an operator's OAuth providers -------------------------------------------------------------

def register_client(provider, **metadata) -> dict:
    """A client registered at the provider, as an operator registers Toolkeeper at an API's authorization server."""
    registered = httpx.post(f"{provider.issuer}/reg", json=metadata, timeout=30)
    assert registered.status_code == 201, registered.text
    return registered.json()


@pytest.fixture(scope="module")
def http_apis(connected):
    """The upstream's HTTP API as two HTTP tools: `crm_service` through a service account (client credentials),
    `crm_mine` through each person's own account; both offered to every session."""
    server, provider, admin, upstream = (connected["server"], connected["provider"], connected["admin"],
                                         connected["upstream"])
    metadata = httpx.get(f"{provider.issuer}/.well-known/openid-configuration", timeout=30).json()
    service = register_client(provider, grant_types=["client_credentials"], response_types=[], redirect_uris=[],
                              token_endpoint_auth_method="client_secret_basic", scope="items")
    person = register_client(provider, grant_types=["authorization_code", "refresh_token"], response_types=["code"],
                             redirect_uris=[f"{server.url}/account/upstream/callback/"],
                             token_endpoint_auth_method="none")
    common = {"api_url": upstream.api_url, "token_endpoint": metadata["token_endpoint"],
              "resource": upstream.api_url, "scopes": "items",
              "revocation_endpoint": metadata["revocation_endpoint"]}
    for body in ({"name": "crm-service", "accounts": "service", **common,
                  "client": {"client_id": service["client_id"], "client_secret": service["client_secret"]}},
                 {"name": "crm", "accounts": "person", "issuer": metadata["issuer"],
                  "authorization_endpoint": metadata["authorization_endpoint"], **common,
                  "client": {"client_id": person["client_id"]}}):
        created = admin.post("/api/v1/oauth-providers", json=body)
        assert created.status_code == 201, created.text
        assert "client_secret" not in created.text and service["client_secret"] not in created.text
    for name, provider_name in (("crm_service", "crm-service"), ("crm_mine", "crm")):
        created = admin.post("/api/v1/http-tools", json={
            "name": name, "method": "GET", "url": f"{upstream.api_url}/whoami", "read_only": True,
            "oauth_provider": provider_name})
        assert created.status_code == 201, created.text
    group = admin.get(f"/api/v1/groups/{connected['group']}").json()
    updated = admin.patch(f"/api/v1/groups/{connected['group']}", json={"tools": [*group["tools"], "crm_service",
                                                                                   "crm_mine"]})
    assert updated.status_code == 200, updated.text
    return {**connected, "service_client": service["client_id"]}


def test_an_http_tool_of_a_service_account_calls_with_the_clients_own_token(http_apis):
    server, upstream, tokens = http_apis["server"], http_apis["upstream"], http_apis["tokens"]
    results = [call(server, tokens["operator"], tool="crm_service") for _ in range(2)]
    assert all(not r.is_error for r in results), [r.content for r in results]
    seen = [json.loads(r.content[0].text) for r in results]
    assert {s["client_id"] for s in seen} == {http_apis["service_client"]}  # no person's: the service's
    assert len({s["jti"] for s in seen}) == 1  # one client-credentials token, kept for the next call
    assert upstream.calls()[-1]["tool"] == "api"
    assert rows(server, "SELECT count(*) FROM tools_upstreamaccount WHERE user_id IS NULL") == [(1,)]


def test_an_http_tool_of_each_persons_account_calls_as_the_person(http_apis):
    server, upstream, tokens = http_apis["server"], http_apis["upstream"], http_apis["tokens"]
    # bob has not connected his account at the API: the link to do so, naming the provider
    refused = call(server, tokens["reviewer"], tool="crm_mine")
    assert refused.is_error and f"{server.url}/t/demo/accounts/?connect=http%3Acrm" in refused.content[0].text
    page = connect_account(http_apis, "operator", row="#account-httpcrm", scope="items")
    assert "connected" in page.split("crm", 1)[1].split("\n", 1)[0]
    result = call(server, tokens["operator"], tool="crm_mine")
    assert not result.is_error, result.content
    assert json.loads(result.content[0].text)["sub"] == "alice" and upstream.calls()[-1]["sub"] == "alice"
    (target,), = rows(server, "SELECT target FROM audit_event WHERE verb = 'upstream_account.connected' "
                              "ORDER BY id DESC LIMIT 1")
    assert target == "oauth_provider:crm"
