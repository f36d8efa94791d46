#!/usr/bin/env python
"""Sustained governed calls per second, and their latency, for each executor on this machine.

- local:  the embedded default as one daphne process (SQLite, in-process channel layer, the local
          thread-pool executor), like `make run`.
- celery: the distributed mode as real processes (tests/distributed/stack.py): daphne
          (TOOLKEEPER_EXECUTOR=celery) + a Celery worker (prefork, 2 processes) + beat, on a fresh
          PostgreSQL database and a private redis-server (broker and channel layer).

N concurrent clients (default 16; one keep-alive connection and one session each) post governed calls
of a trivial allowed tool, `{"name": "current_time", "input": {}, "wait": 10}`, back to back for a
fixed time after a warm-up; each request counts when its call has `succeeded`. Reports calls/s over
the measuring window, per-request p50/p90/p99, each mode's ratio to the floor (the targets: local
>= 0.6, celery >= 0.5) and the CPU each component used per request over the window (from /proc: the
daphne process; in the celery mode also the worker with its pool, beat, PostgreSQL's processes and the
private redis-server).

- floor:  the same load on the floor endpoint of bench/call_overhead.py (an API-key-authenticated
          insert of one row, no pipeline) on the embedded server: the most requests/s that one
          server process reaches on this machine at all, for scale (JSON `floor_requests_per_s`).

- sequential: before the concurrent load, each mode also serves one client's calls one after another
          (the same governed call): the p50 of the distributed mode over the embedded mode's, in the same
          run, is `ratio_sequential_p50_celery_to_local` (target <= 2), with the CPU each component used per
          call meanwhile. PostgreSQL counts only the backends connected to the stack's own database (not
          the machine's other databases, nor the server's shared background processes).

Prints a table and writes JSON (--json PATH).

    .venv/bin/python bench/throughput.py [--quick] [--json PATH] [--clients 16] [--seconds 20]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT))

from bench_http import Client, CpuMeter, new_session, percentile, process_tree  # noqa: E402
from bench_schema import FLOOR_PATH, create_floor_table  # noqa: E402

from tests.distributed.stack import DistributedStack  # noqa: E402
from tests.live.server import LiveServer  # noqa: E402

BODY = {"name": "current_time", "input": {}, "wait": 10}
# Targets are ratios to the floor measured in the same run, so they hold on any machine.
TARGET_RATIOS = {"local": 0.6, "celery": 0.5}
TARGET_SEQUENTIAL_RATIO = 2.0  # the distributed mode's sequential p50 over the embedded mode's, at most
BENCH_ENV = {"DEBUG": "0", "SECRET_KEY": "bench-only-" + "x" * 40, "LOG_LEVEL": "WARNING",
             "TOOLKEEPER_SECRETS_KEY": "YmVuY2gtb25seS14eHh4eHh4eHh4eHh4eHh4eHh4eHg="}





def succeeded_call(status: int, payload: bytes) -> str | None:
    """Why a governed request does not count, or None."""
    if status != 200:
        return f"{status}: {payload[:200]!r}"
    call = json.loads(payload)["calls"][0]
    return None if call["status"] == "succeeded" else f"call ended {call['status']}: {payload[:200]!r}"


def floor_row(status: int, payload: bytes) -> str | None:
    return None if status == 201 else f"{status}: {payload[:200]!r}"


def run_load(port: int | list[int], key: str, clients: int, warmup_s: float, measure_s: float, *,
             floor: bool = False, meter: CpuMeter | None = None) -> dict:
    """All clients post back to back; requests that finish inside the measuring window are counted, and the
    meter reads each component's CPU over that window. Given several ports (server processes of one deployment),
    the clients are dealt to them in turn, as a load balancer deals connections."""
    ports = port if isinstance(port, list) else [port]
    pool = [Client(ports[n % len(ports)], key) for n in range(clients)]
    if floor:
        paths, check = [FLOOR_PATH] * clients, floor_row
    else:
        paths, check = [f"/api/v1/sessions/{new_session(c, n)}/calls" for n, c in enumerate(pool)], succeeded_call
    start_barrier = threading.Barrier(clients + 1)
    stop_at = [0.0]
    window = [0.0, 0.0]
    samples: list[list[float]] = [[] for _ in pool]
    failures: list[str] = []

    def worker(n: int) -> None:
        client, path = pool[n], paths[n]
        start_barrier.wait()
        while True:
            began = time.perf_counter()
            if began >= stop_at[0]:
                return
            try:
                status, payload = client.post(path, BODY)
            except Exception as exc:  # reported below
                failures.append(repr(exc))
                return
            ended = time.perf_counter()
            problem = check(status, payload)
            if problem is not None:
                failures.append(problem)
                continue
            if window[0] <= began and ended <= window[1]:
                samples[n].append(ended - began)

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(clients)]
    for thread in threads:
        thread.start()
    now = time.perf_counter()
    window[0], window[1] = now + warmup_s, now + warmup_s + measure_s
    stop_at[0] = window[1]
    start_barrier.wait()
    if meter is not None:
        time.sleep(max(0.0, window[0] - time.perf_counter()))
        meter.start()
        time.sleep(max(0.0, window[1] - time.perf_counter()))
        meter.stop()
    for thread in threads:
        thread.join()
    for client in pool:
        client.close()
    flat = [s for per in samples for s in per]
    if not flat:
        raise RuntimeError(f"no call completed in the window; failures: {failures[:5]}")
    return {
        "clients": clients, "n": len(flat), "failures": len(failures), "failure_examples": failures[:3],
        "calls_per_s": len(flat) / measure_s,
        "p50_ms": percentile(flat, 50) * 1000, "p90_ms": percentile(flat, 90) * 1000,
        "p99_ms": percentile(flat, 99) * 1000, "mean_ms": statistics.fmean(flat) * 1000,
        "max_ms": max(flat) * 1000,
        "cpu_ms_per_call": meter.per_call_ms(len(flat)) if meter is not None else {},
    }


def run_sequential(port: int, key: str, calls: int, warmup: int, meter: CpuMeter) -> dict:
    """One client, one call after another: `warmup` calls, then `calls` timed ones with the meter running."""
    client = Client(port, key)
    try:
        path = f"/api/v1/sessions/{new_session(client, 0)}/calls"
        samples: list[float] = []

        def one() -> float:
            began = time.perf_counter()
            status, payload = client.post(path, BODY)
            elapsed = time.perf_counter() - began
            problem = succeeded_call(status, payload)
            if problem is not None:
                raise RuntimeError(f"sequential call failed: {problem}")
            return elapsed

        for _ in range(warmup):
            one()
        meter.start()
        for _ in range(calls):
            samples.append(one())
        meter.stop()
    finally:
        client.close()
    return {
        "n": len(samples), "p50_ms": percentile(samples, 50) * 1000, "p90_ms": percentile(samples, 90) * 1000,
        "p99_ms": percentile(samples, 99) * 1000, "mean_ms": statistics.fmean(samples) * 1000,
        "cpu_ms_per_call": meter.per_call_ms(len(samples)),
    }


def stack_backends(database_name: str):
    """The pids of PostgreSQL's backends connected to this database: the stack's own, asked again at each reading
    (a backend starts per connection)."""
    import psycopg

    from tests.live.server import pg_admin_url

    def pids() -> list[int]:
        with psycopg.connect(pg_admin_url(), autocommit=True) as conn:
            rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", [database_name]).fetchall()
        return [row[0] for row in rows]
    return pids


def measure_local(clients: int, warmup_s: float, measure_s: float, sequential: tuple[int, int]) -> dict:
    server = LiveServer(extra_env=BENCH_ENV, daphne_args=["-v", "0"])
    print("local: starting daphne (embedded: SQLite, local executor)…", flush=True)
    with server:
        components = {"daphne": lambda: process_tree(server.process.pid)}
        print(f"local: {server.url} ready; {sequential[0]} sequential calls…", flush=True)
        one_by_one = run_sequential(server.port, server.api_key, *sequential, meter=CpuMeter(components))
        print(f"local: {clients} clients for {warmup_s:g}+{measure_s:g} s…", flush=True)
        result = run_load(server.port, server.api_key, clients, warmup_s, measure_s, meter=CpuMeter(components))
        result["sequential"] = one_by_one
        return result


def measure_floor(clients: int, warmup_s: float, measure_s: float) -> dict:
    server = LiveServer(settings_module="bench_settings", extra_pythonpath=[str(BENCH_DIR)], extra_env=BENCH_ENV,
                        daphne_args=["-v", "0"])
    print("floor: starting daphne (embedded, with the floor endpoint)…", flush=True)
    with server:
        create_floor_table(server)
        print(f"floor: {server.url} ready; {clients} clients for {warmup_s:g}+{measure_s:g} s…", flush=True)
        meter = CpuMeter({"daphne": lambda: process_tree(server.process.pid)})
        return run_load(server.port, server.api_key, clients, warmup_s, measure_s, floor=True, meter=meter)


def measure_celery(clients: int, warmup_s: float, measure_s: float, sequential: tuple[int, int],
                   concurrency: int = 2) -> dict:
    stack = DistributedStack(extra_env=BENCH_ENV, daphne_args=["-v", "0"], worker_concurrency=concurrency)
    print("celery: starting redis, PostgreSQL database, daphne, Celery worker + beat…", flush=True)
    with stack:
        server = stack.server
        components = {
            "daphne": lambda: process_tree(server.process.pid),
            "celery worker": lambda: process_tree(stack.worker.pid),
            "celery beat": lambda: process_tree(stack.beat.pid),
            "postgresql": stack_backends(stack.database_name),
            "redis": lambda: process_tree(stack.redis.process.pid),
        }
        print(f"celery: {server.url} ready; {sequential[0]} sequential calls…", flush=True)
        one_by_one = run_sequential(server.port, server.api_key, *sequential, meter=CpuMeter(components))
        print(f"celery: {clients} clients for {warmup_s:g}+{measure_s:g} s…", flush=True)
        result = run_load(server.port, server.api_key, clients, warmup_s, measure_s, meter=CpuMeter(components))
        result["worker_concurrency"] = concurrency
        result["sequential"] = one_by_one
        return result


def print_table(modes: dict) -> None:
    header = (f"{'mode':<9} {'clients':>7} {'n':>7} {'fail':>5} {'calls/s':>9} {'p50 ms':>8} {'p90 ms':>8} "
              f"{'p99 ms':>8} {'max ms':>8}")
    print(header)
    print("-" * len(header))
    for name, s in modes.items():
        print(f"{name:<9} {s['clients']:>7} {s['n']:>7} {s['failures']:>5} {s['calls_per_s']:>9.1f} "
              f"{s['p50_ms']:>8.1f} {s['p90_ms']:>8.1f} {s['p99_ms']:>8.1f} {s['max_ms']:>8.1f}")
    print()
    print("CPU per request, ms (over the measuring window):")
    for name, s in modes.items():
        parts = s.get("cpu_ms_per_call", {})
        listed = "  ".join(f"{part} {ms:.2f}" for part, ms in parts.items())
        print(f"  {name:<9} total {sum(parts.values()):6.2f}   {listed}")
    print()
    one_by_one = {name: s["sequential"] for name, s in modes.items() if "sequential" in s}
    if one_by_one:
        print("Sequential (one client), ms per call; CPU per call by component:")
        for name, s in one_by_one.items():
            parts = s["cpu_ms_per_call"]
            listed = "  ".join(f"{part} {ms:.2f}" for part, ms in parts.items())
            print(f"  {name:<9} n {s['n']:>4}  p50 {s['p50_ms']:6.2f}  p90 {s['p90_ms']:6.2f}  p99 {s['p99_ms']:6.2f}"
                  f"   CPU total {sum(parts.values()):6.2f}   {listed}")
        print()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short windows (about a minute in all)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    parser.add_argument("--seconds", type=float, default=None, help="measuring window per executor")
    parser.add_argument("--only", choices=("floor", "local", "celery"), help="measure one mode only")
    parser.add_argument("--sequential", type=int, default=None,
                        help="sequential calls timed per mode, after a tenth as many first (default 300; 150 quick)")
    parser.add_argument("--worker-concurrency", type=int, default=2,
                        help="Celery worker processes (prefork) in the celery mode (default 2)")
    args = parser.parse_args(argv)
    warmup_s = 2.0 if args.quick else 5.0
    measure_s = args.seconds or (6.0 if args.quick else 20.0)
    sequential_n = args.sequential or (150 if args.quick else 300)
    sequential = (sequential_n, max(10, sequential_n // 10))

    modes = {}
    if args.only in (None, "floor"):
        modes["floor"] = measure_floor(args.clients, warmup_s, measure_s)
    if args.only in (None, "local"):
        modes["local"] = measure_local(args.clients, warmup_s, measure_s, sequential)
    if args.only in (None, "celery"):
        modes["celery"] = measure_celery(args.clients, warmup_s, measure_s, sequential, args.worker_concurrency)
    print()
    print_table(modes)
    result: dict = {}
    floor = modes.get("floor", {}).get("calls_per_s")
    for name, s in modes.items():
        result[f"{name}_cpu_ms_per_call"] = s["cpu_ms_per_call"]
        if name == "floor":
            result["floor_requests_per_s"] = s["calls_per_s"]
            print(f"floor: {s['calls_per_s']:.1f} authenticated inserts/s in one server process (for scale)")
            continue
        result[f"{name}_calls_per_s"] = s["calls_per_s"]
        result[f"{name}_p99_ms"] = s["p99_ms"]
        if floor is None:
            print(f"{name}: {s['calls_per_s']:.1f} calls/s, p99 {s['p99_ms']:.1f} ms (no floor in this run)")
            continue
        ratio = result[f"{name}_ratio_to_floor"] = s["calls_per_s"] / floor
        target = TARGET_RATIOS[name]
        verdict = "ok" if ratio >= target else "MISSES TARGET"
        print(f"{name}: {s['calls_per_s']:.1f} calls/s = {ratio:.2f} x floor (target >= {target:g}: {verdict}), "
              f"p99 {s['p99_ms']:.1f} ms")
    for name, s in modes.items():
        if "sequential" in s:
            result[f"{name}_sequential_p50_ms"] = s["sequential"]["p50_ms"]
            result[f"{name}_sequential_cpu_ms_per_call"] = s["sequential"]["cpu_ms_per_call"]
    if "local" in modes and "celery" in modes:
        result["ratio_celery_to_local"] = modes["celery"]["calls_per_s"] / modes["local"]["calls_per_s"]
        ratio = result["ratio_sequential_p50_celery_to_local"] = (
            modes["celery"]["sequential"]["p50_ms"] / modes["local"]["sequential"]["p50_ms"])
        verdict = "ok" if ratio <= TARGET_SEQUENTIAL_RATIO else "MISSES TARGET"
        print(f"sequential p50: celery {modes['celery']['sequential']['p50_ms']:.2f} ms / local "
              f"{modes['local']['sequential']['p50_ms']:.2f} ms = {ratio:.2f} "
              f"(target <= {TARGET_SEQUENTIAL_RATIO:g}: {verdict})")
    result.update({
        "target_ratios_to_floor": TARGET_RATIOS, "target_sequential_ratio": TARGET_SEQUENTIAL_RATIO, "modes": modes,
        "config": {"quick": args.quick, "clients": args.clients, "warmup_s": warmup_s, "measure_s": measure_s,
                   "request": BODY, "sequential": sequential_n, "worker_concurrency": args.worker_concurrency,
                   "cpus": os.cpu_count(),
                   "python": platform.python_version(),
                   "machine": platform.machine()},
    })
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
