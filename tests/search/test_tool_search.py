"""The tool search (docs/governance.md#tool-search): search_tools finds, by name, description and input schema, only
the tools a session may see; enable_tools switches found tools on for that session alone; the tenant's
`tool_surface` setting lists a new session the core and the search. Runs on both databases (test_both_backends)."""
import pytest

from approvals.services import rule_create
from tenancy.services import tenant_governance_set
from tools.calls.submit import calls_submit
from tools.catalog.search import tools_search
from tools.catalog.selectors import session_tools, visible_tools
from tools.catalog.services import group_create, session_create, tool_external_create, tool_update
from tools.models import AgentSession, CallStatus

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_rule_index")]

CORE = {"current_time", "todo_write"}  # the basic group's tools
SEARCH_META = {"search_tools", "enable_tools"}


def external(tenant, name: str, description: str, schema: dict | None = None):
    return tool_external_create(tenant=tenant, name=name, description=description,
                                input_schema=schema or {"properties": {"q": {"type": "string"}}})


@pytest.fixture
def tenant(world):
    """acme, listing sessions the core and the tool search, with an operator-managed group that is on
    (finance), one that is off (vault), and one limited to another agent (hr)."""
    tenant = world.a.tenant
    tenant_governance_set(tenant=tenant, tool_surface="search")
    made = {}
    made["invoice_send"] = external(tenant, "invoice_send", "Email an invoice to a customer as a PDF attachment.",
             {"properties": {"recipient": {"type": "string", "description": "The customer's billing address"}}})
    made["ledger_post"] = external(tenant, "ledger_post", "Post a journal entry to the general ledger.",
             {"properties": {"account_code": {"type": "string"}, "amount": {"type": "number"}}})
    made["payroll_run"] = external(tenant, "payroll_run", "Run payroll for every employee this month.")
    made["vault_open"] = external(tenant, "vault_open",
                                  "Open the vault with the master combination for payroll audits.")
    made["hr_fire"] = external(tenant, "hr_fire", "Terminate an employee's contract; payroll stops.")
    group_create(tenant=tenant, name="finance", switchable=False, default_active=True,
                 tools=[made["invoice_send"], made["ledger_post"], made["payroll_run"]])
    group_create(tenant=tenant, name="vault", switchable=False, default_active=False, tools=[made["vault_open"]])
    group_create(tenant=tenant, name="hr", switchable=False, default_active=True, tools=[made["hr_fire"]],
                 agents=["hr-bot"])
    return tenant


def fresh(session) -> AgentSession:
    return AgentSession.objects.for_tenant(session.tenant_id).select_related("tenant").get(pk=session.pk)


def listed(session) -> set[str]:
    return {exposed.name for exposed in visible_tools(fresh(session))}


def call(session, name: str, arguments: dict | None = None):
    [submitted] = calls_submit(session=fresh(session), calls=[{"name": name, "input": arguments or {}}])
    submitted.refresh_from_db()
    return submitted


def found(session, query: str, **arguments) -> list[str]:
    searched = call(session, "search_tools", {"query": query, **arguments})
    assert searched.status == CallStatus.SUCCEEDED, searched.error
    return [hit["name"] for hit in searched.result["structured"]["tools"]]


def test_the_search_surface_lists_the_core_and_the_search_tools(tenant, world):
    session = session_create(tenant=tenant, agent="support-bot")
    shown = listed(session)
    assert shown >= CORE | SEARCH_META
    assert {"invoice_send", "ledger_post", "payroll_run", "calculate", "countdown"}.isdisjoint(shown)
    assert fresh(session).active_groups == []  # switchable groups that start on do not, here
    mcp_names = {tool["name"] for tool in session_tools(fresh(session), "mcp")}
    assert mcp_names == shown

    tenant_governance_set(tenant=tenant, tool_surface="full")
    full = session_create(tenant=tenant, agent="support-bot")
    shown = listed(full)
    assert {"invoice_send", "ledger_post", "payroll_run"} <= shown
    assert SEARCH_META.isdisjoint(shown)
    # the other tenant is untouched
    assert SEARCH_META.isdisjoint(listed(world.b.session))


