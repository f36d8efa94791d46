"""Real MCP servers for the tests (tests.mcp.servers): stdio ones started by the client itself from the
allow-list these fixtures set, and an HTTP one (streamable HTTP and SSE) in a subprocess on 127.0.0.1."""
import pytest

from tests.mcp.support import HttpServer, UpstreamLog, stdio_allow_list
from tools.upstream.client import mcp_sessions_close


@pytest.fixture
def upstream(tmp_path) -> UpstreamLog:
    """Where this test's stdio servers record what they saw (pass `env={"MCP_TEST_STATE": str(upstream.path)}`)."""
    return UpstreamLog(tmp_path / "upstream.jsonl")


@pytest.fixture
def stdio_servers(settings):
    """The admin's allow-list of stdio servers: the test server as `testkit`."""
    settings.TOOLKEEPER_MCP_STDIO_SERVERS = stdio_allow_list()
    return settings.TOOLKEEPER_MCP_STDIO_SERVERS


@pytest.fixture
def loopback_allowed(settings):
    """The admin opens 127.0.0.1 to outbound requests (the HTTP test server listens there)."""
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1"]


@pytest.fixture(scope="session")
def http_server(tmp_path_factory):
    """One HTTP test server for the session; tests tell their requests apart by their own values."""
    server = HttpServer(tmp_path_factory.mktemp("mcp-http") / "upstream.jsonl").start()
    yield server
    server.stop()


@pytest.fixture
def own_http_server(tmp_path):
    """An HTTP test server of this test's own (one it may stop and start again)."""
    server = HttpServer(tmp_path / "http-upstream.jsonl").start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _close_mcp_sessions():
    """Each test starts without pooled sessions and leaves none (no stdio server outlives its test)."""
    yield
    mcp_sessions_close()
