"""The official MCP conformance suite (npm @modelcontextprotocol/conformance) against `/mcp/` on a live server:
every server scenario passes, except those of features we do not offer, listed with their reasons in
tests/mcp/conformance/baseline.yml.

The suite's fixture tools are test-only Python tools (tests/mcp/conformance/conformance_tools.py). The CLI sends
no headers, so the server runs behind a test-only ASGI wrapper (tests/mcp/conformance/asgi.py) that presents the
demo agent key and an agent on /mcp requests; Host and Origin are checked by the product as always.

All of the suite's server scenarios run (`--suite all`): the CLI's default "active" suite of 0.1.12 leaves out
the two it calls pending, json-schema-2020-12 (which passes) and server-sse-polling (in the baseline).

The verdict is the CLI's exit status with the baseline, checked again against the checks it saved for each
scenario (a warning fails a scenario as much as a failure does; the CLI's "Total: N passed, M failed" line
counts failures only, and is never taken for the verdict).
"""
import http.client
import json
import re
import subprocess
from pathlib import Path

import anyio
import httpx2
import pytest
import yaml
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from tests.live.server import LiveServer
from tests.mcp.conformance.node import HERE, require_node

pytestmark = [pytest.mark.live, pytest.mark.xdist_group("mcp-conformance")]  # one server for the module