def test_search_finds_visible_tools_by_description_name_and_schema_words(tenant):
    session = session_create(tenant=tenant, agent="support-bot")
    assert found(session, "email an invoice to a customer")[0] == "invoice_send"
    assert found(session, "journal entries")[0] == "ledger_post"  # "entries" finds "entry"
    assert found(session, "arithmetic expression")[0] == "calculate"  # a switchable group's tool
    assert "ledger_post" in found(session, "account code")  # a property name of its input schema
    assert "invoice_send" in found(session, "billing")  # a property's description
    assert found(session, "ledger")[0] == "ledger_post"  # a word of its name
    assert found(session, "zebra quantum") == []
    hits = call(session, "search_tools", {"query": "invoice"}).result["structured"]["tools"]
    assert hits[0] == {"name": "invoice_send", "description": "Email an invoice to a customer as a PDF attachment.",
                       "listed": False}
    assert len(found(session, "tool time payroll invoice ledger arithmetic", limit=2)) == 2


def test_a_tool_the_session_may_not_see_is_never_found(tenant, world):
    session = session_create(tenant=tenant, agent="support-bot")
    everything = "payroll vault combination terminate employee contract master audits"
    assert found(session, everything) == ["payroll_run"]  # vault is off, hr is another agent's
    rule_create(tenant=tenant, behavior="deny", tool_pattern="payroll_*", agents=["support-bot"])
    assert found(session, everything) == []
    assert "payroll_run" not in str(call(session, "search_tools", {"query": everything}).result)
    # another agent, whom the rule does not name, finds it; hr-bot finds its own group's tool
    assert set(found(session_create(tenant=tenant, agent="hr-bot"), everything)) == {"payroll_run", "hr_fire"}
    tool_update(tool=world.a.tools["calculate"], enabled=False)
    assert found(session, "arithmetic expression") == []
    # the other tenant's tools are never found
    external(world.b.tenant, "globex_secret", "Arithmetic expression of the other tenant.")
    assert "globex_secret" not in found(session, "arithmetic expression globex secret")


def test_enabling_lists_a_tool_and_lets_it_run_in_that_session_only(tenant):
    session = session_create(tenant=tenant, agent="support-bot")
    other = session_create(tenant=tenant, agent="support-bot")
    enabled = call(session, "enable_tools", {"names": ["calculate", "invoice_send"]})
    assert enabled.status == CallStatus.SUCCEEDED, enabled.error
    assert enabled.result["structured"]["enabled"] == ["calculate", "invoice_send"]
    assert {"calculate", "invoice_send"} <= listed(session)
    assert {"calculate", "invoice_send"}.isdisjoint(listed(other))
    ran = call(session, "calculate", {"expression": "(2 + 3) * 4"})
    assert ran.status == CallStatus.QUEUED, ran.error  # through the pipeline to the executor (it runs over /mcp/
    # in tests/mcp/test_tool_search_mcp.py)
    assert call(session, "invoice_send", {"recipient": "x"}).status == CallStatus.AWAITING_EXTERNAL
    refused = call(other, "calculate", {"expression": "1 + 1"})
    assert refused.status == CallStatus.FAILED and refused.error["errorType"] == "ToolNotAvailable"
    hits = call(session, "search_tools", {"query": "invoice"}).result["structured"]["tools"]
    assert hits[0]["listed"] is True


def test_enabling_and_calling_in_one_batch(tenant):
    session = session_create(tenant=tenant, agent="support-bot")
    calls = calls_submit(session=fresh(session), calls=[
        {"id": "on", "name": "enable_tools", "input": {"names": ["calculate"]}},
        {"id": "run", "name": "calculate", "input": {"expression": "6 * 7"}}])
    for submitted in calls:
        submitted.refresh_from_db()
    assert [c.status for c in calls] == [CallStatus.SUCCEEDED, CallStatus.QUEUED]


def test_a_hidden_tool_cannot_be_enabled_and_the_answer_does_not_tell_it_from_none(tenant):
    rule_create(tenant=tenant, behavior="deny", tool_pattern="payroll_run")
    session = session_create(tenant=tenant, agent="support-bot")
    answers = {}
    for name in ("payroll_run", "vault_open", "hr_fire", "no_such_tool"):
        refused = call(session, "enable_tools", {"names": ["ledger_post", name]})
        assert refused.status == CallStatus.FAILED and refused.error["errorType"] == "InvalidInput"
        answers[name] = refused.error["error"].replace(name, "NAME")
    assert len(set(answers.values())) == 1, answers
    assert "ledger_post" not in listed(session)  # all or nothing


