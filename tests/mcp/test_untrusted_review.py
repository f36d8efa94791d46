"""Tools of untrusted MCP servers wait for a reviewer when the tenant reviews them (docs/governance.md, the
decision): over the REST API with a real upstream server, and over `/mcp/` with the SDK's own client against a
live server. The tenants of the test world run calls by default (`default_behavior` allow)."""
import json
import uuid

import pytest

from approvals.models import ApprovalRequest
from approvals.services import request_decide, rule_create
from tenancy.services import tenant_governance_set
from tests.live.server import LiveServer
from tests.mcp.support import HttpServer, mcp_server
from tests.mcp.test_endpoint import db, mcp, rest
from tests.tools.support import submit, wait_status, wait_terminal
from tools.catalog.services import session_create
from tools.models import CallStatus, Tool, ToolGroup
from tools.upstream.servers import mcp_server_sync


def synced(tenant, upstream, *, name: str, trusted: bool) -> dict:
    """A stdio test server of `tenant`, synced as an operator would, its tools in `basic`: upstream name → Tool."""
    server = mcp_server(tenant, name=name, trusted=trusted, env={"MCP_TEST_STATE": str(upstream.path)})
    assert mcp_server_sync(server=server)["status"] == "ok"
    tools = {tool.source_ref: tool for tool in Tool.objects.for_tenant(tenant).filter(mcp_server=server)}
    ToolGroup.objects.for_tenant(tenant).get(name="basic").tools.add(*tools.values())
    return tools


@pytest.fixture
def loose(world, stdio_servers, upstream):
    """Tenant A's untrusted server `loose` and a session to call its tools from."""
    tools = synced(world.a.tenant, upstream, name="loose", trusted=False)
    assert not tools["echo"].trusted and tools["echo"].destructive  # what a sync makes of an untrusted server
    session = session_create(tenant=world.a.tenant, agent="mcp-bot", api_key=world.a.key_objects["agent"])

    def call(tool: str = "echo", wait: float = 30) -> dict:
        marker = uuid.uuid4().hex
        body = {"name": tools[tool].name, "input": {"marker": marker}, "wait": wait}
        [made] = submit(world.a.client(), session, body)
        made["marker"] = marker
        return made

    return call


@pytest.mark.usefixtures("drain_calls", "fresh_rule_index")
@pytest.mark.django_db(transaction=True)
def test_an_untrusted_servers_tool_waits_for_a_reviewer_and_runs_once_approved(world, loose, upstream):
    tenant = world.a.tenant
    assert tenant.default_behavior == "allow" and tenant.review_untrusted  # the default of every tenant
    call = loose(wait=0)
    wait_status(call["id"], CallStatus.AWAITING_APPROVAL, tenant=tenant)
    assert call["decision"]["behavior"] == "ask" and call["decision"]["rule"] is None
    assert "untrusted MCP server" in call["decision"]["reason"]
    assert upstream.calls("echo") == []  # nothing reached the server

    request = ApprovalRequest.objects.for_tenant(tenant).get(call_id=call["id"])
    assert request.queue.is_default  # the tenant's default queue, as any ask without a rule
    request_decide(request=request, reviewer=world.a.users["reviewer"], decision="approve")
    final = wait_terminal(call["id"], tenant=tenant)
    assert final.status == CallStatus.SUCCEEDED, final.error
    assert [c["arguments"] for c in upstream.calls("echo")] == [{"marker": call["marker"]}]


