"""Traces across the distributed deployment (docs/observability.md, "Traces"): every process of the stack exports to
the test OTLP receiver (tests/otlp_receiver.py). A call is one trace: the chain's spans from the server process, the
execution from the Celery worker process that ran it, and for an MCP tool the upstream request from the worker's MCP
host process and the upstream server's own span, which continues the `traceparent` it was sent in
`params._meta`. An app's `traceparent` is continued: the trace is the app's, the root a child of the app's span."""
import json
import uuid

import pytest

from tests.distributed.test_mcp import INSTALL
from tests.mcp.support import UpstreamLog
from tests.otlp_receiver import tree

pytestmark = [pytest.mark.live, pytest.mark.postgres, pytest.mark.xdist_group("distributed")]

STEPS = ["bind", "dispatch", "external", "normalize", "permission", "result_rules", "validate"]


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def _submit(api, session: str, name: str, arguments: dict, traceparent: str) -> dict:
    response = api.http.post(f"/api/v1/sessions/{session}/calls", json={"name": name, "input": arguments, "wait": 60},
                             headers={"traceparent": traceparent})
    assert response.status_code == 200, response.text
    [call] = response.json()["calls"]
    return call


def _named(spans) -> dict:
    found: dict = {}
    for span in spans:
        found.setdefault(span.name, []).append(span)
    return found


def test_a_call_on_a_worker_is_one_trace_across_the_processes(deployment):
    api = deployment.api(deployment.b)
    session = api.new_session("traced-bot", ops=False)
    call = api.submit(session, "reset_tools", {"ops": True, "hardening": True}, wait=10)
    assert call["status"] == "succeeded", call  # a meta tool: its own trace, settled in the request
    trace_id, app_span, traceparent = _traceparent()
    greeting = _submit(api, session, "stack_greeting", {"name": "Ada"}, traceparent)
    assert greeting["status"] == "succeeded", greeting
    assert greeting["trace_id"] == trace_id  # the app's trace, continued
    spans = deployment.otlp.spans_of(trace_id, 1 + 1 + len(STEPS) + 2)
    named = _named(spans)
    [root] = named["execute_tool stack_greeting"]
    assert root.parent_id == app_span and root.attributes["toolkeeper.call.id"] == greeting["id"]
    assert tree(spans)[root.name] == ["execution", "policy"]
    assert tree(spans)["policy"] == STEPS and tree(spans)["execution"] == ["after_steps"]
    [policy], [execution] = named["policy"], named["execution"]
    # the chain ran in the server process, the execution in a Celery worker's process
    assert policy.resource["toolkeeper.process"] == "server"
    assert execution.resource["toolkeeper.process"] == "worker"
    assert execution.resource["process.pid"] != policy.resource["process.pid"]
    assert execution.resource["process.pid"] in deployment.stack.worker_children()
    assert {span.trace_id for span in spans} == {trace_id}
    assert call["trace_id"] not in (None, trace_id)  # one trace per call


def test_an_mcp_call_is_one_trace_down_to_the_upstream_servers_span(deployment, tmp_path):
    log = UpstreamLog(tmp_path / "upstream.jsonl")
    name = f"s{uuid.uuid4().hex[:8]}"
    fields = {"name": name, "transport": "stdio", "command": "testkit", "timeout_s": 30,
              "env": {"MCP_TEST_STATE": str(log.path), "MCP_TEST_OTLP": deployment.otlp.endpoint}}
    names = deployment.stack.shell(INSTALL.format(fields=json.dumps(fields)))
    api = deployment.api(deployment.b)
    session = api.new_session("traced-mcp-bot", ops=False)
    trace_id, app_span, traceparent = _traceparent()
    call = _submit(api, session, names["echo"], {"marker": trace_id}, traceparent)
    assert call["status"] == "succeeded", call
    assert call["trace_id"] == trace_id
    spans = deployment.otlp.spans_of(trace_id, 1 + 1 + len(STEPS) + 2 + 2)
    named = _named(spans)
    [root] = named[f"execute_tool {names['echo']}"]
    [execution] = named["execution"]
    [client, server] = sorted(named["tools/call echo"], key=lambda span: span.start_ns)
    assert root.parent_id == app_span
    assert execution.parent_id == root.span_id
    assert client.parent_id == execution.span_id  # in the worker's MCP host process
    assert client.resource["toolkeeper.process"] == "mcp-host"
    assert client.resource["process.pid"] != execution.resource["process.pid"]
    assert server.parent_id == client.span_id  # the upstream continued what it was sent
    assert server.resource["service.name"] == "test-mcp-upstream"
    [seen] = log.events("traceparent")
    assert seen["traceparent"] == f"00-{trace_id}-{client.span_id}-01"  # our span, in params._meta
    assert app_span not in seen["traceparent"]


def test_the_mcp_endpoint_continues_a_traceparent_from_meta_and_ignores_a_malformed_one(deployment):
    api = deployment.api(deployment.b)
    session = api.new_session("traced-mcp-client", ops=False)
    trace_id, app_span, traceparent = _traceparent()
    headers = {"Authorization": f"Bearer {deployment.b.api_key}", "X-Toolkeeper-Session": session,
               "Mcp-Protocol-Version": "2025-11-25", "Accept": "application/json, text/event-stream"}
    # params._meta first, then the header; a malformed value is ignored wherever it is (never an error)
    sent = [({"traceparent": traceparent}, "00-garbage"), ({"traceparent": 17}, "00-zz-zz-zz"), ({}, traceparent),
            ({"traceparent": "ff-" + traceparent[3:]}, None)]
    for number, (meta, header) in enumerate(sent, start=1):
        response = api.http.post("/mcp/", headers={**headers, **({"traceparent": header} if header else {})}, json={
            "jsonrpc": "2.0", "id": number, "method": "tools/call",
            "params": {"name": "reset_tools", "arguments": {"ops": True}, "_meta": meta}})
        assert response.status_code == 200, response.text
        assert '"isError":true' not in response.text.replace(" ", ""), response.text
    rows = deployment.stack.sql("SELECT trace_id, trace_parent_id FROM tools_toolcall WHERE session_id = %s "
                                "ORDER BY created_at", [session])
    assert [row for row in rows if row[0] == trace_id] == [rows[0], rows[2]] == [(trace_id, app_span)] * 2
    assert all(len(row[0]) == 32 and row[1] == "" for row in (rows[1], rows[3]))  # traces of their own
    spans = deployment.otlp.spans_of(trace_id, 2 * (1 + 1 + len(STEPS)))  # two meta calls: root, chain, steps
    roots = [span for span in spans if span.name == "execute_tool reset_tools"]
    assert len(roots) == 2 and {root.parent_id for root in roots} == {app_span}
