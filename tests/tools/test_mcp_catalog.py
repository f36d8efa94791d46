"""An MCP server's tools in the tenant's catalog (tools.upstream.servers): names, reconcile rules, trust, and that
groups, rules and bindings treat them like any other tool. The listings are built here; the live upstream
part (a real server listing them) is tested with the MCP client."""
import re

import pytest
from django.utils import timezone

from approvals.selectors import simulate
from approvals.services import rule_create
from tenancy.models import Tenant
from tests.tools.support import registered_tool
from tools.calls.submit import calls_submit
from tools.catalog.selectors import session_tools
from tools.catalog.services import (
    binding_set,
    catalog_sync,
    group_update,
    session_create,
    tool_external_create,
    tool_update,
)
from tools.catalog.snapshot import catalog_snapshot
from tools.models import CallStatus, McpServer, Tool, ToolGroup
from tools.upstream.client import UpstreamTool
from tools.upstream.servers import (
    mcp_server_create,
    mcp_server_delete,
    mcp_server_update,
    mcp_tool_name,
    mcp_tools_by_server,
    mcp_tools_reconcile,
)

pytestmark = pytest.mark.django_db

PUBLIC_URL = "https://93.184.215.14/mcp"  # a literal public address: checked without a lookup, never reached
SEARCH_SCHEMA = {"type": "object", "properties": {"query": {"type": "string"}, "repo": {"type": "string"}},
                 "required": ["query", "repo"]}


def upstream(name: str, *, schema=None, description: str = "", annotations=None, output=None) -> UpstreamTool:
    return UpstreamTool(name=name, description=description or f"{name} upstream",
                        input_schema=SEARCH_SCHEMA if schema is None else schema, output_schema=output,
                        annotations=annotations or {})


def server_of(tenant, name: str = "github", **fields) -> McpServer:
    return mcp_server_create(tenant=tenant, name=name, transport="streamable_http", url=PUBLIC_URL, **fields)


def tools_of(server) -> dict[str, Tool]:
    return {t.source_ref: t for t in Tool.objects.for_tenant(server.tenant_id).filter(source="mcp")
            if t.name.startswith(f"mcp__{server.name}__")}


# --- names -------------------------------------------------------------------------------------

def test_a_plain_name_is_kept_as_it_is():
    assert mcp_tool_name("github", "search_issues") == "mcp__github__search_issues"
    assert mcp_tool_name("docs-1", "get-page") == "mcp__docs-1__get-page"


@pytest.mark.parametrize("upstream_name", [
    "repo.search", "a" * 80, "x" * 52, "héllo wörld", "", "tool/with/slashes", "名前", "a" * 128,
])
def test_every_name_is_in_the_catalogs_charset_and_bounded(upstream_name):
    name = mcp_tool_name("a-long-server-name-of-24", upstream_name)
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name), name
    assert name.startswith("mcp__a-long-server-name-of-24__")
    assert mcp_tool_name("a-long-server-name-of-24", upstream_name) == name  # stable


def test_names_that_sanitise_alike_stay_distinct():
    names = {mcp_tool_name("github", u) for u in ("repo.search", "repo_search", "repo-search", "repo search",
                                                  "repo/search")}
    assert len(names) == 5
    assert "mcp__github__repo_search" in names  # the one that needed no change keeps its name
    long_a, long_b = "a" * 70 + "1", "a" * 70 + "2"  # the same once cut to length
    assert mcp_tool_name("github", long_a) != mcp_tool_name("github", long_b)


def test_a_changed_name_ends_with_a_hash_of_the_upstream_name():
    assert re.fullmatch(r"mcp__github__repo_search_[0-9a-f]{8}", mcp_tool_name("github", "repo.search"))
    assert len(mcp_tool_name("github", "a" * 80)) == 64


# --- reconcile -------------------------------------------------------------------------------

def test_listed_tools_enter_the_catalog_with_their_upstream_names(world):
    server = server_of(world.a.tenant, timeout_s=12.5)
    counts = mcp_tools_reconcile(server=server, listed=[
        upstream("search", description="Search code."), upstream("repo.get"), upstream("z" * 90)])
    assert counts == {"added": 3, "updated": 0, "disabled": 0, "held": 0, "skipped": []}
    tools = tools_of(server)
    assert set(tools) == {"search", "repo.get", "z" * 90}
    search = tools["search"]
    assert (search.name, search.source, search.mcp_server_id, search.description) == (
        "mcp__github__search", "mcp", server.pk, "Search code.")
    assert search.input_schema == SEARCH_SCHEMA and search.timeout_s == 12.5 and search.enabled
    assert all(len(t.name) <= 64 for t in tools.values())