BASELINE = HERE / "baseline.yml"
CLI = ["npx", "--no-install", "conformance"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
BAD = ("FAILURE", "WARNING")  # what makes a scenario fail the baseline check


@pytest.fixture(scope="module")
def server():
    require_node()
    # SSE polling on (docs/mcp.md, "Streams"): the server ends a call's stream after 1 s (server-sse-polling)
    with LiveServer(settings_module="tests.mcp.conformance.settings", extra_env={"TOOLKEEPER_MCP_POLL_AFTER_S": "1"},
                    asgi_app="tests.mcp.conformance.asgi:application") as live:
        yield live
        print(f"--- {live.url} server log (tail) ---\n{live.log_tail(20000)}")


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=HERE, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def baseline() -> list[str]:
    return [str(name) for name in yaml.safe_load(BASELINE.read_text())["server"]]


def server_scenarios() -> list[str]:
    listed = cli("list", "--server", timeout=60)
    assert listed.returncode == 0, listed.stderr
    return re.findall(r"^\s+- (\S+)$", listed.stdout, flags=re.MULTILINE)


def saved_checks(output_dir: Path) -> dict[str, list[dict]]:
    """The checks the CLI saved per scenario (`<dir>/server-<scenario>-<timestamp>/checks.json`)."""
    found = {}
    for path in output_dir.glob("server-*/checks.json"):
        scenario = re.fullmatch(r"server-(.+)-\d{4}-\d\d-\d\dT[\d-]+Z", path.parent.name).group(1)
        found[scenario] = json.loads(path.read_text())
    return found


def readable(output: str) -> str:
    """The CLI's output without colours, its tallies reworded so that no reader takes them for pytest's."""
    text = ANSI.sub("", output)
    text = re.sub(r"^Total: (\d+) passed, (\d+) failed$", r"conformance checks in all: \1 succeeded, \2 with FAILURE",
                  text, flags=re.MULTILINE)
    return re.sub(r"^([✓✗] \S+): (\d+) passed, (\d+) failed$", r"\1: \2 succeeded, \3 with FAILURE", text,
                  flags=re.MULTILINE)


def report(checks: dict[str, list[dict]], unexpected: list[str], stale: list[str], run) -> str:
    """The useful part of a failed run: the checks that failed outside the baseline, what the CLI said about the
    baseline, and its errors."""
    lines = []
    for scenario in unexpected:
        lines.append(f"{scenario}: fails, and is not in the baseline")
        for check in checks.get(scenario, []):
            if check["status"] in BAD:
                why = check.get("errorMessage") or check["description"]
                lines.append(f"    {check['status']} {check['id']}: {why}")
    lines += [f"{scenario}: passes, but is in the baseline (remove it)" for scenario in stale]
    out = readable(run.stdout)
    tally = re.search(r"^conformance checks in all: .*$", out, flags=re.MULTILINE)
    verdict = out[tally.end():] if tally else out[-6000:]  # the baseline check follows the tally
    return "\n".join([*lines, "", f"--- the CLI exited with {run.returncode}; its baseline check ---", verdict.strip(),
                      "--- the CLI's errors (tail) ---", readable(run.stderr)[-4000:].strip()])


def test_every_server_scenario_passes_except_the_baseline(server, tmp_path):
    expected_failures = baseline()
    scenarios = server_scenarios()
    assert set(expected_failures) <= set(scenarios), "the baseline names scenarios the suite does not have"

    run = cli("server", "--url", f"{server.url}/mcp/", "--suite", "all", "--expected-failures", str(BASELINE),
              "--output-dir", str(tmp_path))
    checks = saved_checks(tmp_path)
    failing = {scenario for scenario, found in checks.items()
               if not found or any(check["status"] in BAD for check in found)}
    failing |= set(scenarios) - set(checks)  # a scenario that could not run saved nothing
    unexpected = sorted(failing - set(expected_failures))
    stale = sorted(set(expected_failures) - failing)
    if run.returncode != 0 or unexpected or stale:
        pytest.fail(report(checks, unexpected, stale, run), pytrace=False)
    assert sorted(checks) == sorted(scenarios)  # every server scenario of the suite ran
    assert "Baseline check passed" in readable(run.stdout)


def test_the_baseline_gives_a_reason_for_each_entry():
    entries = [line for line in BASELINE.read_text().splitlines() if line.lstrip().startswith("- ")]
    assert len(entries) == len(baseline()) > 0
    for entry in entries:
        name, _, reason = entry.partition("#")
        assert reason.strip(), f"{name.strip()} needs a reason (the feature we do not offer)"


def post_initialize(server, host: str, origin: str | None = None) -> int:
    """The status of an `initialize` sent to 127.0.0.1 naming `host` (the wrapper presents the key)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "hosts", "version": "1"}}})
    headers = {"Host": host, "Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if origin is not None:
        headers["Origin"] = origin
    try:
        conn.request("POST", "/mcp/", body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost", "[::1]"])
def test_the_local_names_are_served_and_a_rebound_name_is_refused(server, name):
    """What the dns-rebinding-protection scenario checks, for each local name (the scenario uses the URL's)."""
    local = f"{name}:{server.port}"
    assert post_initialize(server, local, f"http://{local}") == 200
    assert post_initialize(server, local) == 200
    assert post_initialize(server, "evil.example.com", "http://evil.example.com") == 403
    assert post_initialize(server, local, "http://evil.example.com") == 403


def reconnection_calls(server) -> int:
    return int(server.manage("shell", "-c", "from tools.models import ToolCall; "
                             "print(ToolCall.all_tenants.filter(tool_name='test_reconnection').count())"
                             ).strip().splitlines()[-1])


def test_the_sdk_client_comes_back_for_the_result_of_a_stream_the_server_ended(server):
    """SSE polling (docs/mcp.md, "Streams"): the call runs past TOOLKEEPER_MCP_POLL_AFTER_S, the server ends its
    stream, and the Python SDK client resumes it with Last-Event-ID, receiving the progress and the result of the
    one call."""
    resumptions: list[str] = []
    progress: list[str] = []

    async def noted(request):
        if request.method == "GET" and "last-event-id" in request.headers:
            resumptions.append(request.headers["last-event-id"])

    async def heard(value, total, message):
        progress.append(message)

    async def main():
        http_client = httpx2.AsyncClient(timeout=30, event_hooks={"request": [noted]})  # the wrapper adds the key
        transport = streamable_http_client(f"{server.url}/mcp/", http_client=http_client)
        async with Client(transport, mode="legacy") as client:
            return await client.call_tool("test_reconnection", {}, progress_callback=heard)

    before = reconnection_calls(server)
    result = anyio.run(main)
    assert result.is_error is False and result.content[0].text == "Reconnection test completed"
    assert resumptions and all(value.startswith("tk1.") for value in resumptions)
    assert progress == ["started"]
    assert reconnection_calls(server) == before + 1
