"""The pooled MCP client against real servers over stdio, streamable HTTP and SSE: listing, calls, progress,
timeouts and cancels that reach the server, a dead server replaced, errors in plain words, the outbound
guard, the stdio allow-list, and credentials that go upstream and nowhere else."""
import itertools
import logging
import os
import signal
import socket
import threading
import uuid

import pytest

from tests.mcp.servers import LONG_NAME
from tests.mcp.support import STDIO_NAME, process_alive
from tests.tools.support import poll
from tools.models import McpServer
from tools.python.isolation import CallStop
from tools.upstream.client import (
    McpEndpoint,
    UpstreamCancelled,
    UpstreamRefused,
    UpstreamTimedOut,
    UpstreamToolError,
    UpstreamUnavailable,
    endpoint_of,
    endpoint_server_id,
    mcp_call_tool,
    mcp_list_tools,
    mcp_on_tools_changed,
    mcp_probe,
    mcp_sessions,
)

TRANSPORTS = ["stdio", "streamable_http", "sse"]
HTTP_TRANSPORTS = ["streamable_http", "sse"]
_server_ids = itertools.count(900_001)


def unsaved_server(**fields) -> McpServer:
    """An McpServer as a tenant saved it (not written: `endpoint_of` reads only its fields)."""
    fields.setdefault("id", next(_server_ids))
    fields.setdefault("name", "local")
    fields.setdefault("timeout_s", 20)
    return McpServer(**fields)


@pytest.fixture
def endpoint(request, stdio_servers, loopback_allowed, upstream, http_server):
    """`endpoint(transport, **server fields)`: an endpoint of the test server over that transport."""

    def make(transport: str, **fields) -> McpEndpoint:
        if transport == "stdio":
            env = {"MCP_TEST_STATE": str(upstream.path), **fields.pop("env", {})}
            return endpoint_of(unsaved_server(transport="stdio", command=STDIO_NAME, env=env, **fields))
        return endpoint_of(unsaved_server(transport=transport, url=http_server.url(transport), **fields))

    return make