def test_a_second_sync_keeps_the_same_rows_and_names(world):
    server = server_of(world.a.tenant)
    listed = [upstream("repo.search"), upstream("repo_search"), upstream("q" * 100)]
    mcp_tools_reconcile(server=server, listed=listed)
    first = {ref: (t.pk, t.name) for ref, t in tools_of(server).items()}
    assert len({name for _, name in first.values()}) == 3
    counts = mcp_tools_reconcile(server=server, listed=list(reversed(listed)))
    assert counts == {"added": 0, "updated": 0, "disabled": 0, "held": 0, "skipped": []}
    assert {ref: (t.pk, t.name) for ref, t in tools_of(server).items()} == first


def test_changes_upstream_update_the_tool_of_a_server_that_accepts_them(world):
    server = server_of(world.a.tenant, accept_changes=True)
    mcp_tools_reconcile(server=server, listed=[upstream("search")])
    server.last_synced_at = timezone.now()  # past its first listing: only `accept_changes` applies changes now
    new_schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    counts = mcp_tools_reconcile(server=server, listed=[upstream("search", schema=new_schema, description="New.")])
    assert counts["updated"] == 1
    tool = tools_of(server)["search"]
    assert tool.input_schema == new_schema and tool.description == "New."


def test_include_and_exclude_take_exact_upstream_names(world):
    listed = [upstream("search"), upstream("search.all"), upstream("delete_repo"), upstream("list")]
    included = server_of(world.a.tenant, name="inc", include=["search", "list", "absent"])
    mcp_tools_reconcile(server=included, listed=listed)
    assert set(tools_of(included)) == {"search", "list"}
    excluded = server_of(world.a.tenant, name="exc", exclude=["delete_repo", "search"])
    mcp_tools_reconcile(server=excluded, listed=listed)
    assert set(tools_of(excluded)) == {"search.all", "list"}
    # Excluding a tool later disables it like a tool the server stopped offering.
    mcp_server_update(server=excluded, exclude=["delete_repo", "search", "list"])
    counts = mcp_tools_reconcile(server=excluded, listed=listed)
    assert counts["disabled"] == 1
    assert tools_of(excluded)["list"].enabled is False


def test_a_tool_that_disappears_is_disabled_and_comes_back_enabled(world):
    tenant = world.a.tenant
    server = server_of(tenant)
    mcp_tools_reconcile(server=server, listed=[upstream("search"), upstream("issues.list")])
    tool = tools_of(server)["issues.list"]
    group = ToolGroup.objects.for_tenant(tenant).get(name="basic")
    group.tools.add(tool)
    binding = binding_set(tenant=tenant, tool=tool, name="repo", value="acme/site")

    counts = mcp_tools_reconcile(server=server, listed=[upstream("search")])
    assert counts == {"added": 0, "updated": 0, "disabled": 1, "held": 0, "skipped": []}
    gone = Tool.objects.for_tenant(tenant).get(pk=tool.pk)  # kept, never deleted
    assert gone.enabled is False and gone.mcp_server_id is None
    assert gone.name not in catalog_snapshot(tenant.pk).tools
    assert mcp_tools_by_server(tenant, [server])[server.pk] == [gone, tools_of(server)["search"]]

    counts = mcp_tools_reconcile(server=server, listed=[upstream("search"), upstream("issues.list")])
    assert counts == {"added": 0, "updated": 1, "disabled": 0, "held": 0, "skipped": []}
    back = Tool.objects.for_tenant(tenant).get(pk=tool.pk)
    assert back.enabled and back.mcp_server_id == server.pk and back.name == tool.name
    assert list(back.groups.all()) == [group] and back.bindings.get() == binding  # its governance kept
    assert back.name in catalog_snapshot(tenant.pk).tools


def test_a_tool_an_operator_disabled_stays_disabled(world):
    server = server_of(world.a.tenant)
    mcp_tools_reconcile(server=server, listed=[upstream("search")])
    tool_update(tool=tools_of(server)["search"], enabled=False)
    mcp_tools_reconcile(server=server, listed=[upstream("search", description="Changed.")])
    tool = tools_of(server)["search"]
    assert tool.enabled is False and tool.description == "Changed."
    mcp_tools_reconcile(server=server, listed=[])  # gone upstream, and back: still the operator's choice
    mcp_tools_reconcile(server=server, listed=[upstream("search")])
    assert tools_of(server)["search"].enabled is False


