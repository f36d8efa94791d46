#!/usr/bin/env python
"""What a governed call through `/mcp/` costs next to the same call through the REST API.

Starts two Toolkeeper servers in the embedded mode (bench settings), one with the lean reader of `/mcp/` (the
default) and one without it (`TOOLKEEPER_MCP_LEAN=0`: every request through the SDK's entry), and an upstream MCP
server (bench/mcp_echo_server.py, as bench/mcp_proxy.py does). In one run it calls two tools, the built-in
`current_time` (`local`) and the upstream's echo (`proxied`, `mcp__bench__echo`), in these ways, each client on a
session of its own:

- rest:  POST /api/v1/sessions/{id}/calls {"name": …, "input": …, "wait": 10} (the lean server);
- mcp:   `tools/call` on /mcp/ as the 2026-era `mcp` SDK client sends it (its headers and `_meta`), by the same
         keep-alive HTTP client as the REST calls, so that the two differ only in the endpoint;
- sdk:   `tools/call` by the `mcp` SDK client itself (its own work in the load process included);
- `…_nolean`: the same on the server without the lean reader.

Sequentially (p50/p99) and with 16 concurrent clients (calls/s, in rounds that rotate the kinds), with the CPU
the serving Toolkeeper process and its children (the MCP host) used per call in the concurrent phases (user +
system from /proc). Targets, for each tool and for both MCP clients: p50 ≤ 1.15 × rest p50 and calls/s ≥ 0.85 ×
rest calls/s at 16 clients. `--json PATH` writes the figures (`mcp_p50_ms`, `rest_p50_ms`, `mcp_calls_per_s`,
`rest_calls_per_s` for the local tool over the wire client, as before, and every kind under `kinds`).

    .venv/bin/python bench/mcp_endpoint.py [--quick] [--json PATH] [--concurrency 16]
"""
from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH_DIR))

from bench_http import Client, cpu_seconds, new_session, process_tree, run_together  # noqa: E402
from mcp_proxy import ARGUMENTS as ECHO_ARGUMENTS  # noqa: E402
from mcp_proxy import DirectClient, EchoServer, register_upstream, summary  # noqa: E402

from tests.live.server import LiveServer  # noqa: E402

P50_TARGET = 1.15  # mcp p50 at most this × rest p50
RATE_TARGET = 0.85  # mcp calls/s at least this × rest calls/s
TOOL, ARGUMENTS = "current_time", {}
TOOLS = {"local": (TOOL, ARGUMENTS), "proxied": ("mcp__bench__echo", ECHO_ARGUMENTS)}


def timed_again(client: Client, path: str, body: dict, check) -> float:
    """A timed POST; a keep-alive connection the server closed while the client sat idle (the many clients are
    made long before the last of them is used) is opened again once, untimed."""
    try:
        return client.timed(path, body, check)
    except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
        client.conn.close()
        client.post(path, body)
        return client.timed(path, body, check)


class RestClient:
    def __init__(self, server: LiveServer, session: str, tool: str = TOOL, arguments: dict = ARGUMENTS):
        self.http = Client(server.port, server.api_key)
        self.path = f"/api/v1/sessions/{session}/calls"
        self.body = {"name": tool, "input": arguments, "wait": 10}

    def timed(self) -> float:
        return timed_again(self.http, self.path, self.body, check_rest)

    def close(self) -> None:
        self.http.close()


def check_rest(status: int, payload: bytes) -> None:
    if status != 200 or json.loads(payload)["calls"][0]["status"] != "succeeded":
        raise RuntimeError(f"the REST call answered {status}: {payload[:300]!r}")


MODERN = "2026-07-28"


class McpWireClient:
    """`tools/call` on /mcp/ as the SDK client of the 2026 era sends it, over one keep-alive connection."""

    def __init__(self, server: LiveServer, session: str, tool: str = TOOL, arguments: dict = ARGUMENTS):
        self.http = Client(server.port, server.api_key)
        self.http.headers.update({
            "Accept": "application/json, text/event-stream", "X-Toolkeeper-Session": session,
            "Mcp-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": tool})
        self.body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": tool, "arguments": arguments, "_meta": {
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {}}}}

    def timed(self) -> float:
        self.body["id"] += 1
        return timed_again(self.http, "/mcp/", self.body, check_mcp)

    def close(self) -> None:
        self.http.close()