def log_of(transport, upstream, http_server):
    return upstream if transport == "stdio" else http_server.log


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_listing_gives_every_tool_with_its_schemas_and_annotations(endpoint, transport):
    tools = {tool.name: tool for tool in mcp_list_tools(endpoint(transport))}

    assert {"echo", "slow", "fail", "image", "lookup", LONG_NAME} <= set(tools)
    lookup = tools["lookup"]
    assert lookup.description == "Looks a key up."
    assert lookup.input_schema == {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
    assert lookup.output_schema["properties"]["value"] == {"type": "string"}
    assert lookup.annotations == {"readOnlyHint": True, "idempotentHint": True, "destructiveHint": False}
    assert tools["echo"].annotations == {}


def test_listing_follows_the_pages(endpoint):
    whole = [tool.name for tool in mcp_list_tools(endpoint("stdio"))]
    paged = [tool.name for tool in mcp_list_tools(endpoint("stdio", env={"MCP_TEST_PAGE_SIZE": "3"}))]
    assert len(whole) > 6
    assert paged == whole


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_call_returns_the_content_blocks_and_the_structured_content(endpoint, transport):
    arguments = {"city": "Lyon", "n": 3, "nested": {"ok": True}}
    result = mcp_call_tool(endpoint(transport), "echo", arguments, timeout_s=20)
    assert result["state"] == "success"
    assert result["structured"] == arguments
    assert result["content"] == [{"type": "text", "text": '{"city": "Lyon", "n": 3, "nested": {"ok": true}}'}]


def test_image_and_resource_blocks_are_kept_as_the_server_sent_them(endpoint):
    stdio = endpoint("stdio")
    image = mcp_call_tool(stdio, "image", {}, timeout_s=20)
    assert image["content"][0]["type"] == "image" and image["content"][0]["mimeType"] == "image/png"
    assert image["content"][0]["data"].startswith("iVBOR")
    assert image["content"][1] == {"type": "text", "text": "a pixel"}
    assert image["structured"] is None
    resource = mcp_call_tool(stdio, "resource", {}, timeout_s=20)
    assert resource["content"] == [{"type": "resource", "resource": {
        "uri": "file:///notes.txt", "mimeType": "text/plain", "text": "the notes"}}]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_progress_reaches_the_caller_in_order_in_its_own_thread(endpoint, transport):
    seen, threads = [], set()

    def on_progress(progress, total, message):
        seen.append((progress, total, message))
        threads.add(threading.get_ident())

    result = mcp_call_tool(endpoint(transport), "slow", {"steps": 6, "delay": 0.01}, timeout_s=20,
                           on_progress=on_progress)
    assert result["structured"] == {"steps": 6}
    assert seen == [(float(i), 6.0, f"step {i} of 6") for i in range(1, 7)]
    assert threads == {threading.get_ident()}  # the caller may write to the database from there


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_timeout_stops_the_call_upstream_and_the_session_stays_usable(endpoint, transport, upstream, http_server):
    tag = f"timeout-{uuid.uuid4().hex[:8]}"
    target = endpoint(transport)
    mcp_list_tools(target)  # the session is open: the timeout is the call's
    with pytest.raises(UpstreamTimedOut, match=r"did not answer within 0\.5 s"):
        mcp_call_tool(target, "slow", {"steps": 200, "delay": 0.05, "tag": tag}, timeout_s=0.5)
    log_of(transport, upstream, http_server).wait_cancelled(tag)
    assert mcp_call_tool(target, "echo", {"after": tag}, timeout_s=20)["structured"] == {"after": tag}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_setting_the_cancel_signal_stops_the_call_upstream(endpoint, transport, upstream, http_server):
    tag = f"cancel-{uuid.uuid4().hex[:8]}"
    stop = CallStop()
    progressed = threading.Event()

    def on_progress(progress, total, message):
        if progress >= 2:
            progressed.set()
            threading.Thread(target=stop.set).start()  # as the executor's timer or a cancel request does

    with pytest.raises(UpstreamCancelled):
        mcp_call_tool(endpoint(transport), "slow", {"steps": 200, "delay": 0.05, "tag": tag}, timeout_s=30,
                      on_progress=on_progress, cancelled=stop)
    assert progressed.is_set()
    log_of(transport, upstream, http_server).wait_cancelled(tag)


def test_a_plain_event_cancels_too(endpoint, upstream):
    tag = f"plain-{uuid.uuid4().hex[:8]}"
    stop = threading.Event()
    target = endpoint("stdio")
    mcp_list_tools(target)  # the session is open: the cancel reaches a running call
    threading.Timer(0.5, stop.set).start()
    with pytest.raises(UpstreamCancelled):
        mcp_call_tool(target, "slow", {"steps": 400, "delay": 0.05, "tag": tag}, timeout_s=30,
                      cancelled=stop)
    upstream.wait_cancelled(tag)


def test_an_error_raised_by_on_progress_stops_the_call_and_reaches_the_caller(endpoint, upstream):
    tag = f"refused-{uuid.uuid4().hex[:8]}"

    def on_progress(progress, total, message):
        raise LookupError("the call is gone")

    with pytest.raises(LookupError, match="the call is gone"):
        mcp_call_tool(endpoint("stdio"), "slow", {"steps": 200, "delay": 0.05, "tag": tag}, timeout_s=30,
                      on_progress=on_progress)
    upstream.wait_cancelled(tag)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_is_error_raises_upstream_tool_error_with_the_upstream_text(endpoint, transport):
    with pytest.raises(UpstreamToolError) as raised:
        mcp_call_tool(endpoint(transport), "fail", {"message": "the disk is full"}, timeout_s=20)
    assert str(raised.value) == "the disk is full"
    assert raised.value.content == [{"type": "text", "text": "the disk is full"}]


def test_an_upstream_error_text_is_bounded(endpoint):
    with pytest.raises(UpstreamToolError) as raised:
        mcp_call_tool(endpoint("stdio"), "fail", {"message": "x" * 50_000}, timeout_s=20)
    assert len(str(raised.value)) == 2000


def test_an_unknown_tool_is_refused_by_the_server(endpoint):
    with pytest.raises(UpstreamToolError, match="refused the call: unknown tool nope"):
        mcp_call_tool(endpoint("stdio"), "nope", {}, timeout_s=20)


def test_a_killed_stdio_server_is_started_again_by_the_next_call(endpoint):
    target = endpoint("stdio")
    first = mcp_call_tool(target, "whoami", {}, timeout_s=20)["structured"]["pid"]
    os.kill(first, signal.SIGKILL)
    poll(lambda: not process_alive(first), message="the server process to end")
    poll(lambda: not any(s["alive"] for s in mcp_sessions().values()), message="the session to notice")

    second = mcp_call_tool(target, "whoami", {}, timeout_s=20)["structured"]["pid"]
    assert second != first
    assert mcp_call_tool(target, "echo", {"again": 1}, timeout_s=20)["structured"] == {"again": 1}


def test_a_server_that_dies_during_a_call_fails_it_and_the_next_call_gets_a_new_one(endpoint, tmp_path):
    target = endpoint("stdio")
    first = mcp_call_tool(target, "whoami", {}, timeout_s=20)["structured"]["pid"]
    with pytest.raises(UpstreamUnavailable, match="closed the connection during the request"):
        mcp_call_tool(target, "die_once", {"marker": str(tmp_path / "died")}, timeout_s=20)
    assert (tmp_path / "died").read_text() == str(first)
    result = mcp_call_tool(target, "die_once", {"marker": str(tmp_path / "died")}, timeout_s=20)
    assert result["content"] == [{"type": "text", "text": "survived"}]


@pytest.mark.parametrize("transport", HTTP_TRANSPORTS)
def test_an_http_server_restarted_is_reached_again(loopback_allowed, own_http_server, transport):
    target = endpoint_of(unsaved_server(transport=transport, url=own_http_server.url(transport), timeout_s=5))
    before = mcp_call_tool(target, "whoami", {}, timeout_s=10)["structured"]["pid"]
    own_http_server.stop()
    with pytest.raises(UpstreamUnavailable) as down:
        mcp_call_tool(target, "echo", {}, timeout_s=5)
    assert "could not be reached" in str(down.value) or "closed the connection" in str(down.value)
    own_http_server.start()
    after = mcp_call_tool(target, "whoami", {}, timeout_s=10)["structured"]["pid"]
    assert after != before


def test_a_server_that_cannot_start_is_reported_in_plain_words(settings):
    settings.TOOLKEEPER_MCP_STDIO_SERVERS = {"broken": {"command": "/nonexistent/mcp-server"}}
    target = endpoint_of(unsaved_server(transport="stdio", command="broken", name="tools"))
    with pytest.raises(UpstreamUnavailable, match=r"^MCP server tools could not be started \(its command is missing"):
        mcp_list_tools(target)
    with pytest.raises(UpstreamUnavailable, match="could not be started"):
        mcp_probe(target)


def test_a_server_that_does_not_answer_in_time_is_reported(settings):
    settings.TOOLKEEPER_MCP_STDIO_SERVERS = {"mute": {"command": "sleep", "args": ["60"]}}
    target = endpoint_of(unsaved_server(transport="stdio", command="mute", name="mute", timeout_s=1))
    with pytest.raises(UpstreamTimedOut, match="MCP server mute did not answer within 1 s"):
        mcp_call_tool(target, "echo", {}, timeout_s=1)


def test_the_probe_connects_afresh_and_describes_the_server(endpoint):
    info = mcp_probe(endpoint("stdio"))
    assert info["server_name"] == "toolkeeper-test" and info["server_version"] == "1.2.3"
    assert info["tool_count"] >= 10
    assert mcp_sessions() == {}  # a probe is not pooled


# -- the outbound guard, the allow-list -------------------------------------------------------------

@pytest.mark.parametrize("transport", HTTP_TRANSPORTS)
def test_a_loopback_server_is_refused_without_the_admins_allow_list(http_server, transport):
    token = uuid.uuid4().hex
    target = endpoint_of(unsaved_server(transport=transport, url=http_server.url(transport),
                                        headers={"Authorization": f"Bearer {token}"}))
    for attempt in (lambda: mcp_list_tools(target), lambda: mcp_call_tool(target, "echo", {}, timeout_s=5),
                    lambda: mcp_probe(target)):
        with pytest.raises(UpstreamRefused) as refused:
            attempt()
        assert str(refused.value) == ("MCP server local may not be reached: 127.0.0.1 is a loopback address; "
                                      "only public addresses may be reached")
    assert not [e for e in http_server.log.events() if token in str(e)]


def test_a_name_resolving_to_loopback_is_refused_at_connect_time(http_server, monkeypatch, settings):
    settings.TOOLKEEPER_MCP_CLIENT_PROCESS = False  # the resolver is faked in this process: the client must run here
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host == "tools.example.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    target = endpoint_of(unsaved_server(transport="streamable_http",
                                        url=f"http://tools.example.test:{http_server.port}/mcp"))
    with pytest.raises(UpstreamRefused, match="tools.example.test resolves to a loopback address"):
        mcp_list_tools(target)