ANNOTATIONS = {"readOnlyHint": True, "idempotentHint": True, "destructiveHint": False}


def test_annotations_become_flags_only_for_a_trusted_server(world):
    trusted = server_of(world.a.tenant, name="trusted", trusted=True)
    untrusted = server_of(world.a.tenant, name="untrusted")
    listed = [upstream("read", annotations=ANNOTATIONS), upstream("write", annotations={"readOnlyHint": False}),
              upstream("plain")]
    for server in (trusted, untrusted):
        mcp_tools_reconcile(server=server, listed=listed)
    flags = ("read_only", "destructive", "idempotent", "concurrency_safe", "trusted")
    t, u = tools_of(trusted), tools_of(untrusted)
    assert [getattr(t["read"], f) for f in flags] == [True, False, True, True, True]
    assert [getattr(t["write"], f) for f in flags] == [False, True, False, False, True]  # MCP: destructive unless said
    assert [getattr(t["plain"], f) for f in flags] == [False, True, False, False, True]
    for name in ("read", "write", "plain"):  # an untrusted server's hints are never flags
        assert [getattr(u[name], f) for f in flags] == [False, True, False, False, False]


def test_trust_withdrawn_takes_the_safe_flags_at_once(world):
    server = server_of(world.a.tenant, trusted=True)
    mcp_tools_reconcile(server=server, listed=[upstream("read", annotations=ANNOTATIONS)])
    assert tools_of(server)["read"].read_only
    mcp_server_update(server=server, trusted=False, timeout_s=7)
    tool = tools_of(server)["read"]
    assert (tool.read_only, tool.idempotent, tool.trusted, tool.timeout_s) == (False, False, False, 7)


def test_read_only_auto_allow_follows_trust(world):
    tenant = world.a.tenant
    Tenant.objects.filter(pk=tenant.pk).update(default_behavior="ask", auto_allow_read_only=True)
    tenant.refresh_from_db()
    for name, trusted in (("trusted", True), ("untrusted", False)):
        mcp_tools_reconcile(server=server_of(tenant, name=name, trusted=trusted),
                            listed=[upstream("read", annotations=ANNOTATIONS)])
    assert simulate(tenant=tenant, tool_name="mcp__trusted__read").behavior == "allow"
    assert simulate(tenant=tenant, tool_name="mcp__untrusted__read").behavior == "ask"


@pytest.mark.parametrize(("schema", "reason"), [
    ({"type": "string"}, 'must be a JSON Schema of type "object"'),
    ({"type": "object", "properties": {"a": {"$ref": "https://evil.example/schema"}}}, "leaves the schema"),
    ({"type": "object", "properties": {"a": {"type": 12}}}, "not a valid JSON Schema"),
    ("not a schema", 'not a JSON Schema of type "object"'),
    ({"type": "object", "description": "nul \x00 inside"}, "cannot be stored"),
])
def test_a_tool_with_a_bad_schema_is_skipped_and_the_rest_synced(world, schema, reason):
    server = server_of(world.a.tenant)
    counts = mcp_tools_reconcile(server=server, listed=[upstream("bad", schema=schema), upstream("good")])
    assert counts["added"] == 1
    [(name, why)] = counts["skipped"]
    assert name == "bad" and reason in why
    assert set(tools_of(server)) == {"good"}


def test_a_schema_without_a_type_is_taken_as_an_object(world):
    server = server_of(world.a.tenant)
    mcp_tools_reconcile(server=server, listed=[upstream("loose", schema={"properties": {"q": {"type": "string"}}})])
    assert tools_of(server)["loose"].input_schema == {"type": "object", "properties": {"q": {"type": "string"}}}


def test_a_bad_schema_later_leaves_the_stored_tool_as_it_was(world):
    server = server_of(world.a.tenant)
    mcp_tools_reconcile(server=server, listed=[upstream("search")])
    counts = mcp_tools_reconcile(server=server, listed=[upstream("search", schema={"type": "array"})])
    assert counts["skipped"] == [("search", 'its input schema must be a JSON Schema of type "object"')]
    tool = tools_of(server)["search"]
    assert tool.input_schema == SEARCH_SCHEMA and tool.enabled is False  # not offered usably: disabled


