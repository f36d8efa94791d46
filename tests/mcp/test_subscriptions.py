"""Resource subscriptions on `/mcp/` (docs/mcp.md, "Resources and subscriptions"), in the distributed mode: two
server processes on one PostgreSQL database and one Redis.

- A 2025-era SDK client subscribes to a skill's file; a new version of the skill, published through the API of the
  other process, reaches its notification stream as `notifications/resources/updated` for that URI, and for no
  file it did not subscribe to; a client of another tenant hears nothing of it. Unsubscribing stops them; a new
  file of the skill is a changed resource list.
- A resource the session may not read cannot be subscribed to (-32602), saying nothing of whether it exists; the
  bounds are refused the same way.
- A 2026-era client names its resources in `subscriptions/listen`.
- A notification stream resumed with `Last-Event-ID` after a change it missed says the resources were updated.
"""
import json
import warnings

import anyio
import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from tests.live.conftest import _missing, _require_postgres, live_redis_url
from tests.live.server import LiveServer, temporary_pg_database
from tests.mcp.test_streams import headers_of, new_session, rest, sse_events

pytestmark = pytest.mark.live

UPDATED = "notifications/resources/updated"
RESOURCES_CHANGED = "notifications/resources/list_changed"
TOOLS_CHANGED = "notifications/tools/list_changed"


@pytest.fixture(scope="module")
def servers():
    _require_postgres()
    redis_url = live_redis_url()
    if not redis_url:
        _missing("Redis (127.0.0.1:6379)")
    with temporary_pg_database(migrated_for="toolkeeper.settings") as (name, url), LiveServer(
            database_url=url, database_name=name, redis_url=redis_url, migrated=True) as first:
        first.manage("createtenant", "initech")
        for name_, scopes in (("b_key", "agent"), ("b_admin", "admin")):
            first.credentials[name_] = json.loads(first.manage(
                "createapikey", "--tenant", "initech", "--scopes", scopes, "--json"))["key"]
        second = first.sibling()
        try:
            yield first, second
        finally:
            second.stop()


def skill_files(name: str, body: str, **extra: str) -> dict:
    return {"files": {"SKILL.md": f"---\nname: {name}\ndescription: Notes to watch.\n---\n{body}\n", **extra}}


def publish(server, key: str, name: str, body: str, **extra: str) -> None:
    """As an operator, through `server`'s API: a version of the skill `name` with these files."""
    rest(server, "POST", "/api/v1/skills", skill_files(name, body, **extra), key=key)


class Watcher:
    """A 2025-era SDK client on one session, and the change notifications its notification stream brought."""

    def __init__(self, server, session: str, key: str | None = None):
        self.server, self.session, self.key = server, session, key
        self.heard: list[tuple[str, str | None]] = []  # (method, uri)
        self.arrived = anyio.Event()
        self.streaming = anyio.Event()
        self.client: Client | None = None

    async def _response(self, response) -> None:
        if response.request.method == "GET" and response.status_code == 200:
            self.streaming.set()

    async def _message(self, message) -> None:
        method = getattr(message, "method", None)
        if method in (UPDATED, RESOURCES_CHANGED, TOOLS_CHANGED):
            params = getattr(message, "params", None)
            self.heard.append((method, getattr(params, "uri", None)))
            self.arrived.set()

    async def until(self, method: str) -> list[tuple[str, str | None]]:
        """Everything heard up to and including the next `method`, which is then forgotten."""
        return await self._heard_through(
            lambda heard: next((i for i, (m, _) in enumerate(heard) if m == method), None))

    async def until_all(self, expected: list[tuple[str, str | None]]) -> list[tuple[str, str | None]]:
        """Everything heard up to the moment each of `expected` was heard, which is then forgotten: one change may
        be said in more than one batch (a version and a groups' switch read in two looks), in either order."""
        return await self._heard_through(
            lambda heard: max(heard.index(item) for item in expected) if all(i in heard for i in expected) else None)

    async def _heard_through(self, last_of) -> list[tuple[str, str | None]]:
        """Waits until `last_of(heard)` names a position, then hands over what was heard through it."""
        with anyio.fail_after(30):
            while (at := last_of(self.heard)) is None:
                self.arrived = anyio.Event()
                await self.arrived.wait()
        heard, self.heard = self.heard[:at + 1], self.heard[at + 1:]
        return heard

    async def subscribe(self, uri: str) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await self.client.subscribe_resource(uri)

    async def unsubscribe(self, uri: str) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await self.client.unsubscribe_resource(uri)

    def connect(self):
        http_client = httpx2.AsyncClient(headers={**self.server.headers(self.key),
                                                  "X-Toolkeeper-Session": self.session},
                                         timeout=30, event_hooks={"response": [self._response]})
        transport = streamable_http_client(f"{self.server.url}/mcp/", http_client=http_client)
        return Client(transport, mode="legacy", message_handler=self._message)