def test_an_enabled_tool_leaves_the_surface_when_policy_takes_it_away(tenant):
    session = session_create(tenant=tenant, agent="support-bot")
    assert call(session, "enable_tools", {"names": ["ledger_post"]}).status == CallStatus.SUCCEEDED
    assert "ledger_post" in listed(session)
    rule_create(tenant=tenant, behavior="deny", tool_pattern="ledger_*")
    assert "ledger_post" not in listed(session)
    assert call(session, "ledger_post", {"account_code": "x"}).status == CallStatus.DENIED


@pytest.mark.parametrize("query", [
    "invoice & | ! ( ) :* <-> 'quoted' \"double\"", "invoice:*", "!invoice", "(invoice", "invoice\\", "invoice'",
    "invoice OR ledger", "-invoice", "invoice NEAR/2 ledger", "invoice; DROP TABLE tools_tool; --", "% _ invoice",
    "ïnvoice ünïcode 発票", "invoice\u200b\ufeff",
])
def test_full_text_syntax_in_a_query_is_plain_words(tenant, query):
    session = session_create(tenant=tenant, agent="support-bot")
    searched = call(session, "search_tools", {"query": query})
    assert searched.status == CallStatus.SUCCEEDED, searched.error
    if "invoice" in query.lower():
        assert "invoice_send" in [hit["name"] for hit in searched.result["structured"]["tools"]]


@pytest.mark.parametrize("arguments, said", [
    ({"query": "x" * 201}, "too long"),
    ({"query": "the and of"}, "searchable words"),
    ({"query": "' \" & | ! ( ) :* <->"}, "searchable words"),
    ({"query": "   "}, ""),
    ({"query": "invoice", "limit": 0}, ""),
    ({"query": "invoice", "limit": 26}, ""),
    ({"query": "invoice", "limit": "5"}, ""),
    ({"query": ["invoice"]}, ""),
    ({}, ""),
    ({"query": "invoice", "extra": 1}, ""),
])
def test_bad_search_input_is_a_clear_error(tenant, arguments, said):
    session = session_create(tenant=tenant, agent="support-bot")
    refused = call(session, "search_tools", arguments)
    assert refused.status == CallStatus.FAILED
    assert refused.error["errorType"] in ("InvalidInput", "InvalidArguments"), refused.error
    assert said in refused.error["error"]


def test_the_service_bounds_hold_without_the_schema(tenant):
    from common.errors import ServiceError

    session = fresh(session_create(tenant=tenant, agent="support-bot"))
    for query, limit in (("x" * 201, None), ("", None), (None, None), ("invoice", 26), ("invoice", True)):
        with pytest.raises(ServiceError):
            tools_search(session=session, query=query, limit=limit)
    assert [hit.name for hit in tools_search(session=session, query="invoice", limit=1)] == ["invoice_send"]


@pytest.mark.django_db(transaction=True)  # the calls view reads the key on a connection of its own
@pytest.mark.usefixtures("drain_calls")
def test_search_and_enable_over_the_rest_api(tenant, world):
    client = world.a.client("agent")
    created = client.post("/api/v1/sessions", {"agent": "rest-bot"}, format="json")
    assert created.status_code == 201
    sid = created.json()["id"]
    names = {t["function"]["name"] for t in client.get(f"/api/v1/sessions/{sid}/tools").json()["tools"]}
    assert names >= SEARCH_META and "ledger_post" not in names
    response = client.post(f"/api/v1/sessions/{sid}/calls",
                           {"calls": [{"id": "s", "name": "search_tools", "input": {"query": "general ledger"}},
                                      {"id": "e", "name": "enable_tools", "input": {"names": ["ledger_post"]}}]},
                           format="json")
    assert response.status_code == 200, response.content
    searched, enabled = response.json()["calls"]
    assert searched["result"]["structured"]["tools"][0]["name"] == "ledger_post"
    assert enabled["status"] == "succeeded"
    names = {t["function"]["name"] for t in client.get(f"/api/v1/sessions/{sid}/tools").json()["tools"]}
    assert "ledger_post" in names


def test_the_surface_preview_says_which_tools_the_search_reaches(tenant):
    from tools.catalog.selectors import surface_preview

    rule_create(tenant=tenant, behavior="deny", tool_pattern="payroll_run")
    preview = surface_preview(tenant, "support-bot")
    why = dict(preview.hidden)
    assert "search_tools" in preview.shown and "ledger_post" not in preview.shown
    assert why["ledger_post"].startswith("found with search_tools")
    assert why["payroll_run"].startswith("denied by")
    assert not why["vault_open"].startswith("found with")