def test_unnamed_and_duplicate_tools_are_skipped(world):
    server = server_of(world.a.tenant)
    counts = mcp_tools_reconcile(server=server, listed=[upstream(""), upstream("a"), upstream("a"),
                                                        upstream("n" * 300), upstream("nul\x00name"),
                                                        upstream("lone\ud800")])
    assert counts["added"] == 1
    assert counts["skipped"] == [
        ("(no usable name)", "the server gave it no usable name"), ("a", "the server listed it twice"),
        ("n" * 80, "the server gave it no usable name"), ("(no usable name)", "the server gave it no usable name"),
        ("(no usable name)", "the server gave it no usable name")]


def test_a_name_taken_by_a_python_tool_is_skipped(world):
    tenant = world.a.tenant
    server = server_of(tenant, name="clash")

    def fake(query: str) -> str:
        """A Python tool that took an MCP-looking name."""
        return query

    with registered_tool(fake, name="mcp__clash__search"):
        catalog_sync(tenant=tenant)
        python_tool = Tool.objects.for_tenant(tenant).get(name="mcp__clash__search")
        counts = mcp_tools_reconcile(server=server, listed=[upstream("search"), upstream("other")])
    assert counts["skipped"] == [("search", "its name mcp__clash__search is taken by a python tool")]
    python_tool.refresh_from_db()
    assert python_tool.source == "python" and python_tool.mcp_server_id is None
    assert set(tools_of(server)) == {"other"}


def test_a_name_taken_by_an_external_tool_is_skipped(world):
    tenant = world.a.tenant
    tool_external_create(tenant=tenant, name="mcp__github__search", description="mine",
                         input_schema={"properties": {}})
    counts = mcp_tools_reconcile(server=server_of(tenant), listed=[upstream("search")])
    assert counts["skipped"] == [("search", "its name mcp__github__search is taken by a external tool")]
    assert Tool.objects.for_tenant(tenant).get(name="mcp__github__search").description == "mine"


def test_a_sync_bumps_the_catalog_version(world):
    tenant = world.a.tenant
    before = catalog_snapshot(tenant.pk).version
    mcp_tools_reconcile(server=server_of(tenant), listed=[upstream("search")])
    snapshot = catalog_snapshot(tenant.pk)
    assert snapshot.version != before and "mcp__github__search" in snapshot.tools


def test_servers_are_per_tenant(world):
    a_server, b_server = server_of(world.a.tenant), server_of(world.b.tenant)  # the same name in each
    mcp_tools_reconcile(server=a_server, listed=[upstream("search")])
    mcp_tools_reconcile(server=b_server, listed=[upstream("other")])
    assert set(tools_of(a_server)) == {"search"} and set(tools_of(b_server)) == {"other"}
    assert Tool.objects.for_tenant(world.b.tenant).filter(mcp_server=a_server).count() == 0


# --- a disabled or deleted server --------------------------------------------------------------

def test_a_disabled_server_disables_its_tools(world):
    server = server_of(world.a.tenant)
    mcp_tools_reconcile(server=server, listed=[upstream("search"), upstream("list")])
    mcp_server_update(server=server, enabled=False)
    assert not any(t.enabled for t in tools_of(server).values())
    mcp_server_update(server=server, enabled=True)
    counts = mcp_tools_reconcile(server=server, listed=[upstream("search"), upstream("list")])
    assert counts["updated"] == 2 and all(t.enabled for t in tools_of(server).values())


def test_disabling_a_server_touches_only_its_own_enabled_tools(world):
    """Another server's tools and the tenant's other tools stay enabled; a tool an operator disabled stays
    attached (it is the operator's, not the platform's, choice) and comes back disabled."""
    server, other = server_of(world.a.tenant), server_of(world.a.tenant, name="other")
    mcp_tools_reconcile(server=server, listed=[upstream("search"), upstream("list")])
    mcp_tools_reconcile(server=other, listed=[upstream("search")])
    tool_update(tool=tools_of(server)["list"], enabled=False)
    enabled_elsewhere = set(Tool.objects.for_tenant(world.a.tenant).filter(enabled=True).exclude(
        mcp_server=server).values_list("pk", flat=True))
    mcp_server_update(server=server, enabled=False)
    assert set(Tool.objects.for_tenant(world.a.tenant).filter(enabled=True).values_list(
        "pk", flat=True)) == enabled_elsewhere
    assert tools_of(server)["list"].mcp_server_id == server.pk and tools_of(server)["search"].mcp_server_id is None


