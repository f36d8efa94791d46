"""Exposure follows policy: groups limited to some agents, and tools a deny rule always refuses kept off the
listed surface while their calls are still decided (and denied) by the permission step."""
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.services import rule_create, rule_update
from tools.calls.submit import calls_submit
from tools.catalog import registry
from tools.catalog.selectors import session_prompt, session_tools, visible_tools
from tools.catalog.services import group_create, group_update, session_create, tool_external_create
from tools.catalog.snapshot import CatalogSnapshot, ExposedTool
from tools.models import AgentSession, CallStatus, ToolGroup

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_rule_index")]


def external(tenant, name: str):
    return tool_external_create(tenant=tenant, name=name, description=f"The {name} tool.",
                                input_schema={"properties": {"q": {"type": "string"}}})


def listed(session) -> set[str]:
    return {exposed.name for exposed in visible_tools(session)}


def call(session, name: str, arguments: dict | None = None):
    [submitted] = calls_submit(session=session, calls=[{"name": name, "input": arguments or {}}])
    submitted.refresh_from_db()
    return submitted


def fresh(session) -> AgentSession:
    return AgentSession.objects.for_tenant(session.tenant_id).select_related("tenant").get(pk=session.pk)


# --- groups limited to agents ------------------------------------------------------------------

def create_group(client, **body):
    return client.post("/api/v1/groups", body, format="json")


def test_a_group_limited_to_an_agent_is_seen_and_called_by_that_agent_only(world):
    tenant = world.a.tenant
    external(tenant, "payroll_run")
    response = create_group(world.a.client("admin"), name="payroll", tools=["payroll_run"], switchable=False,
                            default_active=True, agents=["finance-bot"])
    assert response.status_code == 201, response.content
    assert response.json()["agents"] == ["finance-bot"]
    assert world.a.client("admin").get(f"/api/v1/groups/{response.json()['id']}").json()["agents"] == ["finance-bot"]

    finance = session_create(tenant=tenant, agent="finance-bot")
    other = session_create(tenant=tenant, agent="support-bot")
    assert "payroll_run" in listed(finance)
    assert "payroll_run" not in listed(other)
    for fmt in ("openai", "anthropic", "mcp"):
        assert "payroll_run" not in str(session_tools(other, fmt))

    refused = call(other, "payroll_run")
    assert refused.status == CallStatus.FAILED
    assert refused.error["errorType"] == "ToolNotAvailable"
    assert call(finance, "payroll_run").status == CallStatus.AWAITING_EXTERNAL


def test_reset_tools_neither_offers_nor_switches_on_a_group_limited_to_another_agent(world):
    tenant = world.a.tenant
    ledger_read = external(tenant, "ledger_read")
    group_create(tenant=tenant, name="ledger", description="The books.", notes="Mind the books.", tools=[ledger_read],
                 agents=["finance-bot"], default_active=True)

    finance = session_create(tenant=tenant, agent="finance-bot")
    other = session_create(tenant=tenant, agent="support-bot")
    assert "ledger" in finance.active_groups  # on by default, for the agent it is open to
    assert "ledger" not in other.active_groups

    reset_of = {e.name: e for e in visible_tools(other)}["reset_tools"]
    assert "ledger" not in reset_of.schema["properties"]
    assert "ledger" in {e.name: e for e in visible_tools(finance)}["reset_tools"].schema["properties"]
    assert "ledger" not in session_prompt(other) and "ledger" in session_prompt(finance)

    switched = call(other, "reset_tools", {"ledger": True})
    assert switched.status == CallStatus.FAILED
    assert "ledger" in switched.error["error"]  # refused by the schema, which does not offer it
    assert "ledger" not in fresh(other).active_groups
    assert "ledger_read" not in listed(fresh(other))
    switched = call(finance, "reset_tools", {"ledger": True})
    assert switched.status == CallStatus.SUCCEEDED, switched.error


def test_the_basic_group_cannot_be_limited(world):
    client = world.a.client("admin")
    basic = world.a.groups["basic"]
    response = client.patch(f"/api/v1/groups/{basic.pk}", {"agents": ["finance-bot"]}, format="json")
    assert response.status_code == 400, response.content
    assert "agents" in response.json()["error"]["fields"]
    assert ToolGroup.objects.for_tenant(world.a.tenant).get(name="basic").agents == []
    assert client.patch(f"/api/v1/groups/{basic.pk}", {"agents": []}, format="json").status_code == 200


@pytest.mark.parametrize("agents", [
    "finance-bot",  # not a list
    [1],
    [None],
    [""],
    ["   "],
    ["x" * 101],
    ["toolkeeper"],  # the system session's agent
    [" Toolkeeper "],
    [f"bot-{n}" for n in range(101)],
    [["finance-bot"]],
])
def test_bad_agents_are_refused_with_the_field_named(world, agents):
    response = create_group(world.a.client("admin"), name="limited", agents=agents)
    assert response.status_code == 400, response.content
    assert "agents" in response.json()["error"]["fields"]
    assert not ToolGroup.objects.for_tenant(world.a.tenant).filter(name="limited").exists()


# --- tools a deny rule always refuses ----------------------------------------------------------

