"""MCP tools in Celery workers: a governed call reaches the tenant's server (stdio, started by the worker
process; streamable HTTP) over the worker process's pooled session, relays its progress as events, and a
tool's timeout settles the call `timed_out` and cancels it upstream."""
import json
import uuid
from pathlib import Path

import pytest

from tests.distributed.support import progress, statuses
from tests.mcp.support import HttpServer, UpstreamLog

pytestmark = [pytest.mark.live, pytest.mark.postgres, pytest.mark.xdist_group("distributed")]

INSTALL = """
import json
from django.db import transaction
from tenancy.models import Tenant
from tools.upstream.client import endpoint_of, mcp_list_tools
from tools.models import McpServer, Tool, ToolGroup

tenant = Tenant.objects.get(slug="bravo")
fields = json.loads({fields!r})
listed = mcp_list_tools(endpoint_of(McpServer(tenant=tenant, **fields)))
basic = ToolGroup.objects.for_tenant(tenant).get(name="basic")
names = {{}}
# The server and its tools appear together: the periodic sync must not find the server without them.
with transaction.atomic():
    server = McpServer.objects.create(tenant=tenant, **fields)
    for upstream in listed:
        tool = Tool.objects.create(
            tenant=tenant, name=f"mcp__{{server.name}}__{{upstream.name}}"[:64], source="mcp",
            source_ref=upstream.name, mcp_server=server, description=upstream.description,
            input_schema=upstream.input_schema, timeout_s=server.timeout_s)
        basic.tools.add(tool)
        names[upstream.name] = tool.name
print(json.dumps(names))
"""


@pytest.fixture(scope="module")
def http_mcp(tmp_path_factory):
    server = HttpServer(tmp_path_factory.mktemp("dist-mcp") / "upstream.jsonl").start()
    yield server
    server.stop()


@pytest.fixture
def mcp_tools(deployment, http_mcp, tmp_path):
    """`mcp_tools(transport)`: a server of tenant `bravo` over that transport with its tools in `basic`
    (created in the stack's database through manage.py), and the log of what the server saw."""

    def install(transport: str):
        name = f"s{uuid.uuid4().hex[:8]}"
        if transport == "stdio":
            log = UpstreamLog(tmp_path / "upstream.jsonl")
            fields = {"name": name, "transport": "stdio", "command": "testkit", "timeout_s": 30,
                      "env": {"MCP_TEST_STATE": str(log.path)}}
        else:
            log = http_mcp.log
            fields = {"name": name, "transport": transport, "url": http_mcp.url(transport), "timeout_s": 30,
                      "headers": {"Authorization": f"Bearer stored-{name}"}}
        names = deployment.stack.shell(INSTALL.format(fields=json.dumps(fields)))
        return names, log

    return install


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize("transport", ["stdio", "streamable_http"])
def test_an_mcp_call_runs_in_a_worker_process_with_its_progress_as_events(deployment, mcp_tools, transport):
    names, log = mcp_tools(transport)
    api = deployment.api(deployment.b)
    session = api.new_session("mcp-dist-bot", ops=False)
    marker = uuid.uuid4().hex
    call = api.submit(session, names["echo"], {"marker": marker}, wait=60)
    assert call["status"] == "succeeded", call
    assert call["result"]["structured"] == {"marker": marker}
    [seen] = [c for c in log.calls("echo") if c["arguments"] == {"marker": marker}]
    if transport == "stdio":  # started by the MCP host process of the Celery worker process that ran the call
        assert parent_of(parent_of(seen["pid"])) in deployment.stack.worker_children()
    else:
        assert seen["authorization"] == f"Bearer stored-{call['tool'].split('__')[1]}"

    slow = api.submit(session, names["slow"], {"steps": 4, "delay": 0.01}, wait=60)
    assert slow["status"] == "succeeded", slow
    events = api.events(slow["id"])
    assert [(e["data"]["text"], e["data"]["progress"]) for e in progress(events)] == [
        (f"step {i} of 4", i / 4) for i in range(1, 5)]
    assert statuses(events) == ["queued", "running", "succeeded"]


@pytest.mark.parametrize("transport", ["stdio", "streamable_http"])
def test_an_mcp_calls_timeout_in_a_worker_cancels_it_upstream(deployment, mcp_tools, transport):
    names, log = mcp_tools(transport)
    tenant = deployment.b
    admin = deployment.api(tenant, tenant.admin_key)
    api = deployment.api(tenant)
    response = admin.http.patch(f"/api/v1/tools/{admin.tool_id(names['slow'])}", json={"timeout_s": 15})
    assert response.status_code == 200, response.text
    session = api.new_session("mcp-timeout-bot", ops=False)
    tag = f"dist-{uuid.uuid4().hex[:8]}"
    # 15 s: time for a worker process to start the stdio server too, on a loaded machine (8 s was once too
    # short in a full run: the call timed out before it reached the server, which then had nothing to cancel);
    # the call would take 30 s.
    call = api.submit(session, names["slow"], {"steps": 600, "delay": 0.05, "tag": tag}, wait=60)

    assert call["status"] == "timed_out", call
    assert call["error"]["errorType"] == "TimedOut"
    log.wait_cancelled(tag)
    assert statuses(api.events(call["id"])) == ["queued", "running", "timed_out"]
