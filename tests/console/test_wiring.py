"""Wiring tools to groups at scale (docs/notes/console.md, "Wiring"): the group editor's picker, adding to a group
from a tool's and an MCP server's page, the group an MCP server's tools join, and trying a tool through the
path an app's call takes, marked as an operator's test."""
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.services import rule_create
from audit.models import Event
from tests.bulk import copy_rows
from tools.calls.submit import OPERATOR_TEST
from tools.catalog.services import group_create, group_tools_add
from tools.models import AgentSession, McpServer, Tool, ToolCall, ToolGroup
from tools.upstream.client import UpstreamTool
from tools.upstream.servers import mcp_server_create, mcp_tools_reconcile

pytestmark = pytest.mark.django_db


def _group(tenant, name):
    return ToolGroup.objects.for_tenant(tenant).get(name=name)


def _names(group) -> set[str]:
    return set(group.tools.values_list("name", flat=True))


def test_adding_tools_to_a_group_is_audited_once_and_keeps_what_is_there(world):
    tenant = world.a.tenant
    group = group_create(tenant=tenant, name="wired")
    first, second = world.a.tools["current_time"], world.a.tools["calculate"]
    assert group_tools_add(group=group, tools=[first], actor=world.a.users["operator"]) == [first]
    assert group_tools_add(group=group, tools=[first, second, second]) == [second]
    assert group_tools_add(group=group, tools=[first, second]) == []
    assert _names(group) == {"current_time", "calculate"}
    entries = Event.objects.for_tenant(tenant).filter(verb="group.tools_added", target="group:wired").order_by("id")
    assert [entry.data for entry in entries] == [{"count": 1, "tools": ["current_time"]},
                                                  {"count": 1, "tools": ["calculate"]}]
    with pytest.raises(Exception, match="another tenant"):
        group_tools_add(group=group, tools=[world.b.tools["current_time"]])
    assert _names(group) == {"current_time", "calculate"}


def test_a_tool_page_adds_the_tool_to_a_group(world):
    tenant, tool = world.a.tenant, world.a.tools["calculate"]
    group_create(tenant=tenant, name="wired")
    url = f"/t/acme/tools/{tool.pk}/add-to-group/"
    page = world.a.console("operator").get(f"/t/acme/tools/{tool.pk}/").content.decode()
    assert f'action="{url}"' in page and '<option value="' in page
    wired = _group(tenant, "wired")
    answer = world.a.console("operator").post(url, {"group": wired.pk}, follow=True)
    assert "1 tool added to the group wired." in answer.content.decode()
    assert "calculate" in _names(wired)
    again = world.a.console("operator").post(url, {"group": wired.pk}, follow=True)
    assert "The group wired has it already." in again.content.decode()
    for role in ("reviewer", "viewer"):
        assert world.a.console(role).post(url, {"group": wired.pk}).status_code == 403
    assert world.a.console("operator").get(url).status_code == 405
    b_group = group_create(tenant=world.b.tenant, name="theirs")
    refused = world.a.console("operator").post(url, {"group": b_group.pk}, follow=True).content.decode()
    assert "Nothing was added: choose one of this tenant&#x27;s groups." in refused and not _names(b_group)
    assert world.a.console("operator").post(f"/t/acme/tools/{world.b.tools['calculate'].pk}/add-to-group/",
                                            {"group": wired.pk}).status_code == 404


def _server(world, **options):
    return mcp_server_create(tenant=world.a.tenant, name="docs", transport="streamable_http",
                             url="https://93.184.215.14/mcp", enabled=False, **options)


def _listed(*names):
    return [UpstreamTool(name, f"the {name} tool", {"type": "object"}) for name in names]