def test_a_metadata_address_is_refused(settings):
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = ["169.254.0.0/16"]  # a network does not open metadata
    target = endpoint_of(unsaved_server(transport="streamable_http", url="http://169.254.169.254/mcp"))
    with pytest.raises(UpstreamRefused, match="169.254.169.254 is a cloud metadata address"):
        mcp_call_tool(target, "echo", {}, timeout_s=5)


def test_a_stdio_server_outside_the_allow_list_is_refused(stdio_servers):
    with pytest.raises(UpstreamRefused, match=r"^'bash' is not an allowed stdio server$"):
        endpoint_of(unsaved_server(transport="stdio", command="bash"))
    with pytest.raises(UpstreamRefused, match="is not an allowed stdio server"):
        endpoint_of(unsaved_server(transport="stdio", command="/bin/sh"))


def test_the_tenant_sets_only_the_environment_names_the_allow_list_lets_it(endpoint, caplog):
    target = endpoint("stdio", env={"MCP_TEST_TOKEN": "tenant-value"})
    assert target.command != STDIO_NAME and target.args == ("-m", "tests.mcp.servers", "stdio")
    seen = mcp_call_tool(target, "env", {"names": ["MCP_TEST_TOKEN", "LD_PRELOAD", "PATH"]},
                         timeout_s=20)["structured"]
    assert seen["MCP_TEST_TOKEN"] == "tenant-value"
    assert seen["LD_PRELOAD"] is None and seen["PATH"] == os.environ["PATH"]
    # anything else stored is refused, not dropped: the server does not start without it as if all were well
    for name in ("LD_PRELOAD", "PATH", "NOT_LISTED"):
        with pytest.raises(UpstreamRefused, match=f"cannot be given to {STDIO_NAME}: {name} "):
            endpoint("stdio", env={"MCP_TEST_TOKEN": "tenant-value", name: "/tmp/evil"})
    assert "/tmp/evil" not in caplog.text


