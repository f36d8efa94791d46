#!/usr/bin/env python
"""Both cores in the embedded mode: what more server processes on the embedded database would buy.

Three embedded deployments (SQLite, the local executor, the in-process channel layer: the settings of `make run`),
started side by side:

- one:         one daphne process, as `make run` serves today;
- two:         two daphne processes on one data dir (the second joins the first's database on a port of its own)
               and the clients dealt to them in turn, as a load balancer deals connections; between the two
               processes, a writer that finds the database locked waits in SQLite's busy handler (sleep and retry);
- two_shared:  the same, with the writer queue shared by both processes (bench/bench_shared_writer: after the
               process's own writer lock, an exclusive file lock beside the database, so a waiting writer of
               either process wakes when the lock is let go).

Each round loads each deployment in turn (the order rotating from round to round) with N keep-alive clients (default
16, one session each) posting the governed `current_time` call with `wait` back to back, as bench/throughput.py
does. Per deployment, the medians over the rounds of: calls/s, p50 and p99, the CPU per call of its server
processes and of the load client (this process), and the machine's busy share over the window (from /proc/stat:
1.0 is both cores busy). Every answer is checked to be a succeeded call.

This measures what the option could buy, not a mode of the product: two embedded processes as started here do not
hold the embedded mode's guarantees (docs/performance.md, "Both cores in the embedded mode").

    .venv/bin/python bench/embedded_cores.py [--quick] [--json PATH] [--clients 16] [--rounds N]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH_DIR))

from bench_http import CpuMeter, process_tree  # noqa: E402
from throughput import BENCH_ENV, run_load  # noqa: E402

from tests.live.server import LiveServer  # noqa: E402


def machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all cores so far; waiting for the disk counts as idle."""
    with open("/proc/stat") as handle:
        fields = [int(f) for f in handle.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


class WindowMeter(CpuMeter):
    """The servers' CPU (a CpuMeter), and over the same window the load client's own CPU and the machine's busy
    share."""

    def start(self) -> None:
        self._machine, self._load = machine_ticks(), time.process_time()
        super().start()

    def stop(self) -> dict[str, float]:
        used = super().stop()
        busy, total = machine_ticks()
        self.machine_busy = (busy - self._machine[0]) / max(1, total - self._machine[1]) * os.cpu_count()
        self.used["load client"] = time.process_time() - self._load
        return used


class Deployment:
    """One embedded deployment of one or two server processes on one data dir."""

    def __init__(self, name: str, processes: int, settings_module: str = "toolkeeper.settings"):
        self.name, self.processes = name, processes
        pythonpath = [str(BENCH_DIR)] if settings_module != "toolkeeper.settings" else []
        self.first = LiveServer(settings_module=settings_module, extra_pythonpath=pythonpath, extra_env=BENCH_ENV,
                                daphne_args=["-v", "0"])
        self.servers: list[LiveServer] = []

    def start(self) -> None:
        self.servers = [self.first.start()]
        for _ in range(self.processes - 1):
            self.servers.append(self.first.sibling())

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()

    def meter(self) -> WindowMeter:
        return WindowMeter({f"server {n + 1}": (lambda s=server: process_tree(s.process.pid))
                            for n, server in enumerate(self.servers)})


def measure(deployments: list[Deployment], clients: int, warmup_s: float, measure_s: float, rounds: int) -> dict:
    runs: dict[str, list[dict]] = {d.name: [] for d in deployments}
    for r in range(rounds):
        shift = r % len(deployments)
        for deployment in deployments[shift:] + deployments[:shift]:
            meter = deployment.meter()
            ports = [server.port for server in deployment.servers]
            result = run_load(ports, deployment.first.api_key, clients, warmup_s, measure_s, meter=meter)
            if result["failures"]:
                raise RuntimeError(f"{deployment.name}: {result['failures']} calls failed: "
                                   f"{result['failure_examples']}")
            result["machine_busy_cores"] = meter.machine_busy
            runs[deployment.name].append(result)
            print(f"  round {r + 1} {deployment.name:<11} {result['calls_per_s']:7.1f} calls/s  p50 "
                  f"{result['p50_ms']:6.2f} ms  machine {meter.machine_busy:.2f} cores busy", flush=True)
    return {name: summarize(results) for name, results in runs.items()}


def summarize(results: list[dict]) -> dict:
    def median(key):
        return statistics.median(r[key] for r in results)
    parts = results[0]["cpu_ms_per_call"].keys()
    cpu = {part: statistics.median(r["cpu_ms_per_call"][part] for r in results) for part in parts}
    servers = statistics.median(sum(v for k, v in r["cpu_ms_per_call"].items() if k.startswith("server"))
                                for r in results)
    return {"calls_per_s": median("calls_per_s"), "p50_ms": median("p50_ms"), "p99_ms": median("p99_ms"),
            "machine_busy_cores": median("machine_busy_cores"), "cpu_ms_per_call": cpu,
            "servers_cpu_ms_per_call": servers, "rounds": results}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short windows, three rounds (about two minutes)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5; 3 quick)")
    args = parser.parse_args(argv)
    warmup_s, measure_s = (2.0, 5.0) if args.quick else (3.0, 10.0)
    rounds = args.rounds or (3 if args.quick else 5)

    deployments = [Deployment("one", 1), Deployment("two", 2),
                   Deployment("two_shared", 2, settings_module="shared_writer_settings")]
    print("starting three embedded deployments (one process; two; two with a shared writer queue)…", flush=True)
    try:
        for deployment in deployments:
            deployment.start()
        results = measure(deployments, args.clients, warmup_s, measure_s, rounds)
    finally:
        for deployment in deployments:
            deployment.stop()

    base = results["one"]
    print(f"\n{'deployment':<12} {'calls/s':>8} {'× one':>6} {'p50 ms':>7} {'p99 ms':>7} {'busy cores':>10} "
          f"{'servers CPU ms/call':>19} {'load CPU ms/call':>16}")
    for name, r in results.items():
        r["calls_per_s_vs_one"] = r["calls_per_s"] / base["calls_per_s"]
        print(f"{name:<12} {r['calls_per_s']:>8.1f} {r['calls_per_s_vs_one']:>6.2f} {r['p50_ms']:>7.2f} "
              f"{r['p99_ms']:>7.2f} {r['machine_busy_cores']:>10.2f} {r['servers_cpu_ms_per_call']:>19.2f} "
              f"{r['cpu_ms_per_call']['load client']:>16.2f}")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"config": {"quick": args.quick, "clients": args.clients, "rounds": rounds,
                                               "warmup_s": warmup_s, "measure_s": measure_s,
                                               "cpus": os.cpu_count()},
                                    "deployments": results}, indent=2) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