def test_an_mcp_servers_registration_names_the_group_its_tools_join(world):
    tenant = world.a.tenant
    readers = group_create(tenant=tenant, name="readers")
    created = world.a.console("operator").post("/t/acme/mcp-servers/new/", {
        "name": "docs", "transport": "streamable_http", "url": "https://93.184.215.14/mcp", "timeout_s": "30",
        "join_group": readers.pk})
    assert created.status_code == 302, created.content.decode()[:3000]
    server = McpServer.objects.for_tenant(tenant).get(name="docs")
    assert server.join_group == readers
    assert Event.objects.for_tenant(tenant).get(verb="mcp_server.created").data["join_group"] == "readers"
    mcp_tools_reconcile(server=server, listed=_listed("search", "fetch"))
    assert _names(readers) == {"mcp__docs__search", "mcp__docs__fetch"}
    mcp_tools_reconcile(server=server, listed=_listed("search", "fetch", "summarize"))
    assert _names(readers) == {"mcp__docs__search", "mcp__docs__fetch", "mcp__docs__summarize"}
    page = world.a.console("viewer").get(f"/t/acme/mcp-servers/{server.pk}/").content.decode()
    assert re.search(r'id="join-group">the group <a href="[^"]+">readers</a>', page)


def test_a_group_of_another_tenant_is_no_servers_group(world):
    b_group = group_create(tenant=world.b.tenant, name="theirs")
    refused = world.a.console("operator").post("/t/acme/mcp-servers/new/", {
        "name": "docs", "transport": "streamable_http", "url": "https://93.184.215.14/mcp", "timeout_s": "30",
        "join_group": b_group.pk})
    assert refused.status_code == 400 and "Select a valid choice" in refused.content.decode()
    with pytest.raises(Exception, match="another tenant"):
        _server(world, join_group=b_group)
    assert not McpServer.objects.for_tenant(world.a.tenant).filter(name="docs").exists()


def test_an_edit_changes_the_group_and_without_it_new_tools_join_none(world):
    tenant = world.a.tenant
    server = _server(world)
    mcp_tools_reconcile(server=server, listed=_listed("search"))
    assert not Tool.objects.for_tenant(tenant).get(name="mcp__docs__search").groups.exists()
    later = group_create(tenant=tenant, name="later")
    edited = world.a.console("operator").post(f"/t/acme/mcp-servers/{server.pk}/edit/", {
        "transport": "streamable_http", "url": "https://93.184.215.14/mcp", "timeout_s": "30",
        "join_group": later.pk})
    assert edited.status_code == 302, edited.content.decode()[:3000]
    entry = Event.objects.for_tenant(tenant).filter(verb="mcp_server.updated").latest("id")
    assert entry.data["fields"] == ["join_group"] and entry.data["join_group"] == "later"
    mcp_tools_reconcile(server=McpServer.objects.for_tenant(tenant).get(pk=server.pk),
                        listed=_listed("search", "fetch"))
    assert _names(later) == {"mcp__docs__fetch"}  # only what the sync added; the server's page adds the rest


def test_an_mcp_servers_page_adds_all_its_tools(world):
    tenant = world.a.tenant
    server = _server(world)
    mcp_tools_reconcile(server=server, listed=_listed("search", "fetch"))
    wired = group_create(tenant=tenant, name="wired")
    answer = world.a.console("operator").post(f"/t/acme/mcp-servers/{server.pk}/add-to-group/", {"group": wired.pk},
                                              follow=True)
    assert "2 tools added to the group wired." in answer.content.decode()
    assert _names(wired) == {"mcp__docs__search", "mcp__docs__fetch"}
    assert world.a.console("viewer").post(f"/t/acme/mcp-servers/{server.pk}/add-to-group/",
                                          {"group": wired.pk}).status_code == 403


def test_the_group_editor_lists_500_tools_by_source_in_a_fixed_number_of_queries(world):
    tenant = world.a.tenant
    server = _server(world)
    mcp_tools_reconcile(server=server, listed=_listed("search"))
    group = group_create(tenant=tenant, name="wide")
    client = world.a.console("operator")
    url = f"/t/acme/groups/{group.pk}/"

    def queries() -> tuple[int, str]:
        client.get(url)
        with CaptureQueriesContext(connection) as captured:
            response = client.get(url)
        assert response.status_code == 200
        return len(captured), response.content.decode()

    few, _ = queries()
    copy_rows(Tool.objects.for_tenant(tenant).get(name="mcp__docs__search"), 250,
              {"name": ("'mcp__docs__t' || n", []), "source_ref": ("'t' || n", [])})
    copy_rows(world.a.tools["calculate"], 250, {"name": ("'bulk_' || n", [])})
    many, html = queries()
    assert many == few
    rows = re.findall(r'<tr data-tool-row data-name="([^"]+)" data-source="([^"]+)">', html)
    assert len(rows) == Tool.objects.for_tenant(tenant).count() > 500
    sources = dict(rows)
    assert sources["mcp__docs__t7"] == "mcp:docs" and sources["bulk_7"] == "python"
    assert '<option value="mcp:docs">MCP server docs</option>' in html


