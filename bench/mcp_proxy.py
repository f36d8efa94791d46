#!/usr/bin/env python
"""What a governed MCP call through Toolkeeper costs next to calling the MCP server directly.

Starts a small MCP server on streamable HTTP (bench/mcp_echo_server.py: one `echo` tool) and Toolkeeper
in the embedded mode (bench settings, the MCP server's host allow-listed for outbound requests). The
tenant registers the server through the API, syncs it, puts `mcp__bench__echo` in an active group and
allows it with a rule. Then, in one run, the same load client (threads, each with its own long-lived
connection) measures:

- direct: the `mcp` SDK client calling `echo` on the MCP server (one client session per thread);
- proxy:  POST /api/v1/sessions/{id}/calls {"name": "mcp__bench__echo", "input": {...}, "wait": 10}
          (the whole pipeline: rules, events, audit, the executor, the pooled upstream session).

Sequentially (p50/p99) and with 16 concurrent clients (calls/s, in rounds that alternate direct and proxy
load, so both meet the machine in the same states). Over each concurrent phase it reads, from /proc (user +
system, not wall time), the CPU of each process and divides it by the phase's calls: daphne (the server
process), the MCP host (daphne's child that holds the pooled upstream sessions) and the upstream server;
a direct phase's upstream figure is the scale. Prints the tables; `--json PATH` writes `direct_p50_ms`,
`proxy_p50_ms`, `direct_calls_per_s`, `proxy_calls_per_s`, `cpu_ms_per_call` and the rest.
Target: proxy_calls_per_s ≥ 0.5 × direct_calls_per_s (docs/performance.md, "The proxy: profile and cuts").

    .venv/bin/python bench/mcp_proxy.py [--quick] [--json PATH] [--concurrency 16]
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import httpx2  # noqa: E402
from mcp.client import Client as McpClient  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from tests.live.server import LiveServer  # noqa: E402

sys.path.insert(0, str(BENCH_DIR))
from bench_http import Client, CpuMeter, new_session, percentile, process_tree, run_together  # noqa: E402

TARGET_SHARE = 0.5
ARGUMENTS = {"text": "hello from the bench"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class EchoServer:
    """The upstream MCP server, in a process of its own."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> EchoServer:
        self.process = subprocess.Popen([sys.executable, str(BENCH_DIR / "mcp_echo_server.py"), str(self.port)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the MCP echo server did not start")

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


class DirectClient:
    """One SDK client session to an MCP server, driven from a thread of the load client. The session is
    entered and left by one owner task (the SDK's rule), and called from the portal's other tasks."""

    def __init__(self, url: str, *, headers: dict | None = None, tool: str = "echo", arguments: dict = ARGUMENTS):
        self.url = url
        self.headers = headers or {}
        self.tool, self.arguments = tool, arguments
        self.portal_cm = anyio.from_thread.start_blocking_portal()
        self.portal = self.portal_cm.__enter__()
        self.owner, _ = self.portal.start_task(self._own)

    async def _own(self, task_status=anyio.TASK_STATUS_IGNORED):
        self.closing = anyio.Event()
        http_client = httpx2.AsyncClient(timeout=30, headers=self.headers)
        async with McpClient(streamable_http_client(self.url, http_client=http_client)) as client:
            self.client = client
            task_status.started()
            await self.closing.wait()

    def timed(self) -> float:
        start = time.perf_counter()
        result = self.portal.call(self.client.call_tool, self.tool, self.arguments)
        elapsed = time.perf_counter() - start
        if result.is_error:
            raise RuntimeError(f"the MCP call failed: {result}")
        return elapsed

    def close(self) -> None:
        self.portal.call(self.closing.set)
        self.owner.result(timeout=10)
        self.portal_cm.__exit__(None, None, None)


class ProxyClient:
    """One keep-alive connection to Toolkeeper and one agent session."""

    def __init__(self, server: LiveServer, n: int):
        self.http = Client(server.port, server.api_key)
        self.path = f"/api/v1/sessions/{new_session(self.http, n)}/calls"
        self.body = {"name": "mcp__bench__echo", "input": ARGUMENTS, "wait": 10}

    def timed(self) -> float:
        return self.http.timed(self.path, self.body, check_proxy)

    def close(self) -> None:
        self.http.close()


def check_proxy(status: int, payload: bytes) -> None:
    if status != 200:
        raise RuntimeError(f"the governed call answered {status}: {payload[:300]!r}")
    call = json.loads(payload)["calls"][0]
    if call["status"] != "succeeded":
        raise RuntimeError(f"the governed call ended {call['status']}: {payload[:400]!r}")


def admin_call(server: LiveServer, method: str, path: str, body: dict | None = None) -> dict:
    http = Client(server.port, server.admin_api_key)
    try:
        http.conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=http.headers)
        response = http.conn.getresponse()
        payload = response.read()
    finally:
        http.close()
    if response.status >= 300:
        raise RuntimeError(f"{method} {path} answered {response.status}: {payload[:400]!r}")
    return json.loads(payload) if payload else {}


def register_upstream(server: LiveServer, url: str) -> None:
    """What an operator does once: register, sync, expose and allow the server's tool."""
    registered = admin_call(server, "POST", "/api/v1/mcp-servers",
                            {"name": "bench", "transport": "streamable_http", "url": url, "timeout_s": 30})
    synced = admin_call(server, "POST", f"/api/v1/mcp-servers/{registered['id']}/sync")
    if synced["sync"]["status"] != "ok":
        raise RuntimeError(f"the sync failed: {synced}")
    admin_call(server, "POST", "/api/v1/groups",
               {"name": "bench-mcp", "default_active": True, "tools": ["mcp__bench__echo"]})
    admin_call(server, "POST", "/api/v1/rules", {"behavior": "allow", "tool_pattern": "mcp__bench__*"})


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def host_processes(server_pid: int) -> list[int]:
    """The MCP host process of the server (tools.upstream.client.host_main) and its children (stdio servers)."""
    return [pid for child in process_tree(server_pid)[1:] if b"host_main" in _cmdline(child)
            for pid in process_tree(child)]


def proxy_components(server_pid: int, upstream_pid: int) -> dict:
    """The processes whose CPU a proxied call is read from, by component (asked again at each reading)."""
    def daphne() -> list[int]:
        host = set(host_processes(server_pid))
        return [pid for pid in process_tree(server_pid) if pid not in host]

    return {"daphne": daphne, "host": lambda: host_processes(server_pid),
            "upstream": lambda: process_tree(upstream_pid)}


def cpu_per_call(rounds: list[dict], kind: str) -> dict[str, float]:
    """A kind's CPU per call by component over all its phases: the CPU used over the calls made."""
    calls = sum(row.get(f"{kind}_calls", 0) for row in rounds)
    if not calls:
        return {}
    names = {name for row in rounds for name in row.get(f"{kind}_cpu_ms", {})}
    return {name: sum(row[f"{kind}_cpu_ms"].get(name, 0.0) * row[f"{kind}_calls"] for row in rounds) / calls
            for name in sorted(names)}


def print_cpu(cpu: dict[str, dict[str, float]], rounds: list[dict]) -> None:
    names = sorted({name for per in cpu.values() for name in per})
    print(f"\nCPU ms per call (/proc, concurrent phases)  {'  '.join(f'{n:>9}' for n in names)}  {'all':>7}")
    for kind, per in cpu.items():
        print(f"{kind + ' (all rounds)':<43} {'  '.join(f'{per.get(n, 0.0):>9.2f}' for n in names)}  "
              f"{sum(per.values()):>7.2f}")
        for r, row in enumerate(rounds, 1):
            one = row.get(f"{kind}_cpu_ms", {})
            print(f"{f'  round {r}':<43} {'  '.join(f'{one.get(n, 0.0):>9.2f}' for n in names)}  "
                  f"{sum(one.values()):>7.2f}")


def summary(samples: list[float], wall_s: float) -> dict:
    return {"n": len(samples), "p50_ms": percentile(samples, 50) * 1000, "p99_ms": percentile(samples, 99) * 1000,
            "calls_per_s": len(samples) / wall_s if wall_s else 0.0}


def run_sequential(direct: DirectClient, proxy: ProxyClient, requests: int, warmup: int) -> dict:
    samples: dict[str, list[float]] = {"direct": [], "proxy": []}
    for i in range(warmup + requests):
        for kind in (("direct", "proxy") if i % 2 == 0 else ("proxy", "direct")):
            elapsed = (direct if kind == "direct" else proxy).timed()
            if i >= warmup:
                samples[kind].append(elapsed)
    return {kind: summary(values, sum(values)) for kind, values in samples.items()}


def run_concurrent(pools: dict[str, list], per_client: int, rounds: int,
                   meter: CpuMeter | None = None) -> tuple[dict, list[dict]]:
    """The kinds of load (direct and proxy here) in `rounds` alternating phases, all of a kind's clients at
    once in each, each client calling `per_client` times a phase. A phase of one kind and the next of the
    other meet the same state of the machine, so a slower or faster stretch of the run shifts both and
    leaves their ratio. Returns each kind's summary over all its phases (calls/s: all its calls over all
    its phases' wall time) and each round's. With a `meter`, each phase's CPU per call by component is in its
    round's row as `{kind}_cpu_ms` (and its calls as `{kind}_calls`)."""
    samples: dict[str, list[float]] = {kind: [] for kind in pools}
    wall = dict.fromkeys(pools, 0.0)
    per_round = []
    for clients in pools.values():  # warm-up
        run_together([client.timed for client in clients], max(1, per_client // 5))
    for r in range(rounds):
        this_round = {}
        for kind in (list(pools) if r % 2 == 0 else list(pools)[::-1]):
            if meter is not None:
                meter.start()
            collected, elapsed = run_together([client.timed for client in pools[kind]], per_client)
            if meter is not None:
                meter.stop()
                this_round[f"{kind}_cpu_ms"] = meter.per_call_ms(len(collected))
                this_round[f"{kind}_calls"] = len(collected)
            samples[kind] += collected
            wall[kind] += elapsed
            this_round[kind] = len(collected) / elapsed
        per_round.append(this_round)
    return {kind: summary(samples[kind], wall[kind]) for kind in pools}, per_round


def print_tables(result: dict, kinds: tuple[str, str]) -> None:
    """The modes' table, then each round's rates of `kinds` (measured, baseline) and the measured share."""
    print(f"\n{'mode':<14} {'path':<7} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'calls/s':>9}")
    for mode, measured in result["modes"].items():
        for kind, s in measured.items():
            print(f"{mode:<14} {kind:<7} {s['n']:>5} {s['p50_ms']:>8.2f} {s['p99_ms']:>8.2f} {s['calls_per_s']:>9.1f}")
    print(f"\nround  {kinds[0] + ' calls/s':>14}  {kinds[1] + ' calls/s':>14}  share")
    for r, row in enumerate(result["rounds"], 1):
        print(f"{r:>5}  {row[kinds[0]]:>14.1f}  {row[kinds[1]]:>14.1f}  {row['share']:>5.2f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few hundred calls, about a minute")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent clients (default 16)")
    args = parser.parse_args(argv)
    # Quick still gives each concurrent phase a few seconds: at 10 calls a client the direct phase lasted under
    # a second, and its rate swung from 171 to 316 calls/s between runs.
    requests, warmup, per_client, rounds = (100, 10, 25, 3) if args.quick else (500, 30, 40, 5)

    with EchoServer() as upstream:
        server = LiveServer(
            settings_module="bench_settings",
            extra_pythonpath=[str(BENCH_DIR)],
            extra_env={"DEBUG": "0", "SECRET_KEY": "bench-only-" + "x" * 40, "LOG_LEVEL": "WARNING",
                       "TOOLKEEPER_SECRETS_KEY": "YmVuY2gtb25seS14eHh4eHh4eHh4eHh4eHh4eHh4eHg=",
                       "TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS": "127.0.0.1"},
            daphne_args=["-v", "0"],
        )
        print("starting the MCP server and daphne (embedded mode)…", flush=True)
        with server:
            register_upstream(server, upstream.url)
            direct, proxy = DirectClient(upstream.url), ProxyClient(server, 0)
            try:
                sequential = run_sequential(direct, proxy, requests, warmup)
            finally:
                direct.close()
                proxy.close()
            pools: dict[str, list] = {"direct": [], "proxy": []}
            try:
                for n in range(args.concurrency):
                    pools["direct"].append(DirectClient(upstream.url))
                    pools["proxy"].append(ProxyClient(server, n + 1))
                meter = CpuMeter(proxy_components(server.process.pid, upstream.process.pid))
                concurrent, per_round = run_concurrent(pools, per_client, rounds, meter)
            finally:
                for client in pools["direct"] + pools["proxy"]:
                    client.close()

    share = concurrent["proxy"]["calls_per_s"] / concurrent["direct"]["calls_per_s"]
    result = {
        "direct_p50_ms": sequential["direct"]["p50_ms"], "proxy_p50_ms": sequential["proxy"]["p50_ms"],
        "direct_p99_ms": sequential["direct"]["p99_ms"], "proxy_p99_ms": sequential["proxy"]["p99_ms"],
        "direct_calls_per_s": concurrent["direct"]["calls_per_s"],
        "proxy_calls_per_s": concurrent["proxy"]["calls_per_s"],
        "proxy_share": share, "target_share": TARGET_SHARE, "concurrency": args.concurrency,
        "modes": {"sequential": sequential, f"concurrent_{args.concurrency}": concurrent}, "quick": args.quick,
        "rounds": [{**r, "share": r["proxy"] / r["direct"]} for r in per_round],
        "cpu_ms_per_call": {kind: cpu_per_call(per_round, kind) for kind in ("direct", "proxy")},
    }
    print_tables(result, ("direct", "proxy"))
    print_cpu(result["cpu_ms_per_call"], per_round)
    verdict = "ok" if share >= TARGET_SHARE else "MISSES TARGET"
    print(f"\nproxy calls/s = {share:.2f} × direct (target ≥ {TARGET_SHARE}: {verdict})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