def check_mcp(status: int, payload: bytes) -> None:
    result = json.loads(payload).get("result") if status == 200 else None
    if not result or result.get("isError") is not False:
        raise RuntimeError(f"the MCP call answered {status}: {payload[:300]!r}")


class Kind:
    """One way of calling: which server, and how a client of it is made."""

    def __init__(self, name: str, server: LiveServer, make):
        self.name, self.server, self.make = name, server, make

    def client(self, n: int):
        http = Client(self.server.port, self.server.api_key)
        try:
            session = new_session(http, n)
        finally:
            http.close()
        return self.make(self.server, session)


def kinds_of(lean: LiveServer, nolean: LiveServer, *, sdk: bool = True) -> list[Kind]:
    kinds = []
    for label, (tool, arguments) in TOOLS.items():
        def wire(server, session, tool=tool, arguments=arguments):
            return McpWireClient(server, session, tool, arguments)

        def rest(server, session, tool=tool, arguments=arguments):
            return RestClient(server, session, tool, arguments)

        def sdk_client(server, session, tool=tool, arguments=arguments):
            return DirectClient(f"{server.url}/mcp/", tool=tool, arguments=arguments,
                                headers={**server.headers(), "X-Toolkeeper-Session": session})

        kinds += [Kind(f"rest_{label}", lean, rest), Kind(f"mcp_{label}", lean, wire),
                  Kind(f"mcp_{label}_nolean", nolean, wire)]
        if sdk:
            kinds += [Kind(f"sdk_{label}", lean, sdk_client), Kind(f"sdk_{label}_nolean", nolean, sdk_client)]
    return kinds


def run_sequential(clients: dict, requests: int, warmup: int) -> dict:
    samples: dict[str, list[float]] = {kind: [] for kind in clients}
    order = list(clients)
    for i in range(warmup + requests):
        for kind in order[i % len(order):] + order[:i % len(order)]:  # each kind first in turn
            elapsed = clients[kind].timed()
            if i >= warmup:
                samples[kind].append(elapsed)
    return {kind: summary(values, sum(values)) for kind, values in samples.items()}