@pytest.mark.usefixtures("drain_calls", "fresh_rule_index")
@pytest.mark.django_db(transaction=True)
def test_an_explicit_rule_decides_an_untrusted_servers_tool(world, loose, upstream):
    tenant = world.a.tenant
    allow = rule_create(tenant=tenant, behavior="allow", tool_pattern="mcp__loose__echo")
    call = loose()
    assert call["status"] == CallStatus.SUCCEEDED, call
    assert call["decision"]["rule"] == allow.pk and call["decision"]["behavior"] == "allow"
    assert [c["arguments"] for c in upstream.calls("echo")] == [{"marker": call["marker"]}]

    rule_create(tenant=tenant, behavior="deny", tool_pattern="mcp__loose__*")
    denied = loose()
    assert denied["status"] == CallStatus.DENIED and denied["error"]["errorType"] == "PermissionDenied"
    assert len(upstream.calls("echo")) == 1


@pytest.mark.usefixtures("drain_calls", "fresh_rule_index")
@pytest.mark.django_db(transaction=True)
def test_with_the_setting_off_the_tenants_default_decides(world, loose, upstream):
    tenant = world.a.tenant
    tenant_governance_set(tenant=tenant, review_untrusted=False)
    call = loose()
    assert call["status"] == CallStatus.SUCCEEDED, call
    assert call["decision"] == {"behavior": "allow", "rule": None,
                                "reason": "no rule matched: the tenant's default is allow"}
    assert len(upstream.calls("echo")) == 1

    # the setting never loosens a stricter default: ask stays a plain ask, deny stays deny, on or off
    for review in (False, True):
        tenant_governance_set(tenant=tenant, review_untrusted=review, default_behavior="deny")
        assert loose()["status"] == CallStatus.DENIED
    tenant_governance_set(tenant=tenant, default_behavior="ask")
    asked = loose(wait=0)
    assert asked["decision"]["reason"] == "no rule matched: the tenant's default is ask"
    assert len(upstream.calls("echo")) == 1


@pytest.mark.usefixtures("drain_calls", "fresh_rule_index")
@pytest.mark.django_db(transaction=True)
def test_a_trusted_servers_tool_runs_under_the_default(world, stdio_servers, upstream):
    tenant = world.a.tenant
    tools = synced(tenant, upstream, name="vetted", trusted=True)
    session = session_create(tenant=tenant, agent="mcp-bot", api_key=world.a.key_objects["agent"])
    [call] = submit(world.a.client(), session, {"name": tools["echo"].name, "input": {"marker": "m"}, "wait": 30})
    assert call["status"] == CallStatus.SUCCEEDED, call
    assert call["decision"]["behavior"] == "allow"
    assert [c["arguments"] for c in upstream.calls("echo")] == [{"marker": "m"}]


@pytest.mark.usefixtures("fresh_rule_index")
@pytest.mark.django_db(transaction=True)
def test_the_preview_decides_as_the_call(world, loose):
    """`rules/evaluate` and the console's simulator give the decision a call gets."""
    admin, console = world.a.client("admin"), world.a.console("operator")
    query = {"tool": "mcp__loose__echo", "input": {"marker": "x"}, "agent": "mcp-bot"}
    evaluated = admin.post("/api/v1/rules/evaluate", query, format="json")
    assert evaluated.status_code == 200
    call = loose(wait=0)
    assert evaluated.json() == call["decision"]
    page = console.get(f"/t/{world.a.tenant.slug}/rules/", {
        "tool": "mcp__loose__echo", "agent": "mcp-bot", "input": json.dumps({"marker": "x"})}).content.decode()
    decision = page[page.index('id="decision"'):]
    assert 'class="tag b-ask"' in decision and "untrusted MCP server" in decision

    tenant_governance_set(tenant=world.a.tenant, review_untrusted=False)
    assert admin.post("/api/v1/rules/evaluate", query, format="json").json()["behavior"] == "allow"


# --- /mcp/ on a live server, with the SDK's client ----------------------------------------------------------

