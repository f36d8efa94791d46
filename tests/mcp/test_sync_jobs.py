"""What keeps MCP tools in the catalog without anyone asking: the periodic sync of the servers that are due,
and a sync when an open session hears that its server's tools changed. `sync` stands for
tools.upstream.servers.mcp_server_sync here (it is handed in, as AppConfig.ready does)."""
import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.mcp.support import mcp_server
from tests.tools.support import poll
from tools.catalog import registry
from tools.catalog.registry import periodic_jobs
from tools.models import McpServer
from tools.upstream import client as mcp_client
from tools.upstream import source as mcp_source
from tools.upstream.client import endpoint_of, mcp_call_tool, mcp_list_prompts, mcp_list_tools, mcp_on_tools_changed
from tools.upstream.source import mcp_servers_due, mcp_sync_due, mcp_sync_register, mcp_tools_changed_handler


class Syncs:
    """Records the servers a sync was asked for (from whatever thread), failing for the names in `failing`."""

    def __init__(self, failing=()):
        self.lock = threading.Lock()
        self.servers: list[McpServer] = []
        self.failing = set(failing)

    def __call__(self, *, server: McpServer) -> None:
        with self.lock:
            self.servers.append(server)
        if server.name in self.failing:
            raise RuntimeError("the server could not be listed")
        McpServer.all_tenants.filter(pk=server.pk).update(last_synced_at=timezone.now())

    @property
    def names(self) -> list[str]:
        with self.lock:
            return [s.name for s in self.servers]


@pytest.fixture(autouse=True)
def _fresh_attempts():
    mcp_source._last_attempts.clear()
    yield
    mcp_source._last_attempts.clear()


def synced_at(tenant, name: str, ago_s: float | None) -> McpServer:
    server = mcp_server(tenant, name=name, transport="streamable_http", url="https://mcp.example.com/mcp")
    when = None if ago_s is None else timezone.now() - timedelta(seconds=ago_s)
    McpServer.all_tenants.filter(pk=server.pk).update(last_synced_at=when)
    return server


@pytest.mark.django_db
def test_due_servers_are_the_enabled_ones_not_synced_within_the_interval_longest_waiting_first(world, settings):
    settings.TOOLKEEPER_MCP_SYNC_INTERVAL_S = 300
    synced_at(world.a.tenant, "recent", 60)
    synced_at(world.a.tenant, "stale", 900)
    synced_at(world.b.tenant, "never", None)
    synced_at(world.b.tenant, "older", 3600)
    off = synced_at(world.a.tenant, "off", None)
    McpServer.all_tenants.filter(pk=off.pk).update(enabled=False)

    assert [s.name for s in mcp_servers_due()] == ["never", "older", "stale"]


@pytest.mark.django_db
def test_the_periodic_job_syncs_what_is_due_and_leaves_a_failing_server_until_the_next_interval(world, settings):
    settings.TOOLKEEPER_MCP_SYNC_INTERVAL_S = 300
    synced_at(world.a.tenant, "fine", None)
    synced_at(world.a.tenant, "broken", 900)
    synced_at(world.b.tenant, "recent", 10)
    syncs = Syncs(failing={"broken"})

    assert mcp_sync_due(sync=syncs) == {"synced": 1, "failed": 1, "skipped": 0}
    assert sorted(syncs.names) == ["broken", "fine"]
    # `broken` is still due (its sync failed) but was tried just now: the next run leaves it alone.
    assert mcp_sync_due(sync=syncs) == {"synced": 0, "failed": 0, "skipped": 1}
    assert sorted(syncs.names) == ["broken", "fine"]


@pytest.mark.django_db
def test_a_run_starts_no_sync_past_its_budget(world, settings):
    settings.TOOLKEEPER_MCP_SYNC_INTERVAL_S = 300
    for name in ("one", "two", "three"):
        synced_at(world.a.tenant, name, None)
    syncs = Syncs()
    assert mcp_sync_due(sync=syncs, budget_s=-1) == {"synced": 0, "failed": 0, "skipped": 0}
    assert mcp_sync_due(sync=syncs)["synced"] == 3


def test_registering_the_sync_adds_a_periodic_job_and_a_change_callback(settings, monkeypatch):
    settings.TOOLKEEPER_MCP_SYNC_INTERVAL_S = 300
    monkeypatch.setattr(registry, "_periodic", dict(registry._periodic))  # put back as they were afterwards
    monkeypatch.setattr(mcp_client, "_changed_callbacks", [])
    mcp_sync_register(sync=Syncs())
    _job, every_s = periodic_jobs()["tools.mcp_sync"]
    assert every_s == 60
    assert len(mcp_client._changed_callbacks) == 1


@pytest.mark.django_db(transaction=True)
def test_a_servers_tools_changed_notification_syncs_that_server(world, stdio_servers, upstream):
    server = mcp_server(world.a.tenant, env={"MCP_TEST_STATE": str(upstream.path)})
    other = mcp_server(world.a.tenant, name="other", env={"MCP_TEST_STATE": str(upstream.path)})
    syncs = Syncs()
    remove = mcp_on_tools_changed(mcp_tools_changed_handler(sync=syncs))
    try:
        endpoint = endpoint_of(server)
        mcp_list_tools(endpoint)
        mcp_list_tools(endpoint_of(other))
        mcp_call_tool(endpoint, "add_tool", {"name": "fresh"}, timeout_s=20)
        poll(lambda: syncs.names, message="the sync after list_changed")
        assert [s.pk for s in syncs.servers] == [server.pk]
        assert "fresh" in [tool.name for tool in mcp_list_tools(endpoint)]

        McpServer.all_tenants.filter(pk=other.pk).update(enabled=False)  # a disabled server is not synced
        mcp_call_tool(endpoint_of(other), "add_tool", {"name": "ignored"}, timeout_s=20)
        McpServer.all_tenants.filter(pk=server.pk).update(env=None)  # nor one changed since its session opened
        mcp_call_tool(endpoint, "add_tool", {"name": "also_ignored"}, timeout_s=20)
        threading.Event().wait(1.0)  # (the handler runs 0.2 s after a notification)
        assert [s.pk for s in syncs.servers] == [server.pk]
    finally:
        remove()


@pytest.mark.django_db(transaction=True)
def test_a_servers_prompts_changed_notification_syncs_that_server_too(world, stdio_servers, upstream):
    server = mcp_server(world.a.tenant, env={"MCP_TEST_STATE": str(upstream.path)})
    syncs = Syncs()
    remove = mcp_on_tools_changed(mcp_tools_changed_handler(sync=syncs))
    try:
        endpoint = endpoint_of(server)
        mcp_list_tools(endpoint)
        mcp_call_tool(endpoint, "add_tool", {"name": "fresh_prompt", "kind": "prompt"}, timeout_s=20)
        poll(lambda: syncs.names, message="the sync after prompts/list_changed")
        assert [s.pk for s in syncs.servers] == [server.pk]
        assert "fresh_prompt" in [prompt.name for prompt in mcp_list_prompts(endpoint)]
    finally:
        remove()
