#!/usr/bin/env python
"""What a governed tool call costs over the floor of an authenticated write, on the same server.

Starts daphne in the embedded mode (fresh data dir, migrate, bootstrap) with bench/bench_settings.py:
the product's URLs plus the floor endpoint `POST /api/bench/floor`, a bare DRF view with the product's
API-key authentication that inserts one row. Then measures, in one run and interleaved:

- governed: POST /api/v1/sessions/{id}/calls {"name": "current_time", "input": {}, "wait": 10}
  (the whole pipeline, the local executor, and the wait for the result)
- floor:    POST /api/bench/floor with the same body

sequentially and with 16 concurrent clients (one keep-alive connection and one session each):
p50/p99 latency, their ratios and calls/s. Prints a table and writes JSON (--json PATH).
The top-level JSON keys are those of the 16-client mode; `modes` holds both.

    .venv/bin/python bench/call_overhead.py [--quick] [--json PATH] [--concurrency 16]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT))

from tests.live.server import LiveServer  # noqa: E402

sys.path.insert(0, str(BENCH_DIR))
from bench_http import Client, new_session, percentile, run_together  # noqa: E402
from bench_schema import FLOOR_PATH, create_floor_table  # noqa: E402

GOVERNED_BODY = {"name": "current_time", "input": {}, "wait": 10}
TARGET_RATIO_P50 = 2.0
TARGET_RATIO_P99 = 3.0



def check_floor(status: int, payload: bytes) -> None:
    if status != 201:
        raise RuntimeError(f"floor answered {status}: {payload[:300]!r}")


def check_governed(status: int, payload: bytes) -> None:
    if status != 200:
        raise RuntimeError(f"governed call answered {status}: {payload[:300]!r}")
    call = json.loads(payload)["calls"][0]
    if call["status"] != "succeeded":
        raise RuntimeError(f"governed call ended {call['status']}: {payload[:300]!r}")




def summary(samples: list[float], wall_s: float) -> dict:
    return {
        "n": len(samples),
        "p50_ms": percentile(samples, 50) * 1000,
        "p90_ms": percentile(samples, 90) * 1000,
        "p99_ms": percentile(samples, 99) * 1000,
        "mean_ms": statistics.fmean(samples) * 1000,
        "max_ms": max(samples) * 1000,
        "calls_per_s": len(samples) / wall_s if wall_s else 0.0,
    }


def run_sequential(server: LiveServer, requests: int, warmup: int) -> dict:
    client = Client(server.port, server.api_key)
    session = new_session(client, 0)
    governed_path = f"/api/v1/sessions/{session}/calls"
    samples = {"governed": [], "floor": []}
    wall = {"governed": 0.0, "floor": 0.0}
    try:
        for i in range(warmup + requests):
            # Alternate which goes first, so neither always follows the other.
            order = ("governed", "floor") if i % 2 == 0 else ("floor", "governed")
            for kind in order:
                if kind == "governed":
                    elapsed = client.timed(governed_path, GOVERNED_BODY, check_governed)
                else:
                    elapsed = client.timed(FLOOR_PATH, GOVERNED_BODY, check_floor)
                if i >= warmup:
                    samples[kind].append(elapsed)
                    wall[kind] += elapsed
    finally:
        client.close()
    return {kind: summary(samples[kind], wall[kind]) for kind in samples}


def run_concurrent(server: LiveServer, clients: int, per_client: int, warmup: int, rounds: int = 2) -> dict:
    """`rounds` alternating phases of floor and governed load, each with all clients at once."""
    pool = [Client(server.port, server.api_key) for _ in range(clients)]
    paths = [f"/api/v1/sessions/{new_session(c, n + 1)}/calls" for n, c in enumerate(pool)]
    samples = {"governed": [], "floor": []}
    wall = {"governed": 0.0, "floor": 0.0}

    def phase(kind: str, count: int, record: bool) -> None:
        def caller(n: int):
            path, check = (paths[n], check_governed) if kind == "governed" else (FLOOR_PATH, check_floor)
            return lambda: pool[n].timed(path, GOVERNED_BODY, check)

        collected, elapsed = run_together([caller(n) for n in range(len(pool))], count)
        if record:
            samples[kind] += collected
            wall[kind] += elapsed

    try:
        phase("floor", warmup, record=False)
        phase("governed", warmup, record=False)
        share = max(1, per_client // rounds)
        for r in range(rounds):
            for kind in (("floor", "governed") if r % 2 == 0 else ("governed", "floor")):
                phase(kind, share, record=True)
    finally:
        for client in pool:
            client.close()
    return {kind: summary(samples[kind], wall[kind]) for kind in samples}


def ratios(mode: dict) -> dict:
    governed, floor = mode["governed"], mode["floor"]
    return {
        "ratio_p50": governed["p50_ms"] / floor["p50_ms"],
        "ratio_p99": governed["p99_ms"] / floor["p99_ms"],
    }


def print_table(modes: dict) -> None:
    header = (f"{'mode':<14} {'endpoint':<9} {'n':>6} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8} "
              f"{'calls/s':>9}")
    print(header)
    print("-" * len(header))
    for name, mode in modes.items():
        for kind in ("floor", "governed"):
            s = mode[kind]
            print(f"{name:<14} {kind:<9} {s['n']:>6} {s['p50_ms']:>8.2f} {s['p90_ms']:>8.2f} {s['p99_ms']:>8.2f} "
                  f"{s['max_ms']:>8.2f} {s['calls_per_s']:>9.1f}")
        r = mode["ratios"]
        ok50 = "ok" if r["ratio_p50"] <= TARGET_RATIO_P50 else "MISSES TARGET"
        ok99 = "ok" if r["ratio_p99"] <= TARGET_RATIO_P99 else "MISSES TARGET"
        print(f"{name:<14} ratio     p50 {r['ratio_p50']:.2f} (target <= {TARGET_RATIO_P50}: {ok50}), "
              f"p99 {r['ratio_p99']:.2f} (target <= {TARGET_RATIO_P99}: {ok99})")
        print()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few hundred requests, well under a minute")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent clients (default 16)")
    parser.add_argument("--access-log", action="store_true", help="keep daphne's access log (off by default)")
    parser.add_argument("--settings", default="bench_settings",
                        help="settings module of the server (for experiments; it must route the floor path)")
    parser.add_argument("--pythonpath", action="append", default=[], help="extra import path for --settings")
    args = parser.parse_args(argv)

    if args.quick:
        seq_requests, seq_warmup, per_client, conc_warmup = 150, 20, 16, 3
    else:
        seq_requests, seq_warmup, per_client, conc_warmup = 1000, 50, 100, 5

    server = LiveServer(
        settings_module=args.settings,
        extra_pythonpath=[*args.pythonpath, str(BENCH_DIR)],
        extra_env={"DEBUG": "0", "SECRET_KEY": "bench-only-" + "x" * 40, "LOG_LEVEL": "WARNING",
                   "TOOLKEEPER_SECRETS_KEY": "YmVuY2gtb25seS14eHh4eHh4eHh4eHh4eHh4eHh4eHg="},
        daphne_args=[] if args.access_log else ["-v", "0"],
    )
    print("starting daphne (embedded mode, bench settings)…", flush=True)
    started = time.perf_counter()
    with server:
        create_floor_table(server)
        print(f"server {server.url} ready in {time.perf_counter() - started:.1f} s; measuring…", flush=True)
        sequential = run_sequential(server, seq_requests, seq_warmup)
        sequential["ratios"] = ratios(sequential)
        concurrent = run_concurrent(server, args.concurrency, per_client, conc_warmup)
        concurrent["ratios"] = ratios(concurrent)

    conc_name = f"concurrent_{args.concurrency}"
    modes = {"sequential": sequential, conc_name: concurrent}
    print()
    print_table(modes)

    result = {
        "governed_p50_ms": concurrent["governed"]["p50_ms"],
        "governed_p99_ms": concurrent["governed"]["p99_ms"],
        "floor_p50_ms": concurrent["floor"]["p50_ms"],
        "floor_p99_ms": concurrent["floor"]["p99_ms"],
        "ratio_p50": concurrent["ratios"]["ratio_p50"],
        "ratio_p99": concurrent["ratios"]["ratio_p99"],
        "calls_per_s": concurrent["governed"]["calls_per_s"],
        "top_level_mode": conc_name,
        "targets": {"ratio_p50": TARGET_RATIO_P50, "ratio_p99": TARGET_RATIO_P99},
        "modes": modes,
        "config": {
            "quick": args.quick, "concurrency": args.concurrency, "mode": "embedded (SQLite, in-process layer)",
            "governed_request": GOVERNED_BODY, "access_log": args.access_log, "settings": args.settings,
            "python": platform.python_version(), "machine": platform.machine(),
        },
    }
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
