"""By default a process keeps its MCP sessions in a host process of its own (tools.upstream.client, "the host
process"): the SDK's work runs beside the process serving requests. The host owns the stdio servers, takes
its parent's settings with each request, relays its log records, ends when its parent does, and is
replaced when it dies."""
import logging
import os
import signal
import socket
import threading
from pathlib import Path

import pytest

from tests.mcp.support import process_alive
from tests.mcp.test_client import endpoint  # noqa: F401  (the fixture)
from tests.tools.support import poll
from tools.upstream import client as mcp_client
from tools.upstream.client import UpstreamUnavailable, mcp_call_tool, mcp_sessions


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture(autouse=True)
def _host_mode(settings):
    settings.TOOLKEEPER_MCP_CLIENT_PROCESS = True


def test_sessions_and_stdio_servers_live_in_the_host_process(endpoint):  # noqa: F811
    target = endpoint("stdio")
    server_pid = mcp_call_tool(target, "whoami", {}, timeout_s=20)["structured"]["pid"]
    host = mcp_client._host_state
    assert host is not None and host.child.pid != os.getpid()
    assert parent_of(server_pid) == host.child.pid  # the stdio server is the host's child, not ours
    assert mcp_sessions()[target.key]["alive"] is True


def test_a_host_that_dies_fails_the_calls_in_flight_and_the_next_call_starts_another(endpoint, upstream):  # noqa: F811
    target = endpoint("stdio")
    mcp_call_tool(target, "whoami", {}, timeout_s=20)
    first_host = mcp_client._host_state.child.pid
    failures: list[BaseException] = []

    def in_flight() -> None:
        try:
            mcp_call_tool(target, "slow", {"steps": 400, "delay": 0.05, "tag": "host-dies"}, timeout_s=60)
        except BaseException as exc:
            failures.append(exc)

    caller = threading.Thread(target=in_flight)
    caller.start()
    poll(lambda: upstream.calls("slow"), message="the slow call to reach the server")
    os.kill(first_host, signal.SIGKILL)
    caller.join(timeout=20)
    assert not caller.is_alive()
    assert len(failures) == 1 and isinstance(failures[0], UpstreamUnavailable)
    assert str(failures[0]) == "the MCP client process stopped during the request"

    again = mcp_call_tool(target, "echo", {"after": "restart"}, timeout_s=20)
    assert again["structured"] == {"after": "restart"}
    assert mcp_client._host_state.child.pid != first_host


def test_the_host_takes_the_parents_settings_with_each_request(endpoint, settings):  # noqa: F811
    target = endpoint("streamable_http")
    assert mcp_call_tool(target, "echo", {"n": 1}, timeout_s=20)["structured"] == {"n": 1}
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = []  # closed again, in this process only
    mcp_client.mcp_sessions_close()  # the next call connects anew, under the new setting
    with pytest.raises(UpstreamUnavailable, match="127.0.0.1 is a loopback address"):
        mcp_call_tool(target, "echo", {"n": 2}, timeout_s=20)


def test_the_hosts_log_records_are_handled_here(endpoint, settings, caplog):  # noqa: F811
    target = endpoint("streamable_http")
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = []
    with caplog.at_level(logging.INFO), pytest.raises(UpstreamUnavailable):
        mcp_call_tool(target, "echo", {}, timeout_s=20)
    refusals = [r for r in caplog.records if r.name == "toolkeeper.outbound"]
    assert refusals and "127.0.0.1" in refusals[0].getMessage()
    assert refusals[0].process == mcp_client._host_state.child.pid  # written there, handled here


def test_the_host_ends_with_its_parent_and_stops_its_stdio_servers(endpoint):  # noqa: F811
    target = endpoint("stdio")
    server_pid = mcp_call_tool(target, "whoami", {}, timeout_s=20)["structured"]["pid"]
    host = mcp_client._host_state
    # What the parent's exit does to the host's socket (a close here would wait for the reading thread).
    socket.socket(fileno=os.dup(host.child.conn.fileno())).shutdown(socket.SHUT_RDWR)
    assert host.child.process.wait(timeout=20) == 0
    poll(lambda: not process_alive(server_pid), message="the stdio server to be stopped with its host")


def test_with_the_host_process_off_the_sessions_live_in_this_process(endpoint, settings):  # noqa: F811
    settings.TOOLKEEPER_MCP_CLIENT_PROCESS = False
    target = endpoint("stdio")
    result = mcp_call_tool(target, "whoami", {}, timeout_s=20)
    assert parent_of(result["structured"]["pid"]) == os.getpid()
    assert mcp_sessions()[target.key]["alive"] is True
