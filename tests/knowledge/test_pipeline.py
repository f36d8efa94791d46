"""knowledge_search through the real surface: exposed schemas, the pipeline's refusal of bound
arguments, and calls that really run on the executor."""
import pytest

from knowledge.models import Document
from tests.knowledge.conftest import B_SECRET, search_tool
from tests.tools.support import wait_terminal
from tools.calls.submit import calls_submit
from tools.catalog.services import binding_delete, binding_set, session_create
from tools.models import CallStatus, ToolCall, ToolGroup

SERVER_BOUND = ("datasets", "filter")


def _activate(tenant_world, agent="support-bot"):
    """A session of the agent's with the knowledge group switched on (through reset_tools, like a model)."""
    session = session_create(tenant=tenant_world.tenant, agent=agent, user="alice@example.com")
    [call] = calls_submit(session=session, calls=[{"name": "reset_tools", "input": {"knowledge": True}}])
    assert call.status == CallStatus.SUCCEEDED, call.error
    return session


def _schemas(client, session, fmt):
    response = client.get(f"/api/v1/sessions/{session.pk}/tools", {"format": fmt})
    assert response.status_code == 200, response.content
    return response.json()["tools"]


def _search_schema(tools, fmt):
    for entry in tools:
        if fmt == "openai" and entry["function"]["name"] == "knowledge_search":
            return entry["function"]["parameters"]
        if fmt == "anthropic" and entry.get("name") == "knowledge_search":
            return entry["input_schema"]
        if fmt == "mcp" and entry.get("name") == "knowledge_search":
            return entry["inputSchema"]
    raise AssertionError(f"knowledge_search is not in the {fmt} tool list")


@pytest.mark.django_db
def test_the_knowledge_group_is_switchable_and_described(world):
    group = ToolGroup.objects.for_tenant(world.a.tenant).get(name="knowledge")
    assert group.switchable and not group.default_active
    assert group.description and list(group.tools.values_list("name", flat=True)) == ["knowledge_search"]


@pytest.mark.django_db
@pytest.mark.parametrize("fmt", ["openai", "anthropic", "mcp"])
def test_the_model_sees_only_query_and_top_k(kb, fmt):
    a = kb.world.a
    binding_set(tenant=a.tenant, tool=search_tool(a.tenant), name="filter", value={"department": "hr"},
                agent="hr-bot")
    for agent in ("support-bot", "hr-bot"):
        schema = _search_schema(_schemas(a.client(), _activate(a, agent), fmt), fmt)
        assert set(schema["properties"]) == {"query", "top_k"}
        assert schema["required"] == ["query"]
        text = str(schema)
        assert "department" not in text and '"filter"' not in text and "'filter'" not in text
    # The catalog keeps both arguments (so they can be bound); only the model's view drops them.
    assert set(search_tool(a.tenant).input_schema["properties"]) == {"query", "top_k", *SERVER_BOUND}


@pytest.mark.django_db
@pytest.mark.parametrize("argument", SERVER_BOUND)
def test_input_that_sets_a_bound_argument_is_refused(kb, argument):
    a = kb.world.a
    session = _activate(a)
    value = {"department": "it"} if argument == "filter" else ["archive"]
    [call] = calls_submit(session=session, calls=[
        {"name": "knowledge_search", "input": {"query": "vpn", argument: value}}])
    assert call.status == CallStatus.FAILED
    assert call.error["errorType"] == "BoundArgumentOverride"
    assert argument in call.error["error"]


@pytest.mark.django_db
def test_fresh_tenants_get_the_safe_default_scope(world):
    tool = search_tool(world.b.tenant)
    assert {b.name: b.value for b in tool.bindings.filter(agent="")} == {"datasets": "*", "filter": {}}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls", "threads_share_the_database")
def test_calls_run_through_the_pipeline_with_the_agents_scope(kb):
    a = kb.world.a
    binding_set(tenant=a.tenant, tool=search_tool(a.tenant), name="filter", value={"department": "hr"},
                agent="hr-bot")
    hr_session = _activate(a, "hr-bot")
    other_session = _activate(a, "support-bot")
    query = {"query": f"VPN tunnel WireGuard laptop {B_SECRET}", "top_k": 10}
    [hr_call] = calls_submit(session=hr_session, calls=[{"id": "s1", "name": "knowledge_search", "input": query}])
    [other_call] = calls_submit(session=other_session, calls=[{"id": "s1", "name": "knowledge_search",
                                                               "input": query}])
    hr_call = wait_terminal(hr_call.pk, tenant=a.tenant)
    other_call = wait_terminal(other_call.pk, tenant=a.tenant)
    assert hr_call.status == other_call.status == CallStatus.SUCCEEDED, (hr_call.error, other_call.error)
    assert hr_call.input == query  # bound values are never echoed as the model's input
    assert hr_call.effective_input["filter"] == {"department": "hr"}
    hr_results = hr_call.result["structured"]["results"]
    other_results = other_call.result["structured"]["results"]
    assert other_results[0]["title"] == "VPN Setup Guide"
    assert hr_results and {r["title"] for r in hr_results} == {"New Hire Onboarding"}
    a_ids = set(Document.objects.for_tenant(a.tenant).values_list("pk", flat=True))
    for result in (hr_results, other_results):
        assert {r["document_id"] for r in result} <= a_ids
    assert B_SECRET not in str(hr_results) + str(other_results)  # the query itself names it; no result does


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls", "threads_share_the_database")
def test_empty_and_overlong_queries_fail_clearly_through_the_pipeline(kb):
    session = _activate(kb.world.a)
    calls = calls_submit(session=session, calls=[
        {"id": "empty", "name": "knowledge_search", "input": {"query": "  "}},
        {"id": "long", "name": "knowledge_search", "input": {"query": "vpn " * 200}},
    ])
    empty, long = (wait_terminal(c.pk, tenant=kb.world.a.tenant) for c in calls)
    assert empty.status == long.status == CallStatus.FAILED
    assert empty.error["errorType"] == long.error["errorType"] == "InvalidQuery"
    assert "empty" in empty.error["error"]
    assert "500" in long.error["error"]
    assert "Traceback" not in str(empty.result) + str(long.result)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls", "threads_share_the_database")
def test_without_tenant_wide_bindings_the_model_still_cannot_choose_the_scope(kb):
    a = kb.world.a
    for binding in search_tool(a.tenant).bindings.all():
        binding_delete(binding=binding)
    session = _activate(a)
    [call] = calls_submit(session=session, calls=[
        {"name": "knowledge_search", "input": {"query": "vpn", "filter": {"department": "it"}}}])
    call = wait_terminal(call.pk, tenant=a.tenant)
    assert call.status == CallStatus.FAILED
    assert call.error["errorType"] == "BoundArgumentOverride"
    assert ToolCall.objects.for_tenant(a.tenant).filter(pk=call.pk, status=CallStatus.FAILED).exists()
