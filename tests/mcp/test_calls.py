"""Governed calls of MCP tools, end to end on the local executor: the app's API, the pipeline, the MCP source,
the pooled session, a real server. Calls really run in executor threads, so these tests are transactional."""
import json
import uuid

import pytest

from approvals.models import ApprovalRequest
from approvals.services import request_decide, rule_create
from audit.models import Event
from tests.mcp.servers import LONG_NAME
from tests.mcp.support import catalog_name, install_mcp_tools, mcp_server
from tests.tools.support import events_of, poll, submit, wait_status, wait_terminal
from tools.catalog.services import binding_set, catalog_sync, session_create
from tools.models import CallEvent, CallStatus, EventKind, Tool
from tools.upstream.client import mcp_sessions_close
from tools.upstream.source import McpSource

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("drain_calls")]

TRANSPORTS = ["stdio", "streamable_http"]


class Setup:
    """Tenant A's MCP server over one transport, its tools in the `basic` group, what the server saw."""

    def __init__(self, world, server, tools, log, stored_authorization=""):
        self.world, self.server, self.tools, self.log = world, server, tools, log
        self.stored_authorization = stored_authorization
        self.session = session_create(tenant=world.a.tenant, agent="mcp-bot", api_key=world.a.key_objects["agent"])

    def name(self, upstream: str) -> str:
        return self.tools[upstream].name

    def submit(self, upstream: str, arguments: dict, wait: float = 30) -> dict:
        body = {"name": self.name(upstream), "input": arguments}
        if wait:
            body["wait"] = wait
        [call] = submit(self.world.a.client(), self.session, body)
        return call


def set_fields(tool: Tool, **fields) -> None:
    """Change a catalog row as an operator would (a save: the catalog snapshots see it)."""
    tool.refresh_from_db()
    for name, value in fields.items():
        setattr(tool, name, value)
    tool.save()


@pytest.fixture
def mcp(world, stdio_servers, loopback_allowed, upstream, http_server):
    """`mcp(transport)`: tenant A's server `local` over that transport, with its tools installed."""

    def make(transport: str = "stdio", **fields) -> Setup:
        if transport == "stdio":
            server = mcp_server(world.a.tenant, env={"MCP_TEST_STATE": str(upstream.path)}, **fields)
            return Setup(world, server, install_mcp_tools(server), upstream)
        authorization = f"Bearer stored-{uuid.uuid4().hex}"
        server = mcp_server(world.a.tenant, transport=transport, url=http_server.url(transport),
                            headers={"Authorization": authorization}, **fields)
        return Setup(world, server, install_mcp_tools(server), http_server.log, authorization)

    return make


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_governed_call_runs_upstream_and_keeps_its_content_and_structure(mcp, transport):
    setup = mcp(transport)
    marker = uuid.uuid4().hex
    call = setup.submit("echo", {"marker": marker, "n": 2})

    assert call["status"] == "succeeded", call
    assert call["result"] == {"state": "success", "structured": {"marker": marker, "n": 2},
                              "content": [{"type": "text", "text": f'{{"marker": "{marker}", "n": 2}}'}]}
    [seen] = [e for e in setup.log.calls("echo") if e["arguments"].get("marker") == marker]
    assert seen["arguments"] == {"marker": marker, "n": 2}
    if transport != "stdio":  # the server got its own stored credential, never the app's API key
        assert seen["authorization"] == setup.stored_authorization
        assert setup.world.a.keys["agent"] not in str(setup.log.events())
        # …and the stored credential appears in none of the call's events, its API answer or the audit trail.
        events = CallEvent.objects.for_tenant(setup.world.a.tenant).filter(call_id=call["id"])
        trail = Event.objects.for_tenant(setup.world.a.tenant).values_list("data", flat=True)
        recorded = json.dumps([e.data for e in events]) + json.dumps(call) + json.dumps(list(trail))
        assert events.exists() and setup.stored_authorization not in recorded