def run_concurrent(kinds: list[Kind], pools: dict[str, list], per_client: int, rounds: int) -> dict:
    """Each kind's clients all at once, a phase per kind, the kinds rotating from round to round; calls/s over
    all of a kind's phases, and the CPU its server's process tree used per call in each phase."""
    samples: dict[str, list[float]] = {kind.name: [] for kind in kinds}
    wall = dict.fromkeys(samples, 0.0)
    cpu: dict[str, list[float]] = {kind.name: [] for kind in kinds}
    for kind in kinds:  # warm-up
        run_together([client.timed for client in pools[kind.name]], max(1, per_client // 5))
    for r in range(rounds):
        shift = r % len(kinds)
        for kind in kinds[shift:] + kinds[:shift]:
            pids = process_tree(kind.server.process.pid)
            before = cpu_seconds(pids)
            collected, elapsed = run_together([client.timed for client in pools[kind.name]], per_client)
            cpu[kind.name].append((cpu_seconds(pids) - before) * 1000 / len(collected))
            samples[kind.name] += collected
            wall[kind.name] += elapsed
    return {name: {**summary(samples[name], wall[name]), "cpu_ms_per_call": statistics.median(cpu[name]),
                   "cpu_rounds": cpu[name]} for name in samples}


def bench_server(lean: bool) -> LiveServer:
    return LiveServer(settings_module="bench_settings", extra_pythonpath=[str(BENCH_DIR)],
                      extra_env={"DEBUG": "0", "SECRET_KEY": "bench-only-" + "x" * 40, "LOG_LEVEL": "WARNING",
                                 "TOOLKEEPER_SECRETS_KEY": "YmVuY2gtb25seS14eHh4eHh4eHh4eHh4eHh4eHh4eHg=",
                                 "TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS": "127.0.0.1",
                                 "TOOLKEEPER_MCP_LEAN": "1" if lean else "0"},
                      daphne_args=["-v", "0"])


def verdicts(sequential: dict, concurrent: dict) -> list[tuple[str, float, float, bool, bool]]:
    """(kind, p50 ratio, rate share, p50 ok, rate ok) of every MCP kind against the REST calls of its tool."""
    rows = []
    for name in concurrent:
        if name.startswith("rest_"):
            continue
        rest = "rest_" + name.split("_")[1]
        p50 = sequential[name]["p50_ms"] / sequential[rest]["p50_ms"]
        share = concurrent[name]["calls_per_s"] / concurrent[rest]["calls_per_s"]
        rows.append((name, p50, share, p50 <= P50_TARGET, share >= RATE_TARGET))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls, a few minutes")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent clients (default 16)")
    parser.add_argument("--no-sdk", action="store_true", help="leave the SDK client's kinds out")
    args = parser.parse_args(argv)
    requests, warmup, per_client, rounds = (40, 5, 15, 3) if args.quick else (300, 30, 40, 5)

    print("starting the MCP echo server and two daphnes (embedded mode; lean reader on, off)…", flush=True)
    with EchoServer() as upstream, bench_server(True) as lean, bench_server(False) as nolean:
        for server in (lean, nolean):
            register_upstream(server, upstream.url)
        kinds = kinds_of(lean, nolean, sdk=not args.no_sdk)
        clients = {}
        try:
            for n, kind in enumerate(kinds):
                clients[kind.name] = kind.client(1000 + n)
            sequential = run_sequential(clients, requests, warmup)
        finally:
            for client in clients.values():
                client.close()
        pools: dict[str, list] = {kind.name: [] for kind in kinds}
        try:
            for n in range(args.concurrency):
                for k, kind in enumerate(kinds):
                    pools[kind.name].append(kind.client(2000 + n * len(kinds) + k))
            concurrent = run_concurrent(kinds, pools, per_client, rounds)
        finally:
            for pool in pools.values():
                for client in pool:
                    client.close()

    print(f"\n{'kind':<20} {'seq p50 ms':>10} {'seq p99 ms':>10} {'c' + str(args.concurrency) + ' calls/s':>12} "
          f"{'c p50 ms':>9} {'CPU ms/call':>12}")
    for name in concurrent:
        s, c = sequential[name], concurrent[name]
        print(f"{name:<20} {s['p50_ms']:>10.2f} {s['p99_ms']:>10.2f} {c['calls_per_s']:>12.1f} {c['p50_ms']:>9.2f} "
              f"{c['cpu_ms_per_call']:>12.2f}")
    rows = verdicts(sequential, concurrent)
    print(f"\n{'kind':<20} {'p50 × rest':>10} {'calls/s × rest':>15}   (targets ≤ {P50_TARGET}, ≥ {RATE_TARGET})")
    for name, p50, share, p50_ok, share_ok in rows:
        print(f"{name:<20} {p50:>10.2f} {share:>15.2f}   {'ok' if p50_ok else 'MISSES'} / "
              f"{'ok' if share_ok else 'MISSES'}")
    result = {
        "mcp_p50_ms": sequential["mcp_local"]["p50_ms"], "rest_p50_ms": sequential["rest_local"]["p50_ms"],
        "mcp_calls_per_s": concurrent["mcp_local"]["calls_per_s"],
        "rest_calls_per_s": concurrent["rest_local"]["calls_per_s"],
        "concurrency": args.concurrency, "quick": args.quick,
        "kinds": {name: {"sequential": sequential[name], "concurrent": concurrent[name]} for name in concurrent},
        "verdicts": [{"kind": name, "p50_ratio": p50, "rate_share": share, "p50_ok": p50_ok, "rate_ok": share_ok}
                     for name, p50, share, p50_ok, share_ok in rows],
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
