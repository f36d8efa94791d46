"""The console and the MCP endpoint: a session's page says whether it is served over /mcp/, and the API-key
pages give the endpoint's URL and a ready-to-paste client configuration (the secret only right after creation)."""
import html
import json
import re
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone

from tenancy.services import apikey_create, apikey_revoke
from tests.console.test_apikeys import KEY_RE, create_key
from tools.catalog.selectors import mcp_presence_key
from tools.catalog.services import session_create
from tools.gateway import pages as mcp_clients
from tools.gateway import protocol as mcp_endpoint
from tools.gateway.protocol import McpCaller, mcp_presence_note

pytestmark = pytest.mark.django_db

MCP_URL = "http://testserver/mcp/"
STATE_RE = re.compile(r'id="session-mcp" data-mcp-state="([\w-]+)"')
CONFIG_RE = re.compile(r'<pre [^>]*data-mcp-config="(\d+)"[^>]*>(.*?)</pre>', re.S)


def configs(page: str) -> dict[int, dict]:
    """Every client configuration on a page, parsed, by the id of its key."""
    found = {int(pk): json.loads(html.unescape(text)) for pk, text in CONFIG_RE.findall(page)}
    assert len(found) == len(CONFIG_RE.findall(page)), "one configuration per key"
    return found


def server_of(config: dict) -> dict:
    assert list(config) == ["mcpServers"]
    (server,) = config["mcpServers"].values()
    assert server["type"] == "http"
    return server


def session_page(world, session) -> str:
    """The session's page as text (entities decoded)."""
    response = world.a.console("viewer").get(f"/t/acme/sessions/{session.pk}/")
    assert response.status_code == 200
    return html.unescape(response.content.decode())


def note_presence(session, api_key):
    """What the endpoint does for each request it serves (forced: the per-process throttle is not under test)."""
    mcp_presence_note(McpCaller(api_key=api_key, session=session, opened=False), force=True)


# --- the session page ----------------------------------------------------------------------------------

def test_a_session_not_heard_from_over_mcp_is_not_connected(world):
    page = session_page(world, world.a.session)
    assert STATE_RE.search(page).group(1) == "not-connected"
    assert "Not connected over MCP" in page and "Connected over MCP" not in page
    assert "no request over /mcp/ in the last 2 min" in page
    assert "Opened by an MCP client" not in page and "Opened over MCP" not in page


def test_a_rest_session_an_mcp_client_attached_to_is_connected(world):
    session = world.a.session  # made through the REST API
    note_presence(session, world.a.key_objects["agent"])
    page = session_page(world, session)
    assert STATE_RE.search(page).group(1) == "connected"
    assert re.search(r"Connected over MCP</span> — last request <time [^>]+>(now|\d+ s ago)</time>", page)
    assert "(an MCP client attached to this session)" in page
    assert "Opened by an MCP client" not in page  # the app opened it, not an MCP client
    # another session of the tenant is not the one heard from
    other = session_create(tenant=world.a.tenant, agent="support-bot", api_key=world.a.key_objects["agent"])
    assert STATE_RE.search(session_page(world, other)).group(1) == "not-connected"


@pytest.mark.parametrize(("kind", "how", "opened_by"), [
    (mcp_endpoint.CONNECTION_SESSION, "a client connection's own session", "Opened by an MCP client's initialize"),
    (mcp_endpoint.KEY_SESSION, "the API key's MCP session for this agent", "Opened over MCP as the API key's session"),
])
def test_a_session_opened_over_mcp_says_so(world, kind, how, opened_by):
    session = session_create(tenant=world.a.tenant, agent="support-bot", api_key=world.a.key_objects["agent"],
                             context={"mcp": kind})
    page = session_page(world, session)
    assert STATE_RE.search(page).group(1) == "not-connected"
    assert opened_by in page  # even when its client has gone

    note_presence(session, world.a.key_objects["agent"])
    page = session_page(world, session)
    assert STATE_RE.search(page).group(1) == "connected"
    assert f"({how})" in page and opened_by in page


def test_a_session_last_heard_from_too_long_ago_is_not_connected(world):
    session = world.a.session
    at = timezone.now() - timedelta(minutes=5)
    cache.set(mcp_presence_key(session.pk), {"at": at.isoformat(), "how": "attached"}, 60)  # a stale entry
    page = session_page(world, session)
    assert STATE_RE.search(page).group(1) == "not-connected"
    assert re.search(r"last request <time [^>]+>5 min( \d+ s)? ago</time>", page)


def test_an_unreadable_cache_leaves_the_session_page_up(world, monkeypatch):
    def broken(session_id):
        raise ConnectionError("cache down")

    monkeypatch.setattr(mcp_clients, "mcp_presence", broken)
    page = session_page(world, world.a.session)
    assert STATE_RE.search(page).group(1) == "unknown"


def test_a_session_is_connected_for_two_minutes_after_its_last_request(world):
    now = timezone.now()
    session = world.a.session
    for seconds, connected in ((0, True), (12, True), (120, True), (121, False)):
        cache.set(mcp_presence_key(session.pk), {"at": (now - timedelta(seconds=seconds)).isoformat(), "how": "key"})
        presence = mcp_clients.session_mcp_presence(session, now=now)
        assert presence.connected is connected, seconds
    assert presence.window == "2 min"