@pytest.fixture
def wiper(world):
    tool = external(world.a.tenant, "disk_wipe")
    group_update(group=world.a.groups["basic"], tools=[*world.a.groups["basic"].tools.all(), tool])
    return tool


def test_a_tool_a_deny_rule_always_refuses_is_not_listed_but_its_call_is_denied_by_that_rule(world, wiper):
    tenant = world.a.tenant
    session = session_create(tenant=tenant, agent="support-bot", user="alice")
    assert "disk_wipe" in listed(session)
    rule = rule_create(tenant=tenant, behavior="deny", tool_pattern="disk_*", note="never")

    session = fresh(session)
    assert "disk_wipe" not in listed(session)
    for fmt in ("openai", "anthropic", "mcp"):
        listing = session_tools(session, fmt)
        assert listing and "disk_wipe" not in str(listing)
    assert "reset_tools" in listed(session)  # meta tools are never hidden by rules

    denied = call(session, "disk_wipe")
    assert denied.status == CallStatus.DENIED
    assert denied.decision["rule"] == rule.pk
    assert f"rule #{rule.pk}" in denied.error["error"]

    rest = world.a.client("agent").get(f"/api/v1/sessions/{world.a.session.pk}/tools?format=mcp")
    assert rest.status_code == 200 and "disk_wipe" not in str(rest.json())

    rule_update(rule=rule, enabled=False)  # a new policy version: the tool is back
    assert "disk_wipe" in listed(fresh(session))
    assert call(session, "disk_wipe").status == CallStatus.AWAITING_EXTERNAL


def test_a_deny_rule_with_argument_conditions_hides_nothing(world, wiper):
    rule_create(tenant=world.a.tenant, behavior="deny", tool_pattern="disk_wipe", arg_match={"q": "/*"})
    session = session_create(tenant=world.a.tenant, agent="support-bot")
    assert "disk_wipe" in listed(session)
    assert call(session, "disk_wipe", {"q": "/etc"}).status == CallStatus.DENIED
    assert call(session, "disk_wipe", {"q": "tmp"}).status == CallStatus.AWAITING_EXTERNAL


def test_deny_rules_scoped_to_another_agent_or_user_hide_nothing_from_this_one(world, wiper):
    tenant = world.a.tenant
    rule_create(tenant=tenant, behavior="deny", tool_pattern="disk_wipe", agents=["intern-bot"])
    rule_create(tenant=tenant, behavior="deny", tool_pattern="disk_wipe", users=["mallory"])
    alice = session_create(tenant=tenant, agent="support-bot", user="alice")
    assert "disk_wipe" in listed(alice)
    assert "disk_wipe" not in listed(session_create(tenant=tenant, agent="intern-bot", user="alice"))
    assert "disk_wipe" not in listed(session_create(tenant=tenant, agent="support-bot", user="mallory"))
    assert call(alice, "disk_wipe").status == CallStatus.AWAITING_EXTERNAL


def test_other_behaviours_and_the_default_hide_nothing(world, wiper):
    tenant = world.a.tenant
    rule_create(tenant=tenant, behavior="ask", tool_pattern="disk_wipe")
    session = session_create(tenant=tenant, agent="support-bot")
    assert "disk_wipe" in listed(session)
    tenant.default_behavior = "deny"
    tenant.save()
    assert "disk_wipe" in listed(fresh(session))  # an allow rule could still let a call through


def test_the_call_path_costs_no_query_more_for_the_filter(world, wiper, monkeypatch):
    """A call does not consult the exposure filters: the same calls cost the same queries without them."""
    tenant = world.a.tenant
    notes = external(tenant, "notes_read")
    group_update(group=world.a.groups["basic"], tools=[*world.a.groups["basic"].tools.all(), notes])
    rule_create(tenant=tenant, behavior="deny", tool_pattern="disk_*")
    session = session_create(tenant=tenant, agent="support-bot")

    def queries_of_a_call(name: str) -> int:
        call(session, name)  # warms the per-process snapshots
        current = fresh(session)
        with CaptureQueriesContext(connection) as captured:
            calls_submit(session=current, calls=[{"name": name, "input": {}}])
        return len(captured.captured_queries)

    with_filter = {name: queries_of_a_call(name) for name in ("disk_wipe", "notes_read")}
    assert "disk_wipe" not in listed(fresh(session))
    monkeypatch.setattr(registry, "_exposure_filters", [])
    assert "disk_wipe" in listed(fresh(session))  # the filter is really off
    without_filter = {name: queries_of_a_call(name) for name in ("disk_wipe", "notes_read")}
    assert with_filter == without_filter


def test_meta_tool_validators_are_kept_per_schema_not_per_name():
    """Two sessions' `load_skill_through_path` may offer different skills under the same property names: each is
    validated against its own schema."""
    catalog = CatalogSnapshot(version=1)

    def skill_loader(*names):
        schema = {"type": "object", "properties": {"skillId": {"type": "string", "enum": list(names)}},
                  "required": ["skillId"]}
        return ExposedTool(name="load_skill_through_path", description="", schema=schema, catalog=catalog)

    first, second = skill_loader("triage"), skill_loader("billing")
    assert first.validator.errors({"skillId": "triage"}) == []
    assert second.validator.errors({"skillId": "billing"}) == []
    assert second.validator.errors({"skillId": "triage"}) != []
