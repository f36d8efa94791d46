"""The console: groups limited to agents, and the tools page showing the surface as a given agent sees it."""
import re

import pytest

from approvals.services import rule_create
from tools.catalog.selectors import surface_preview, visible_tools
from tools.catalog.services import binding_set, group_create, group_update, session_create, tool_external_create
from tools.models import ToolGroup

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_rule_index")]


def external(tenant, name: str):
    return tool_external_create(tenant=tenant, name=name, input_schema={"properties": {}}, description=name)


def test_a_group_is_limited_to_agents_in_its_form_and_the_list_says_so(world):
    client = world.a.console("operator")
    response = client.post("/t/acme/groups/new/", {
        "name": "payroll", "switchable": "on", "agents": "finance-bot\n\nplanner\nfinance-bot",
        "tools": [world.a.tools["calculate"].pk]})
    assert response.status_code == 302
    group = ToolGroup.objects.for_tenant(world.a.tenant).get(name="payroll")
    assert group.agents == ["finance-bot", "planner"]
    assert "only for agents: finance-bot, planner" in client.get("/t/acme/groups/").content.decode()
    assert "finance-bot\nplanner" in client.get(f"/t/acme/groups/{group.pk}/").content.decode()

    refused = client.post(f"/t/acme/groups/{group.pk}/", {"name": "payroll", "agents": "toolkeeper"})
    assert refused.status_code == 400
    assert "reserved" in refused.content.decode()
    group.refresh_from_db()
    assert group.agents == ["finance-bot", "planner"]

    basic = world.a.groups["basic"]
    assert 'name="agents"' not in client.get(f"/t/acme/groups/{basic.pk}/").content.decode()


@pytest.fixture
def policy(world):
    """payroll_run only for finance-bot (operator-managed, on); disk_wipe in basic, denied to support-bot."""
    tenant = world.a.tenant
    group_create(tenant=tenant, name="payroll", switchable=False, default_active=True,
                 tools=[external(tenant, "payroll_run")], agents=["finance-bot"])
    basic = world.a.groups["basic"]
    group_update(group=basic, tools=[*basic.tools.all(), external(tenant, "disk_wipe")])
    return rule_create(tenant=tenant, behavior="deny", tool_pattern="disk_wipe", agents=["support-bot"])


def columns(html: str) -> tuple[str, str]:
    listed = html.split('id="seen-tools"', 1)[1].split("</table>", 1)[0]
    return listed, html.split('class="not-listed"', 1)[1].split("</ul>", 1)[0]


def seen_rows(html: str) -> dict[str, str]:
    """The agent's-eye view's rows by tool name, in page order."""
    table = html.split('id="seen-tools"', 1)[1].split("</table>", 1)[0]
    return {match.group(1): match.group(2) for match in re.finditer(r'<tr data-seen-tool="([^"]+)">(.*?)</tr>', table,
                                                                      re.S)}


def test_the_preview_shows_each_agent_its_own_surface_and_why_the_rest_is_hidden(world, policy):
    tenant = world.a.tenant
    finance = surface_preview(tenant, "finance-bot")
    support = surface_preview(tenant, "support-bot", "alice")
    hidden_from_finance, hidden_from_support = dict(finance.hidden), dict(support.hidden)

    assert {"payroll_run", "disk_wipe", "current_time", "reset_tools"} <= set(finance.shown)
    assert "payroll" in finance.active_groups
    assert hidden_from_finance["calculate"].startswith("not in an active group: math")

    assert "payroll_run" not in support.shown and "disk_wipe" not in support.shown
    assert "current_time" in support.shown
    assert hidden_from_support["payroll_run"] == "its groups are limited to other agents: payroll"
    assert hidden_from_support["disk_wipe"].startswith(f"denied by rule #{policy.pk}")
    assert "payroll" not in support.active_groups

    # what a real new session of each agent is shown
    for preview in (finance, support):
        session = session_create(tenant=tenant, agent=preview.agent, user=preview.user)
        assert [exposed.name for exposed in visible_tools(session)] == preview.shown

    client = world.a.console("viewer")
    listed, not_listed = columns(client.get("/t/acme/tools/?agent=finance-bot").content.decode())
    assert "payroll_run" in listed and "disk_wipe" in listed and "calculate" in not_listed
    listed, not_listed = columns(client.get("/t/acme/tools/?agent=support-bot&user=alice").content.decode())
    assert "payroll_run" not in listed and "disk_wipe" not in listed and "current_time" in listed
    assert f"denied by rule #{policy.pk}" in not_listed and "limited to other agents: payroll" in not_listed


def test_the_preview_refuses_the_system_agent_and_runs_only_when_asked(world, policy):
    client = world.a.console("viewer")
    page = client.get("/t/acme/tools/")
    assert page.status_code == 200 and 'class="not-listed"' not in page.content.decode()
    page = client.get("/t/acme/tools/?agent=toolkeeper")
    assert page.status_code == 200
    assert "reserved" in page.content.decode() and 'class="not-listed"' not in page.content.decode()
    page = client.get("/t/acme/tools/?agent=" + "x" * 101)
    assert page.status_code == 200 and 'class="not-listed"' not in page.content.decode()
    other = world.b.console("viewer")
    assert other.get("/t/acme/tools/?agent=finance-bot").status_code in (403, 404)


def test_the_agents_eye_view_is_what_the_api_lists_with_groups_bindings_and_rules(world, policy):
    tenant = world.a.tenant
    clock = world.a.tools["current_time"]
    binding_set(tenant=tenant, tool=clock, name="timezone", value="Asia/Kolkata", agent="finance-bot")
    asking = rule_create(tenant=tenant, behavior="ask", tool_pattern="payroll_run", agents=["finance-bot"])
    app = world.a.client("agent")
    created = app.post("/api/v1/sessions", {"agent": "finance-bot", "user": "bea"}, format="json")
    assert created.status_code == 201, created.content
    listed = app.get(f"/api/v1/sessions/{created.json()['id']}/tools", {"format": "mcp"}).json()["tools"]
    api_names = [tool["name"] for tool in listed]
    assert "payroll_run" in api_names and "current_time" in api_names

    console = world.a.console("viewer")
    for page in (console.get("/t/acme/tools/?agent=finance-bot&user=bea"),
                 console.get(f"/t/acme/sessions/{created.json()['id']}/")):
        rows = seen_rows(page.content.decode())
        assert list(rows) == api_names  # the same tools, in the same order
        assert "<code>timezone</code>" in rows["current_time"]  # bound for this agent: not the model's
        assert "&quot;timezone&quot;" not in rows["current_time"]  # and gone from the schema shown
        assert '<span class="tag">payroll</span>' in rows["payroll_run"]
        assert f"#rule-{asking.pk}" in rows["payroll_run"] and ">ask</span>" in rows["payroll_run"]
        assert "a meta tool: always listed" in rows["reset_tools"]
    clock_schema = next(tool for tool in listed if tool["name"] == "current_time")["inputSchema"]
    assert "timezone" not in clock_schema.get("properties", {})