def test_a_dotted_long_upstream_name_is_called_by_its_catalog_name(mcp):
    setup = mcp("stdio")
    name = setup.name(LONG_NAME)
    assert name == catalog_name("local", LONG_NAME) and len(name) <= 64
    call = setup.submit(LONG_NAME, {"path": "/etc/motd"})
    assert call["status"] == "succeeded", call
    assert setup.log.calls(LONG_NAME)[0]["arguments"] == {"path": "/etc/motd"}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_upstream_progress_becomes_the_calls_progress_events_in_order(mcp, transport):
    setup = mcp(transport)
    call = setup.submit("slow", {"steps": 5, "delay": 0.01})
    assert call["status"] == "succeeded", call
    events = CallEvent.objects.for_tenant(setup.world.a.tenant).filter(call_id=call["id"]).order_by("seq")
    progress = [(e.data["text"], e.data["progress"]) for e in events if e.kind == EventKind.PROGRESS]
    assert progress == [(f"step {i} of 5", i / 5) for i in range(1, 6)]
    kinds = [e.kind for e in events]
    assert kinds.index(EventKind.PROGRESS) > 0 and kinds[-1] == EventKind.STATUS  # between running and settled


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_tools_timeout_ends_the_call_as_timed_out_and_cancels_it_upstream(mcp, transport):
    setup = mcp(transport)
    set_fields(setup.tools["slow"], timeout_s=1.5)
    assert setup.submit("echo", {})["status"] == "succeeded"  # the session is open: the timeout is the call's
    tag = f"governed-timeout-{uuid.uuid4().hex[:8]}"
    call = setup.submit("slow", {"steps": 400, "delay": 0.05, "tag": tag})

    assert call["status"] == "timed_out", call
    assert call["error"]["errorType"] == "TimedOut"
    setup.log.wait_cancelled(tag)
    statuses = [e["data"]["status"] for e in events_of(setup.world.a.client(), call["id"]) if e["kind"] == "status"]
    assert statuses == ["queued", "running", "timed_out"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_cancelling_a_running_call_interrupts_it_and_cancels_it_upstream(mcp, transport):
    setup = mcp(transport)
    tag = f"governed-cancel-{uuid.uuid4().hex[:8]}"
    call = setup.submit("slow", {"steps": 400, "delay": 0.05, "tag": tag}, wait=0)
    client = setup.world.a.client()
    poll(lambda: len([e for e in events_of(client, call["id"]) if e["kind"] == "progress"]) >= 2,
         timeout=30, message="progress of the call")

    response = client.post(f"/api/v1/calls/{call['id']}/cancel")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "interrupted"
    setup.log.wait_cancelled(tag)
    final = wait_terminal(call["id"], tenant=setup.world.a.tenant)
    assert final.status == CallStatus.INTERRUPTED


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_upstream_is_error_fails_the_call_with_upstream_tool_error(mcp, transport):
    setup = mcp(transport)
    call = setup.submit("fail", {"message": "the quota is exhausted"})
    assert call["status"] == "failed", call
    assert call["error"] == {"errorType": "UpstreamToolError", "error": "the quota is exhausted",
                             "tool": setup.name("fail"), "callId": call["call_id"]}


def test_tools_of_a_disabled_or_removed_server_and_disabled_tools_are_not_available(mcp):
    setup = mcp("stdio")
    tenant = setup.world.a.tenant
    assert setup.submit("echo", {})["status"] == "succeeded"
    calls_before = len(setup.log.calls())

    setup.server.enabled = False
    setup.server.save()
    refused = setup.submit("echo", {"while": "disabled"})
    assert refused["status"] == "failed" and refused["error"]["errorType"] == "ToolNotAvailable", refused

    setup.server.enabled = True
    setup.server.save()
    assert setup.submit("echo", {"while": "enabled again"})["status"] == "succeeded"
    set_fields(setup.tools["echo"], enabled=False)
    assert setup.submit("echo", {"while": "tool disabled"})["error"]["errorType"] == "ToolNotAvailable"

    setup.server.delete()  # its tools stay, without a server
    assert Tool.objects.for_tenant(tenant).get(pk=setup.tools["lookup"].pk).mcp_server_id is None
    assert setup.submit("lookup", {"key": "k"})["error"]["errorType"] == "ToolNotAvailable"
    assert len(setup.log.calls()) == calls_before + 1  # only the call made while everything was enabled


def test_the_source_refuses_a_call_whose_server_went_meanwhile(mcp):
    """A call that passed Normalize before its server was disabled still never goes upstream."""
    setup = mcp("stdio")
    tool = setup.tools["echo"]
    setup.server.enabled = False
    setup.server.save()
    tool.refresh_from_db()
    with pytest.raises(Exception, match="its MCP server was disabled") as refused:  # noqa: PT011
        McpSource().invoke(tool, {}, ctx=None)
    assert refused.value.error_type == "ToolNotAvailable"


def test_an_unreachable_server_fails_the_call_with_upstream_unavailable(world, loopback_allowed, own_http_server):
    server = mcp_server(world.a.tenant, name="web", transport="streamable_http", url=own_http_server.url())
    tools = install_mcp_tools(server)
    own_http_server.stop()
    setup = Setup(world, server, tools, own_http_server.log)
    call = setup.submit("echo", {})
    assert call["status"] == "failed", call
    assert call["error"]["errorType"] == "UpstreamUnavailable"
    assert call["error"]["error"] == "MCP server web could not be reached (the connection failed)"


def test_a_refused_address_fails_at_once_even_for_an_idempotent_tool(mcp, settings, caplog):
    setup = mcp("streamable_http")
    set_fields(setup.tools["lookup"], idempotent=True)  # (trusted annotations made it so already)
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = []  # (settings are read at start in production:
    mcp_sessions_close()  # here the session the listing opened goes, so the next one connects anew)
    call = setup.submit("lookup", {"key": "k"})
    assert call["status"] == "failed", call
    assert call["error"]["errorType"] == "UpstreamUnavailable"
    assert call["error"]["error"] == ("MCP server local may not be reached: 127.0.0.1 is a loopback address; "
                                      "only public addresses may be reached")
    refusals = [r for r in caplog.records if r.name == "toolkeeper.outbound"]
    assert len(refusals) == 1  # one attempt: trying again cannot help


def test_an_idempotent_tool_is_tried_again_when_the_server_is_lost_and_another_is_not(mcp, tmp_path):
    setup = mcp("stdio")
    once = setup.submit("die_once", {"marker": str(tmp_path / "plain")})
    assert once["status"] == "failed" and once["error"]["errorType"] == "UpstreamUnavailable", once
    assert len(setup.log.calls("die_once")) == 1

    set_fields(setup.tools["die_once"], idempotent=True)
    retried = setup.submit("die_once", {"marker": str(tmp_path / "idempotent")})
    assert retried["status"] == "succeeded", retried
    assert retried["result"]["content"] == [{"type": "text", "text": "survived"}]
    assert [c["arguments"]["marker"] for c in setup.log.calls("die_once")][1:] == [str(tmp_path / "idempotent")] * 2


def test_a_bound_argument_reaches_upstream_and_the_model_never_sees_it(mcp):
    setup = mcp("stdio")
    tenant = setup.world.a.tenant
    binding_set(tenant=tenant, tool=setup.tools["lookup"], name="key", value="tenant-42")
    schemas = setup.world.a.client().get(f"/api/v1/sessions/{setup.session.pk}/tools?format=mcp").json()["tools"]
    [lookup] = [t for t in schemas if t["name"] == setup.name("lookup")]
    assert "key" not in lookup["inputSchema"].get("properties", {})
    assert "key" not in lookup["inputSchema"].get("required", [])

    call = setup.submit("lookup", {})
    assert call["status"] == "succeeded", call
    assert setup.log.calls("lookup")[-1]["arguments"] == {"key": "tenant-42"}
    overridden = setup.submit("lookup", {"key": "mine"})
    assert overridden["error"]["errorType"] == "BoundArgumentOverride"
    assert len(setup.log.calls("lookup")) == 1


def test_an_ask_rule_holds_the_call_until_approved_and_it_runs_upstream_once(mcp):
    setup = mcp("stdio")
    tenant = setup.world.a.tenant
    rule_create(tenant=tenant, behavior="ask", tool_pattern="mcp__local__*")
    marker = uuid.uuid4().hex
    call = setup.submit("echo", {"marker": marker}, wait=0)
    wait_status(call["id"], CallStatus.AWAITING_APPROVAL, tenant=tenant)
    assert setup.log.calls("echo") == []

    request = ApprovalRequest.objects.for_tenant(tenant).get(call_id=call["id"])
    request_decide(request=request, reviewer=setup.world.a.users["reviewer"], decision="approve")
    final = wait_terminal(call["id"], tenant=tenant)
    assert final.status == CallStatus.SUCCEEDED, final.error
    assert final.result["structured"] == {"marker": marker}
    assert [c["arguments"] for c in setup.log.calls("echo")] == [{"marker": marker}]


def test_tenant_b_cannot_call_tenant_as_mcp_tools(mcp):
    setup = mcp("stdio")
    world = setup.world
    session = session_create(tenant=world.b.tenant, agent="intruder")
    [call] = submit(world.b.client(), session, {"name": setup.name("echo"), "input": {}, "wait": 10})
    assert call["status"] == "failed" and call["error"]["errorType"] == "ToolNotAvailable", call
    assert setup.log.calls() == []


def test_the_catalog_sync_of_the_sources_leaves_mcp_tools_alone(mcp):
    setup = mcp("stdio")
    tenant = setup.world.a.tenant
    before = {t.pk: (t.name, t.enabled, t.source, t.input_schema, t.updated_at)
              for t in Tool.objects.for_tenant(tenant).filter(source="mcp")}
    assert McpSource().definitions(tenant) == ()
    catalog_sync(tenant=tenant)
    after = {t.pk: (t.name, t.enabled, t.source, t.input_schema, t.updated_at)
             for t in Tool.objects.for_tenant(tenant).filter(source="mcp")}
    assert after == before and len(after) == len(setup.tools)