# --- trying a tool ------------------------------------------------------------------------------

def _try(client, tool, **values):
    return client.post(f"/t/acme/tools/{tool.pk}/try/", {"agent": "support-bot", "user": "", "input": "{}",
                                                          **values})


def test_a_tried_call_takes_the_governed_path_and_is_marked(world):
    tenant, tool = world.a.tenant, world.a.tools["current_time"]
    rule_create(tenant=tenant, behavior="ask", tool_pattern="current_time")
    answer = _try(world.a.console("operator"), tool, input="{}", user="dana")
    assert answer.status_code == 302
    call = ToolCall.objects.for_tenant(tenant).get(pk=answer.url.rstrip("/").rsplit("/", 1)[1])
    assert call.status == "awaiting_approval"  # the rule asks, as for an app's call
    assert call.effective_input == {"timezone": "Asia/Tokyo"}  # support-bot's bound argument wins
    session = AgentSession.objects.for_tenant(tenant).get(pk=call.session_id)
    assert (session.agent, session.user, session.context) == ("support-bot", "dana", {OPERATOR_TEST: "acme-operator"})
    entry = Event.objects.for_tenant(tenant).get(verb="tool.tried")
    assert entry.target == f"call:{call.pk}" and entry.actor_label == "acme-operator"
    page = world.a.console("viewer").get(answer.url).content.decode()
    assert '<span class="tag" id="operator-test">an operator\'s test: acme-operator</span>' in page


def test_a_tool_the_agent_cannot_see_fails_as_it_would_for_the_app(world):
    tenant = world.a.tenant
    copy_rows(world.a.tools["calculate"], 1, {"name": ("'unlisted_tool'", [])})  # in no group
    hidden = Tool.objects.for_tenant(tenant).get(name="unlisted_tool")
    answer = _try(world.a.console("operator"), hidden)
    call = ToolCall.objects.for_tenant(tenant).get(pk=answer.url.rstrip("/").rsplit("/", 1)[1])
    assert call.status == "failed" and call.error["errorType"] == "ToolNotAvailable"


def test_a_tried_call_cannot_set_a_bound_argument_either(world):
    answer = _try(world.a.console("operator"), world.a.tools["current_time"], input='{"timezone": "UTC"}')
    call = ToolCall.objects.for_tenant(world.a.tenant).get(pk=answer.url.rstrip("/").rsplit("/", 1)[1])
    assert call.status == "failed" and call.error["errorType"] == "BoundArgumentOverride"


@pytest.mark.parametrize("values,message", [
    ({"input": "[1, 2]"}, "a JSON object"),
    ({"input": "{nope"}, "JSON"),
    ({"agent": "toolkeeper"}, "reserved"),
    ({"agent": ""}, "This field is required"),
])
def test_a_bad_try_is_said_and_runs_nothing(world, values, message):
    before = ToolCall.objects.for_tenant(world.a.tenant).count()
    answer = _try(world.a.console("operator"), world.a.tools["current_time"], **values)
    assert answer.status_code == 400 and message in answer.content.decode()
    assert "Nothing was run" in answer.content.decode()
    assert ToolCall.objects.for_tenant(world.a.tenant).count() == before


def test_only_operators_try_tools(world):
    tool = world.a.tools["current_time"]
    for role in ("reviewer", "viewer"):
        assert world.a.console(role).get(f"/t/acme/tools/{tool.pk}/try/").status_code == 403
        assert _try(world.a.console(role), tool).status_code == 403
    page = world.a.console("operator").get(f"/t/acme/tools/{tool.pk}/try/").content.decode()
    assert '<option value="support-bot">' in page and 'value="toolkeeper"' not in page