def test_the_tools_of_some_servers_leave_out_the_others_and_find_their_detached_tools(world):
    """A detached tool is found by its name up to the first `__` after `mcp__` (an upstream name may hold `__`)."""
    server, other = server_of(world.a.tenant), server_of(world.a.tenant, name="other")
    mcp_tools_reconcile(server=server, listed=[upstream("search"), upstream("issues__list")])
    mcp_tools_reconcile(server=other, listed=[upstream("search")])
    mcp_tools_reconcile(server=server, listed=[upstream("search")])  # issues__list detached
    detached = Tool.objects.for_tenant(world.a.tenant).get(mcp_server=None, source_ref="issues__list")
    assert mcp_tools_by_server(world.a.tenant, [server]) == {server.pk: [detached, tools_of(server)["search"]]}
    # a tool of another source is never taken for a detached one, whatever its name
    Tool.objects.create(tenant=world.a.tenant, name="mcp__github__lookalike", source="external", enabled=False)
    assert mcp_tools_by_server(world.a.tenant, [server]) == {server.pk: [detached, tools_of(server)["search"]]}


def test_deleting_a_server_keeps_its_tools_disabled(world):
    tenant = world.a.tenant
    server = server_of(tenant)
    mcp_tools_reconcile(server=server, listed=[upstream("search")])
    tool = tools_of(server)["search"]
    mcp_server_delete(server=server)
    assert not McpServer.objects.for_tenant(tenant).exists()
    kept = Tool.objects.for_tenant(tenant).get(pk=tool.pk)
    assert kept.enabled is False and kept.mcp_server_id is None and kept.source_ref == "search"
    again = server_of(tenant)  # the same name again takes its tools back at the first sync
    assert mcp_tools_reconcile(server=again, listed=[upstream("search")])["added"] == 0
    assert Tool.objects.for_tenant(tenant).get(pk=tool.pk).mcp_server_id == again.pk


# --- governed like any other tool ---------------------------------------------------------------

def test_a_rule_on_the_servers_prefix_matches_its_tools(world):
    tenant = world.a.tenant
    mcp_tools_reconcile(server=server_of(tenant), listed=[upstream("search"), upstream("repo.delete")])
    mcp_tools_reconcile(server=server_of(tenant, name="docs"), listed=[upstream("search")])
    rule = rule_create(tenant=tenant, behavior="deny", tool_pattern="mcp__github__*")
    for name in ("mcp__github__search", mcp_tool_name("github", "repo.delete")):
        decision = simulate(tenant=tenant, tool_name=name)
        assert (decision.behavior, decision.rule) == ("deny", rule.pk), name
    assert simulate(tenant=tenant, tool_name="mcp__docs__search").rule != rule.pk


def test_a_denied_call_of_an_mcp_tool_never_reaches_its_server(world):
    tenant = world.a.tenant
    server = server_of(tenant)
    mcp_tools_reconcile(server=server, listed=[upstream("search")])
    group_update(group=ToolGroup.objects.for_tenant(tenant).get(name="basic"),
                 tools=[*ToolGroup.objects.for_tenant(tenant).get(name="basic").tools.all(),
                        tools_of(server)["search"]])
    rule_create(tenant=tenant, behavior="deny", tool_pattern="mcp__github__*")
    session = session_create(tenant=tenant, agent="coder")
    [call] = calls_submit(session=session, calls=[
        {"name": "mcp__github__search", "input": {"query": "bug", "repo": "acme/site"}}])
    assert call.status == CallStatus.DENIED  # decided by the rule, before any executor or upstream


def test_a_bound_argument_of_an_mcp_tool_is_hidden_from_the_model(world):
    tenant = world.a.tenant
    server = server_of(tenant)
    mcp_tools_reconcile(server=server, listed=[upstream("search")])
    tool = tools_of(server)["search"]
    ToolGroup.objects.for_tenant(tenant).get(name="basic").tools.add(tool)
    binding_set(tenant=tenant, tool=tool, name="repo", value="acme/secret-repo")
    session = session_create(tenant=tenant, agent="coder")
    for fmt in ("openai", "anthropic", "mcp"):
        surface = session_tools(session, fmt)
        text = repr(surface)
        assert "mcp__github__search" in text and "acme/secret-repo" not in text
        [exposed] = [t for t in surface if "mcp__github__search" in repr(t)]
        schema = exposed.get("parameters") or exposed.get("input_schema") or exposed.get("inputSchema") or (
            exposed["function"]["parameters"])
        assert "repo" not in schema["properties"] and schema["required"] == ["query"], fmt
    [call] = calls_submit(session=session, calls=[
        {"name": "mcp__github__search", "input": {"query": "x", "repo": "other/repo"}}])
    assert call.status == CallStatus.FAILED and call.error["errorType"] == "BoundArgumentOverride"