# -- credentials ------------------------------------------------------------------------------------

@pytest.mark.parametrize("transport", HTTP_TRANSPORTS)
def test_the_stored_headers_reach_the_server_and_appear_nowhere_else(endpoint, transport, http_server, caplog,
                                                                      settings):
    caplog.set_level(logging.DEBUG)
    token = f"secret-{uuid.uuid4().hex}"
    target = endpoint(transport, headers={"Authorization": f"Bearer {token}", "X-Api-Key": f"k-{token}"})

    marker = uuid.uuid4().hex
    assert mcp_call_tool(target, "echo", {"marker": marker}, timeout_s=20)["structured"] == {"marker": marker}
    seen = [e["authorization"] for e in http_server.log.calls("echo") if e["arguments"] == {"marker": marker}]
    assert seen == [f"Bearer {token}"]
    failures = []
    for name, arguments in (("fail", {"message": "no"}), ("slow", {"steps": 100, "delay": 0.05}), ("nope", {})):
        with pytest.raises(Exception) as raised:  # noqa: B017, PT011 (each kind of failure, checked below)
            mcp_call_tool(target, name, arguments, timeout_s=0.5)
        failures.append(raised.value)
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = []
    with pytest.raises(UpstreamUnavailable) as refused:
        mcp_probe(target)
    failures.append(refused.value)

    assert token not in caplog.text
    assert all(token not in str(failure) and token not in repr(failure) for failure in failures)
    assert token not in repr(target) and token not in target.key