def switch_groups(server, session: str, groups: dict, key: str | None = None) -> None:
    """The session's app switches its groups over REST: a tools/list_changed that marks where a change ends."""
    answer = rest(server, "POST", f"/api/v1/sessions/{session}/calls",
                  {"name": "reset_tools", "input": groups, "wait": 10}, key=key)
    assert answer["calls"][0]["status"] == "succeeded", answer


def test_a_new_version_published_in_another_process_reaches_the_subscribers_of_its_files(servers):
    first, second = servers
    admin, b_key, b_admin = first.admin_api_key, first.credentials["b_key"], first.credentials["b_admin"]
    publish(first, admin, "watched-notes", "v1", **{"notes.md": "n1"})
    publish(first, b_admin, "watched-notes", "tenant B's v1")  # the same name, in the other tenant
    a = Watcher(first, new_session(first, "sub-bot"))
    b = Watcher(first, new_session(first, "sub-bot", key=b_key), key=b_key)
    skill_md, notes = "skill://watched-notes/SKILL.md", "skill://watched-notes/notes.md"
    seen: dict = {}

    async def main():
        async with a.connect() as a.client, b.connect() as b.client:
            with anyio.fail_after(30):
                await a.streaming.wait()
                await b.streaming.wait()
            resources = a.client.server_capabilities.resources
            seen["capabilities"] = (resources.subscribe, resources.list_changed)
            await a.subscribe(skill_md)
            await b.subscribe(skill_md)  # tenant B's own skill of that name

            # a new version, in the other process: SKILL.md and notes.md both change
            await anyio.to_thread.run_sync(lambda: publish(second, admin, "watched-notes", "v2", **{"notes.md": "n2"}))
            await anyio.to_thread.run_sync(switch_groups, second, a.session, {"ops": True})
            seen["v2"] = await a.until_all([(UPDATED, skill_md), (TOOLS_CHANGED, None)])
            seen["read v2"] = (await a.client.read_resource(skill_md)).contents[0].text

            # the subscription moves from SKILL.md to notes.md; a new file changes the resource list
            await a.unsubscribe(skill_md)
            await a.unsubscribe("skill://watched-notes/never-subscribed.md")  # fine
            await a.subscribe(notes)
            await anyio.to_thread.run_sync(lambda: publish(
                second, admin, "watched-notes", "v3", **{"notes.md": "n3", "more.md": "m"}))
            await anyio.to_thread.run_sync(switch_groups, second, a.session, {"ops": False})
            seen["v3"] = await a.until_all([(RESOURCES_CHANGED, None), (UPDATED, notes), (TOOLS_CHANGED, None)])

            # tenant B heard nothing of tenant A's versions; its own new version reaches it
            await anyio.to_thread.run_sync(lambda: publish(second, b_admin, "watched-notes", "tenant B's v2"))
            seen["b"] = await b.until(UPDATED)

    anyio.run(main)
    assert seen["capabilities"] == (True, True)
    # (the version and the groups' switch may be compared as one change: the order within it is not the point)
    assert sorted(seen["v2"], key=str) == sorted([(UPDATED, skill_md), (TOOLS_CHANGED, None)], key=str)
    assert "v2" in seen["read v2"]  # not notes.md above: not subscribed
    assert sorted(seen["v3"], key=str) == sorted([(RESOURCES_CHANGED, None), (UPDATED, notes), (TOOLS_CHANGED, None)],
                                                 key=str)
    assert seen["b"] == [(UPDATED, skill_md)]


