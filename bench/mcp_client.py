#!/usr/bin/env python
"""The MCP client alone: what one proxied call costs the calling process and its MCP host process, without the
governed call around it (docs/performance.md, "The proxy: profile and cuts").

Starts the echo server of bench/mcp_proxy.py and calls its `echo` with `tools.upstream.client.mcp_call_tool` from
16 threads of this process (as the executor's threads do, with progress and log relays), the sessions held in the
host process. Over each round it reads, from /proc (user + system), this process's CPU and the host's, divided
by the calls. Prints each round and the medians; `--json PATH` writes them.

    .venv/bin/python bench/mcp_client.py [--rounds 3] [--calls 150] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path[:0] = [str(ROOT), str(ROOT / "platform"), str(BENCH_DIR)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolkeeper.settings")
os.environ["TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS"] = "127.0.0.1"
os.environ["TOOLKEEPER_MCP_CLIENT_PROCESS"] = "1"

import django  # noqa: E402

django.setup()

from bench_http import cpu_seconds  # noqa: E402
from mcp_proxy import ARGUMENTS, EchoServer  # noqa: E402

from tools.models import McpServer  # noqa: E402
from tools.upstream import client as mcp_client  # noqa: E402


def one_call(server: McpServer) -> None:
    result = mcp_client.mcp_call_tool(mcp_client.endpoint_of(server), "echo", ARGUMENTS, timeout_s=30,
                                      on_progress=lambda *_: None, on_log=lambda *_: None)
    if result["content"][0]["text"] != ARGUMENTS["text"]:
        raise RuntimeError(f"unexpected result: {result}")


def run_round(server: McpServer, threads: int, calls: int) -> dict:
    host = mcp_client._host_state.child.pid
    own, hosted = cpu_seconds([os.getpid()]), cpu_seconds([host])
    start = time.perf_counter()
    workers = [threading.Thread(target=lambda: [one_call(server) for _ in range(calls)]) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - start
    total = threads * calls
    return {"caller_ms": (cpu_seconds([os.getpid()]) - own) * 1000 / total,
            "host_ms": (cpu_seconds([host]) - hosted) * 1000 / total, "calls_per_s": total / wall}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=150, help="calls per thread per round")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    with EchoServer() as upstream:
        server = McpServer(id=1, name="bench", transport="streamable_http", url=upstream.url, timeout_s=30,
                           headers={"Authorization": "Bearer bench-only-token"})
        for _ in range(50):  # the host started, the session open
            one_call(server)
        rounds = [run_round(server, args.threads, args.calls) for _ in range(args.rounds)]
        mcp_client.mcp_sessions_close()
    medians = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
    print(f"{'round':>5} {'caller ms/call':>15} {'host ms/call':>13} {'calls/s':>9}")
    for n, r in enumerate([*rounds, medians], 1):
        label = str(n) if n <= len(rounds) else "med"
        print(f"{label:>5} {r['caller_ms']:>15.3f} {r['host_ms']:>13.3f} {r['calls_per_s']:>9.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "median": medians}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