def test_a_stdio_servers_stderr_is_logged_with_its_environment_values_masked(endpoint, caplog):
    caplog.set_level(logging.INFO, logger="toolkeeper.mcp.stderr")
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    mcp_list_tools(endpoint("stdio", env={"MCP_TEST_SHOUT": secret}))
    poll(lambda: "my secret is" in caplog.text, message="the server's stderr in the log")
    assert "local: my secret is [hidden]!" in caplog.text
    assert "local: test MCP server on stdio" in caplog.text
    assert secret not in caplog.text


# -- keys, stale sessions, list_changed -------------------------------------------------------------

def test_the_key_changes_with_what_shapes_the_connection_only(stdio_servers):
    base = {"id": 42, "transport": "streamable_http", "url": "https://mcp.example.com/mcp",
            "headers": {"Authorization": "Bearer one"}, "timeout_s": 30}
    key = endpoint_of(McpServer(**base)).key
    assert key == endpoint_of(McpServer(**base)).key
    assert endpoint_server_id(key) == 42
    assert key == endpoint_of(McpServer(**{**base, "timeout_s": 5, "name": "renamed"})).key
    assert key != endpoint_of(McpServer(**{**base, "headers": {"Authorization": "Bearer two"}})).key
    assert key != endpoint_of(McpServer(**{**base, "url": "https://mcp.example.com/other"})).key
    assert key != endpoint_of(McpServer(**{**base, "transport": "sse"})).key
    assert key.startswith("mcp:42:") and "Bearer" not in key and "one" not in key
    stdio = {"id": 43, "transport": "stdio", "command": STDIO_NAME, "env": {"MCP_TEST_TOKEN": "a"}}
    stdio_key = endpoint_of(McpServer(**stdio)).key
    assert stdio_key != endpoint_of(McpServer(**{**stdio, "env": {"MCP_TEST_TOKEN": "b"}})).key
    stdio_servers[STDIO_NAME]["args"] = ["-m", "something.else"]  # the admin changed the allow-list entry
    assert stdio_key != endpoint_of(McpServer(**stdio)).key


def test_a_changed_server_gets_a_new_session_and_its_old_one_is_closed(endpoint):
    server_id = next(_server_ids)
    old = endpoint("stdio", id=server_id, env={"MCP_TEST_TOKEN": "old"})
    old_pid = mcp_call_tool(old, "whoami", {}, timeout_s=20)["structured"]["pid"]
    new = endpoint("stdio", id=server_id, env={"MCP_TEST_TOKEN": "new"})
    assert old.key != new.key
    assert mcp_call_tool(new, "env", {"names": ["MCP_TEST_TOKEN"]}, timeout_s=20)["structured"] == {
        "MCP_TEST_TOKEN": "new"}
    poll(lambda: not process_alive(old_pid), message="the old server process to be stopped")
    assert list(mcp_sessions()) == [new.key]