def test_only_what_the_session_may_read_can_be_subscribed_to_within_bounds(servers):
    first, _ = servers
    b_admin = first.credentials["b_admin"]
    publish(first, b_admin, "b-secret", "tenant B's alone")
    session = new_session(first, "sub-bounds")
    a = Watcher(first, session)
    refused: dict = {}

    async def main():
        async with a.connect() as a.client:
            for label, uri in (("foreign", "skill://b-secret/SKILL.md"), ("missing", "skill://no-such/SKILL.md"),
                               ("outside", "skill://incident-triage/../b-secret/SKILL.md"),
                               ("not a uri", "skill://[x/SKILL.md"), ("long", "skill://" + "x" * 1000)):
                with pytest.raises(MCPError) as error:
                    await a.subscribe(uri)
                refused[label] = (error.value.code, error.value.error.message.replace(uri[:300], "<uri>"))

    anyio.run(main)
    assert {code for code, _ in refused.values()} == {-32602}
    # another tenant's resource is refused in the same words as one that does not exist
    assert refused["foreign"][1] == refused["missing"][1] == refused["outside"][1] == refused["not a uri"][1]
    assert "1000 characters" in refused["long"][1]
    context = first.manage("shell", "-c", f"from tools.models import AgentSession; "
                                          f"print(AgentSession.all_tenants.get(pk='{session}').context)")
    assert "mcp_resource_subscriptions" not in context  # nothing was remembered


def test_a_2026_era_client_names_its_resources_when_it_listens(servers):
    first, second = servers
    admin = first.admin_api_key
    publish(first, admin, "listened-notes", "v1", **{"notes.md": "n1"})
    session = new_session(first, "listen-bot")
    uri = "skill://listened-notes/SKILL.md"
    seen: dict = {}

    async def main():
        http_client = httpx2.AsyncClient(headers={**first.headers(), "X-Toolkeeper-Session": session}, timeout=30)
        transport = streamable_http_client(f"{first.url}/mcp/", http_client=http_client)
        async with Client(transport, mode="auto") as client:
            with pytest.raises(MCPError) as too_many:
                async with client.listen(resource_subscriptions=[f"{uri}?{n}" for n in range(101)]):
                    pass
            seen["too many"] = too_many.value.code
            async with client.listen(resources_list_changed=True, resource_subscriptions=[uri]) as subscription:
                seen["honored"] = (subscription.honored.resources_list_changed,
                                   subscription.honored.resource_subscriptions)
                await anyio.to_thread.run_sync(lambda: publish(second, admin, "listened-notes", "v2",
                                                               **{"notes.md": "n2", "new.md": "x"}))
                with anyio.fail_after(30):
                    seen["events"] = [await subscription.__anext__(), await subscription.__anext__()]

    anyio.run(main)
    assert seen["too many"] == -32602
    assert seen["honored"] == (True, [uri])
    assert [type(event).__name__ for event in seen["events"]] == ["ResourcesListChanged", "ResourceUpdated"]
    assert seen["events"][1].uri == uri


def test_a_notification_stream_resumed_after_a_new_version_says_the_subscribed_resources_were_updated(servers):
    first, second = servers
    admin = first.admin_api_key
    publish(first, admin, "resumed-notes", "v1")
    session = new_session(first, "resume-sub-bot")
    uri = "skill://resumed-notes/SKILL.md"
    headers = headers_of(first, session)
    with httpx2.Client(timeout=30) as http:
        subscribe = {"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe", "params": {"uri": uri}}
        answer = http.post(f"{first.url}/mcp/", json=subscribe, headers=headers)
        assert answer.status_code == 200, answer.text
        with http.stream("GET", f"{first.url}/mcp/", headers={**headers, "Accept": "text/event-stream"}) as stream:
            assert stream.status_code == 200
            last, _ = next(sse_events(stream.iter_lines()))  # the stream's opening event; then the client is away
        publish(second, admin, "resumed-notes", "v2")  # missed while away
        resume = {**headers_of(second, session), "Last-Event-ID": last, "Accept": "text/event-stream"}
        with http.stream("GET", f"{second.url}/mcp/", headers=resume) as stream:
            assert stream.status_code == 200
            told = next(json.loads(data) for _, data in sse_events(stream.iter_lines()) if data)
    assert told == {"jsonrpc": "2.0", "method": UPDATED, "params": {"uri": uri}}