# --- the page right after a key is made ----------------------------------------------------------------

def _created(client, **data) -> tuple[str, str]:
    page = client.get(create_key(client, **data)["Location"]).content.decode()
    match = KEY_RE.search(page)
    assert match
    return page, match.group(1)


def test_the_new_key_page_gives_a_config_with_the_key_and_the_endpoint(world):
    page, key = _created(world.a.console("admin"))
    assert f'<code id="mcp-url">{MCP_URL}</code>' in page
    (config,) = configs(page).values()
    server = server_of(config)
    assert server["url"] == MCP_URL
    assert server["headers"] == {"Authorization": f"Bearer {key}", "X-Toolkeeper-Agent": "<agent name>"}
    assert "?agent=NAME" in page  # the other way to name the agent
    assert "<agent name>" not in page and "&lt;agent name&gt;" in page  # escaped in the HTML


def test_a_locked_key_config_has_no_agent_header(world):
    page, key = _created(world.a.console("admin"), agent="ci-bot")
    (config,) = configs(page).values()
    assert server_of(config)["headers"] == {"Authorization": f"Bearer {key}"}
    assert "?agent=NAME" not in page


def test_the_config_uses_the_host_the_console_was_reached_by(world, settings):
    settings.ALLOWED_HOSTS = ["toolkeeper.example.com"]
    client = world.a.console("admin")
    response = client.post("/t/acme/keys/new/", {"name": "remote", "scopes": ["agent"]},
                           HTTP_HOST="toolkeeper.example.com", secure=True)
    assert response.status_code == 302
    page = client.get(response["Location"], HTTP_HOST="toolkeeper.example.com", secure=True).content.decode()
    (config,) = configs(page).values()
    assert server_of(config)["url"] == "https://toolkeeper.example.com/mcp/"


def test_a_key_without_the_agent_scope_gets_no_config(world):
    page, key = _created(world.a.console("admin"), scopes=["external", "admin"])
    assert configs(page) == {}
    assert "the MCP endpoint needs a key with the agent scope" in page
    assert page.count(key) == 1  # only where the key itself is shown


def test_the_new_key_page_again_has_a_placeholder_not_the_secret(world):
    client = world.a.console("admin")
    created_url = create_key(client)["Location"]
    first = client.get(created_url).content.decode()
    key = KEY_RE.search(first).group(1)
    again = client.get(created_url).content.decode()
    assert key not in again
    (config,) = configs(again).values()
    prefix = key.split("_")[1]
    assert server_of(config)["headers"]["Authorization"] == f"Bearer <your API key tk_{prefix}_…>"


# --- the list page -------------------------------------------------------------------------------------

def test_the_key_list_shows_the_endpoint_and_configs_without_secrets(world):
    a, b = world.a, world.b
    revoked = apikey_create(tenant=a.tenant, name="old", scopes=["agent"], agent="", created_by=a.users["admin"])
    apikey_revoke(api_key=revoked.api_key, actor=a.users["admin"])
    for role in ("admin", "viewer"):
        page = a.console(role).get("/t/acme/keys/").content.decode()
        assert f'<code id="mcp-url">{MCP_URL}</code>' in page
        found = configs(page)
        assert set(found) == {a.key_objects["agent"].pk, a.key_objects["locked"].pk}  # agent scope, active
        for pk, config in found.items():
            key = a.key_objects["agent"] if pk == a.key_objects["agent"].pk else a.key_objects["locked"]
            server = server_of(config)
            assert server["url"] == MCP_URL
            assert server["headers"]["Authorization"] == f"Bearer <your API key tk_{key.prefix}_…>"
        assert "X-Toolkeeper-Agent" in server_of(found[a.key_objects["agent"].pk])["headers"]
        assert list(server_of(found[a.key_objects["locked"].pk])["headers"]) == ["Authorization"]
        # keys that cannot use MCP say so, in their row
        for label in ("external", "admin"):
            cell = re.search(rf'data-mcp-key="{a.key_objects[label].pk}">(.*?)</td>', page).group(1)
            assert "needs a key with the agent scope" in cell
        cell = re.search(rf'data-mcp-key="{revoked.api_key.pk}">(.*?)</td>', page).group(1)
        assert "Revoked" in cell
        # never a secret, and nothing of the other tenant's keys
        for issued in (*a.keys.values(), *b.keys.values(), revoked.key):
            assert issued not in page and issued.split("_", 2)[2] not in page
        for key in b.key_objects.values():
            assert key.prefix not in page


def test_key_names_and_agent_locks_are_escaped(world):
    apikey_create(tenant=world.a.tenant, name="<b>bold</b>", scopes=["agent"], agent="",
                  created_by=world.a.users["admin"])
    page = world.a.console("viewer").get("/t/acme/keys/").content.decode()
    assert "<b>bold</b>" not in page and "&lt;b&gt;bold&lt;/b&gt;" in page
    assert len(configs(page)) == 3
