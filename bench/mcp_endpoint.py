#!/usr/bin/env python
"""What a governed call through `/mcp/` costs next to the same call through the REST API.

Starts Toolkeeper in the embedded mode (bench settings) and, in one run, calls the built-in `current_time`
(allowed by the demo tenant's default) in these ways, each on a session of its own:

- mcp:     `tools/call` on /mcp/, as the 2026-era `mcp` SDK client sends it (its headers and `_meta`), by the
           same keep-alive HTTP client as the REST calls, so that the two differ only in the endpoint;
- rest:    POST /api/v1/sessions/{id}/calls {"name": "current_time", "input": {}, "wait": 10};
- mcp_sdk: `tools/call` by the `mcp` SDK client itself (sequential only, for information: the SDK client's
           own work, about 4 ms a call in the load process, is not the endpoint's).

Sequentially (p50/p99) and with 16 concurrent clients (calls/s, in rounds that alternate mcp and rest).
`--json PATH` writes `mcp_p50_ms`, `rest_p50_ms`, `mcp_calls_per_s`, `rest_calls_per_s`, `mcp_sdk_p50_ms`
and the rest. Targets: mcp_p50_ms ≤ 1.5 × rest_p50_ms and mcp_calls_per_s ≥ 0.6 × rest_calls_per_s.

    .venv/bin/python bench/mcp_endpoint.py [--quick] [--json PATH] [--concurrency 16]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH_DIR))

from bench_http import Client, new_session  # noqa: E402
from mcp_proxy import DirectClient, print_tables, run_concurrent, summary  # noqa: E402

from tests.live.server import LiveServer  # noqa: E402

P50_TARGET = 1.5  # mcp p50 at most this × rest p50
RATE_TARGET = 0.6  # mcp calls/s at least this × rest calls/s
TOOL, ARGUMENTS = "current_time", {}


class RestClient:
    def __init__(self, server: LiveServer, session: str):
        self.http = Client(server.port, server.api_key)
        self.path = f"/api/v1/sessions/{session}/calls"
        self.body = {"name": TOOL, "input": ARGUMENTS, "wait": 10}

    def timed(self) -> float:
        return self.http.timed(self.path, self.body, check_rest)

    def close(self) -> None:
        self.http.close()


def check_rest(status: int, payload: bytes) -> None:
    if status != 200 or json.loads(payload)["calls"][0]["status"] != "succeeded":
        raise RuntimeError(f"the REST call answered {status}: {payload[:300]!r}")


MODERN = "2026-07-28"


class McpWireClient:
    """`tools/call` on /mcp/ as the SDK client of the 2026 era sends it, over one keep-alive connection."""

    def __init__(self, server: LiveServer, session: str):
        self.http = Client(server.port, server.api_key)
        self.http.headers.update({
            "Accept": "application/json, text/event-stream", "X-Toolkeeper-Session": session,
            "Mcp-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": TOOL})
        self.body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": TOOL, "arguments": ARGUMENTS, "_meta": {
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {}}}}

    def timed(self) -> float:
        self.body["id"] += 1
        return self.http.timed("/mcp/", self.body, check_mcp)

    def close(self) -> None:
        self.http.close()


def check_mcp(status: int, payload: bytes) -> None:
    result = json.loads(payload).get("result") if status == 200 else None
    if not result or result.get("isError") is not False:
        raise RuntimeError(f"the MCP call answered {status}: {payload[:300]!r}")


def clients(server: LiveServer, n: int, *, sdk: bool = False) -> dict[str, object]:
    """An MCP and a REST client (and an SDK client with `sdk`), each on a session of its own."""
    http = Client(server.port, server.api_key)
    try:
        sessions = [new_session(http, 1000 + 3 * n + i) for i in range(3 if sdk else 2)]
    finally:
        http.close()
    pair = {"mcp": McpWireClient(server, sessions[0]), "rest": RestClient(server, sessions[1])}
    if sdk:
        pair["mcp_sdk"] = DirectClient(f"{server.url}/mcp/", tool=TOOL, arguments=ARGUMENTS, headers={
            **server.headers(), "X-Toolkeeper-Session": sessions[2]})
    return pair


def run_sequential(kinds: dict, requests: int, warmup: int) -> dict:
    samples: dict[str, list[float]] = {kind: [] for kind in kinds}
    order = list(kinds)
    for i in range(warmup + requests):
        for kind in order[i % len(order):] + order[:i % len(order)]:  # each kind first in turn
            elapsed = kinds[kind].timed()
            if i >= warmup:
                samples[kind].append(elapsed)
    return {kind: summary(values, sum(values)) for kind, values in samples.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few hundred calls, about a minute")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent clients (default 16)")
    args = parser.parse_args(argv)
    requests, warmup, per_client, rounds = (100, 10, 25, 3) if args.quick else (500, 30, 40, 5)

    server = LiveServer(settings_module="bench_settings", extra_pythonpath=[str(BENCH_DIR)],
                        extra_env={"DEBUG": "0", "SECRET_KEY": "bench-only-" + "x" * 40, "LOG_LEVEL": "WARNING",
                                   "TOOLKEEPER_SECRETS_KEY": "YmVuY2gtb25seS14eHh4eHh4eHh4eHh4eHh4eHh4eHg="},
                        daphne_args=["-v", "0"])
    print("starting daphne (embedded mode)…", flush=True)
    with server:
        pair = clients(server, 0, sdk=True)
        try:
            sequential = run_sequential(pair, requests, warmup)
        finally:
            for client in pair.values():
                client.close()
        pools: dict[str, list] = {"mcp": [], "rest": []}
        try:
            for n in range(args.concurrency):
                for kind, client in clients(server, n + 1).items():
                    pools[kind].append(client)
            concurrent, per_round = run_concurrent(pools, per_client, rounds)
        finally:
            for client in pools["mcp"] + pools["rest"]:
                client.close()

    p50_ratio = sequential["mcp"]["p50_ms"] / sequential["rest"]["p50_ms"]
    rate_share = concurrent["mcp"]["calls_per_s"] / concurrent["rest"]["calls_per_s"]
    result = {
        "mcp_p50_ms": sequential["mcp"]["p50_ms"], "rest_p50_ms": sequential["rest"]["p50_ms"],
        "mcp_p99_ms": sequential["mcp"]["p99_ms"], "rest_p99_ms": sequential["rest"]["p99_ms"],
        "mcp_sdk_p50_ms": sequential["mcp_sdk"]["p50_ms"], "mcp_sdk_p99_ms": sequential["mcp_sdk"]["p99_ms"],
        "mcp_calls_per_s": concurrent["mcp"]["calls_per_s"], "rest_calls_per_s": concurrent["rest"]["calls_per_s"],
        "p50_ratio": p50_ratio, "rate_share": rate_share, "concurrency": args.concurrency, "quick": args.quick,
        "modes": {"sequential": sequential, f"concurrent_{args.concurrency}": concurrent},
        "rounds": [{**r, "share": r["mcp"] / r["rest"]} for r in per_round],
    }
    print_tables(result, ("mcp", "rest"))
    p50_verdict = "ok" if p50_ratio <= P50_TARGET else "MISSES TARGET"
    rate_verdict = "ok" if rate_share >= RATE_TARGET else "MISSES TARGET"
    print(f"\nmcp p50 = {p50_ratio:.2f} × rest (target ≤ {P50_TARGET}: {p50_verdict})")
    print(f"mcp calls/s = {rate_share:.2f} × rest (target ≥ {RATE_TARGET}: {rate_verdict})")
    print(f"(the SDK client's p50 = {result['mcp_sdk_p50_ms'] / result['rest_p50_ms']:.2f} × rest, its own work "
          "included)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