@pytest.fixture(scope="module")
def live_with_servers(tmp_path_factory):
    """A live server whose demo tenant (default allow) has an untrusted and a trusted HTTP server with their
    tools in `basic`."""
    upstream = HttpServer(tmp_path_factory.mktemp("review-upstream") / "upstream.jsonl").start()
    env = {"TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS": "127.0.0.1", "TOOLKEEPER_MCP_HEARTBEAT_S": "0.2",
           "TOOLKEEPER_MCP_MAX_WAIT_S": "3"}
    try:
        with LiveServer(extra_env=env) as live:
            key = live.admin_api_key
            for name, trusted in (("loose", False), ("vetted", True)):
                status, server = rest(live, "POST", "/api/v1/mcp-servers", {
                    "name": name, "transport": "streamable_http", "url": upstream.url(), "trusted": trusted}, key=key)
                assert status == 201, server
                status, body = rest(live, "POST", f"/api/v1/mcp-servers/{server['id']}/sync", {}, key=key)
                assert status == 200 and body["sync"]["status"] == "ok", body
            [basic] = [g for g in rest(live, "GET", "/api/v1/groups?limit=500", key=key)[1]["results"]
                       if g["name"] == "basic"]
            status, body = rest(live, "PATCH", f"/api/v1/groups/{basic['id']}", {
                "tools": [*basic["tools"], "mcp__loose__echo", "mcp__vetted__echo"]}, key=key)
            assert status == 200, body
            yield live, upstream
    finally:
        upstream.stop()


def echo_over_mcp(live, tool: str, marker: str):
    async def work(client):
        return await client.call_tool(tool, {"marker": marker})

    return mcp(live, work, headers={"X-Toolkeeper-Agent": "review-bot"})


def status_of_marker(live, marker: str) -> list[str]:
    return db(live, "import json; from tools.models import ToolCall; print(json.dumps([c.status for c in "
                    f"ToolCall.all_tenants.filter(input__marker='{marker}')]))")


@pytest.mark.live
def test_over_mcp_an_untrusted_servers_tool_is_held_and_the_others_run(live_with_servers):
    live, upstream = live_with_servers
    key = live.admin_api_key

    async def listing(client):
        return {tool.name: tool.annotations for tool in (await client.list_tools()).tools}

    listed = mcp(live, listing, headers={"X-Toolkeeper-Agent": "review-bot"})
    loose = listed["mcp__loose__echo"]
    # the listing claims what it claimed before: an untrusted server's tool is a destructive write
    assert (loose.read_only_hint, loose.destructive_hint) == (False, True)

    held = uuid.uuid4().hex
    result = echo_over_mcp(live, "mcp__loose__echo", held)
    assert result.is_error and result.structured_content["status"] == "pending_approval", result
    assert status_of_marker(live, held) == ["awaiting_approval"]
    assert held not in [c["arguments"].get("marker") for c in upstream.log.calls("echo")]  # nothing reached it

    ran = uuid.uuid4().hex
    result = echo_over_mcp(live, "mcp__vetted__echo", ran)
    assert not result.is_error and result.structured_content == {"marker": ran}
    assert [c["arguments"]["marker"] for c in upstream.log.calls("echo")][-1] == ran

    status, rule = rest(live, "POST", "/api/v1/rules", {"behavior": "allow", "tool_pattern": "mcp__loose__echo"},
                        key=key)
    assert status == 201, rule
    allowed = uuid.uuid4().hex
    result = echo_over_mcp(live, "mcp__loose__echo", allowed)
    assert not result.is_error and result.structured_content == {"marker": allowed}
    assert rest(live, "DELETE", f"/api/v1/rules/{rule['id']}", key=key)[0] == 204

    status, settings = rest(live, "PATCH", "/api/v1/governance", {"review_untrusted": False}, key=key)
    assert status == 200 and settings["review_untrusted"] is False
    unreviewed = uuid.uuid4().hex
    result = echo_over_mcp(live, "mcp__loose__echo", unreviewed)
    assert not result.is_error and result.structured_content == {"marker": unreviewed}
    assert rest(live, "PATCH", "/api/v1/governance", {"review_untrusted": True}, key=key)[0] == 200
