"""Helpers of the MCP tests: the real test servers (tests.mcp.servers) in subprocesses, what they recorded,
and catalog rows for their tools (made here the way a sync makes them; tools.upstream.servers does it in
production)."""
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.tools.support import poll
from tools.models import McpServer, Tool, ToolGroup, ToolSource
from tools.upstream.client import endpoint_of, mcp_list_tools

REPO = Path(__file__).resolve().parents[2]
STDIO_NAME = "testkit"
TENANT_ENV = ["MCP_TEST_STATE", "MCP_TEST_PAGE_SIZE", "MCP_TEST_SHOUT", "MCP_TEST_TOKEN", "MCP_TEST_PROMPT_FILE"]
CANCEL_SEEN_WITHIN_S = 30.0


def stdio_allow_list(**env) -> dict:
    """`TOOLKEEPER_MCP_STDIO_SERVERS` with the test server under STDIO_NAME."""
    return {STDIO_NAME: {"command": sys.executable, "args": ["-m", "tests.mcp.servers", "stdio"],
                         "env": {"PYTHONPATH": str(REPO), **env}, "tenant_env": TENANT_ENV}}


class UpstreamLog:
    """What a test server recorded (MCP_TEST_STATE): one JSON object a line."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def events(self, event: str | None = None, **match) -> list[dict]:
        if not self.path.exists():
            return []
        lines = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        return [e for e in lines if (event is None or e["event"] == event)
                and all(e.get(k) == v for k, v in match.items())]

    def calls(self, name: str | None = None) -> list[dict]:
        return [e for e in self.events("call") if name is None or e["name"] == name]

    def wait_cancelled(self, tag: str) -> dict:
        # The cancel crosses a process or two (a Celery worker's MCP host, a stdio server it starts): on a
        # loaded machine that took over the usual 10 s bound, so the bound is wider here.
        return poll(lambda: self.events("cancelled", tag=tag), timeout=CANCEL_SEEN_WITHIN_S,
                    message=f"the server to see {tag} cancelled")[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class HttpServer:
    """The test server over streamable HTTP (/mcp) and SSE (/sse), in a subprocess on 127.0.0.1."""

    def __init__(self, state: Path, port: int | None = None):
        self.port = port or free_port()
        self.log = UpstreamLog(state)
        self.process: subprocess.Popen | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, transport: str = "streamable_http") -> str:
        return f"{self.base}/sse" if transport == "sse" else f"{self.base}/mcp"

    def start(self) -> "HttpServer":
        env = {**os.environ, "PYTHONPATH": str(REPO), "MCP_TEST_STATE": str(self.log.path)}
        self.process = subprocess.Popen([sys.executable, "-m", "tests.mcp.servers", "http", str(self.port)],
                                        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)

        def listening() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"the test MCP server exited ({self.process.returncode})")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return True
            except OSError:
                return False

        poll(listening, timeout=30, interval=0.05, message="the test MCP server to listen")
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self.process = None


def process_alive(pid: int) -> bool:
    """Whether a process runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def catalog_name(server: str, upstream: str) -> str:
    """A catalog name for a test tool (tools.upstream.servers.mcp_tool_name does this in production)."""
    name = f"mcp__{server}__{re.sub(r'[^a-zA-Z0-9_-]', '_', upstream)}"
    if len(name) > 64:
        name = name[:55] + "_" + hashlib.sha256(upstream.encode()).hexdigest()[:8]
    return name


def mcp_server(tenant, *, name: str = "local", transport: str = "stdio", url: str = "", headers=None,
               env=None, timeout_s: float = 10, trusted: bool = True, enabled: bool = True) -> McpServer:
    return McpServer.objects.create(
        tenant=tenant, name=name, transport=transport, url=url, headers=headers,
        command=STDIO_NAME if transport == "stdio" else "", env=env, timeout_s=timeout_s, trusted=trusted,
        enabled=enabled,
    )


def install_mcp_tools(server: McpServer, *, group: str = "basic", timeout_s: float | None = None) -> dict:
    """Catalog rows for every tool the server lists, in `group`: upstream name → Tool."""
    rows = {}
    target = ToolGroup.objects.for_tenant(server.tenant).get(name=group)
    for upstream in mcp_list_tools(endpoint_of(server)):
        hints = upstream.annotations if server.trusted else {}
        tool = Tool.objects.create(
            tenant=server.tenant, name=catalog_name(server.name, upstream.name), description=upstream.description,
            input_schema=upstream.input_schema, output_schema=upstream.output_schema, source=ToolSource.MCP,
            source_ref=upstream.name, mcp_server=server, trusted=server.trusted,
            read_only=bool(hints.get("readOnlyHint")), destructive=bool(hints.get("destructiveHint", False)),
            idempotent=bool(hints.get("idempotentHint")), timeout_s=timeout_s or server.timeout_s,
        )
        target.tools.add(tool)
        rows[upstream.name] = tool
    return rows