@pytest.fixture
def heard():
    """The endpoint keys the registered list_changed callback is called with."""
    keys: list[str] = []
    remove = mcp_on_tools_changed(keys.append)
    yield keys
    remove()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_tools_list_changed_calls_the_registered_callbacks_with_the_key(endpoint, transport, heard):
    target = endpoint(transport)
    mcp_list_tools(target)
    name = f"added_{uuid.uuid4().hex[:8]}"
    mcp_call_tool(target, "add_tool", {"name": name}, timeout_s=20)
    poll(lambda: heard, message="the list_changed callback")
    assert set(heard) == {target.key}
    assert name in [tool.name for tool in mcp_list_tools(target)]


@pytest.mark.parametrize("transport", ["stdio", "streamable_http"])
def test_a_reopened_listen_stream_counts_as_a_change(endpoint, transport, heard):
    # Nothing is replayed across the gap, so whatever changed meanwhile is fetched again.
    target = endpoint(transport)
    mcp_list_tools(target)
    assert heard == []
    mcp_call_tool(target, "end_listens", {}, timeout_s=20)
    poll(lambda: heard, message="the callback after the stream was reopened")
    assert set(heard) == {target.key}


@pytest.mark.parametrize("transport", HTTP_TRANSPORTS)
def test_an_answer_over_the_size_limit_fails_the_call_in_plain_words(endpoint, transport, settings):
    settings.TOOLKEEPER_OUTBOUND_MAX_MESSAGE_BYTES = 200_000
    target = endpoint(transport)
    assert len(mcp_call_tool(target, "big", {"size": 100_000}, timeout_s=20)["content"][0]["text"]) == 100_000
    with pytest.raises(UpstreamUnavailable) as failure:
        mcp_call_tool(target, "big", {"size": 1_000_000}, timeout_s=20)
    assert "too large to take" in str(failure.value) and "200000" in str(failure.value)
    assert mcp_call_tool(target, "echo", {"after": 1}, timeout_s=20)["structured"] == {"after": 1}


@pytest.mark.parametrize("in_this_process", [False, True], ids=["host-process", "here"])
def test_an_sse_stream_the_server_cuts_when_idle_is_reopened_quietly(loopback_allowed, http_server, settings, caplog,
                                                                     in_this_process):
    """An SSE server (or a proxy before it) that cuts a stream after a while without traffic ends the pooled
    session: a line in the log, no traceback, and the next call opens a new session (docs/mcp.md)."""
    settings.TOOLKEEPER_MCP_CLIENT_PROCESS = not in_this_process
    caplog.set_level(logging.INFO)
    tag = uuid.uuid4().hex
    target = endpoint_of(unsaved_server(transport="sse", url=f"{http_server.url('sse')}?idle_close=1&tag={tag}"))
    assert mcp_call_tool(target, "echo", {"first": tag}, timeout_s=20)["structured"] == {"first": tag}
    poll(lambda: http_server.log.events("sse_idle_closed", query=f"idle_close=1&tag={tag}"),
         message="the server to cut the idle stream")
    poll(lambda: not any(s["alive"] for s in mcp_sessions().values()), message="the session to notice")

    assert mcp_call_tool(target, "echo", {"second": tag}, timeout_s=20)["structured"] == {"second": tag}
    assert len(http_server.log.events("sse_connect", query=f"idle_close=1&tag={tag}")) == 2
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info or r.exc_text]
    assert loud == [], [f"{r.name} {r.levelname} {r.getMessage()}" for r in loud]
    ended = [r for r in caplog.records if r.name.startswith("toolkeeper.mcp") and "ended" in r.getMessage()]
    assert len(ended) == 1 and "\n" not in ended[0].getMessage()
