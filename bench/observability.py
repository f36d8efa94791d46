#!/usr/bin/env python
"""What observability costs a governed call: the server's CPU time per call with metrics off and on, in one run.

Starts one daphne server per variant in the embedded mode (fresh data dir, migrate, bootstrap), each with
bench/bench_settings.py and the variant's environment, then measures them interleaved, round after round: in each
round every variant gets the same load (`--clients` keep-alive clients, each with its session, POSTing
`{"name": "current_time", "input": {}, "wait": 10}`), and the CPU time its server process used (user + system, from
/proc/<pid>/stat: not wall time) is divided by the calls it served. The median over rounds is the figure; the
ratio to `metrics_off` is the overhead. Prints a table and writes JSON (--json PATH).

Variants:
- `metrics_off`: TOOLKEEPER_METRICS=0 (every hook returns at its first line), the baseline;
- `metrics_on`: the default; target: at most 5% more CPU per call than the baseline;
- `tracing_on` (with --tracing): TRACING_ON_ENV below, tracing at full sampling to a local OTLP sink that
  accepts and drops what it is sent. The slot for the tracing part of the issue: fill TRACING_ON_ENV with the
  environment that turns it on, nothing else changes.

    .venv/bin/python bench/observability.py [--quick] [--json PATH] [--clients 4] [--tracing]
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT))

from tests.live.server import LiveServer  # noqa: E402

sys.path.insert(0, str(BENCH_DIR))
from bench_http import Client, new_session, run_together  # noqa: E402

GOVERNED_BODY = {"name": "current_time", "input": {}, "wait": 10}
TARGET_METRICS_RATIO = 1.05
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# The environment of each variant. `{sink}` is replaced by the URL of the local OTLP sink.
METRICS_OFF_ENV = {"TOOLKEEPER_METRICS": "0"}
METRICS_ON_ENV = {"TOOLKEEPER_METRICS": "1"}
# TRACING's slot: the environment that turns tracing on at full sampling (metrics on as deployed by default).
TRACING_ON_ENV = {"TOOLKEEPER_METRICS": "1", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "{sink}/v1/traces",
                  "OTEL_TRACES_SAMPLER": "always_on"}


class _Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that accepts everything and keeps nothing but the number of spans it was sent."""

    spans = 0
    counting = threading.Lock()

    def do_POST(self):  # noqa: N802 (the standard library's name)
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        request = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        sent = sum(len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans)
        with _Sink.counting:
            _Sink.spans += sent
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format, *args):  # noqa: A002
        pass


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14 and 15 of stat)


def check_governed(status: int, payload: bytes) -> None:
    if status != 200:
        raise RuntimeError(f"governed call answered {status}: {payload[:300]!r}")
    call = json.loads(payload)["calls"][0]
    if call["status"] != "succeeded":
        raise RuntimeError(f"governed call ended {call['status']}: {payload[:300]!r}")


class Variant:
    def __init__(self, name: str, env: dict, clients: int):
        self.name, self.env = name, env
        self.server = LiveServer(
            settings_module="bench_settings", extra_pythonpath=[str(BENCH_DIR)],
            extra_env={"DEBUG": "0", "SECRET_KEY": "bench-only-" + "x" * 40, "LOG_LEVEL": "WARNING",
                       "TOOLKEEPER_SECRETS_KEY": "YmVuY2gtb25seS14eHh4eHh4eHh4eHh4eHh4eHh4eHg=", **env},
            daphne_args=["-v", "0"])
        self.clients_wanted = clients
        self.pool: list[Client] = []
        self.paths: list[str] = []
        self.per_call_ms: list[float] = []
        self.calls = 0
        self.warmup_calls = 0

    def start(self) -> None:
        self.server.start()
        self.pool = [Client(self.server.port, self.server.api_key) for _ in range(self.clients_wanted)]
        self.paths = [f"/api/v1/sessions/{new_session(c, n)}/calls" for n, c in enumerate(self.pool)]

    def round(self, per_client: int, record: bool = True) -> None:
        for client in self.pool:  # fresh connections: an idle one may have been closed while others ran
            client.close()
        self.pool = [Client(self.server.port, self.server.api_key) for _ in self.paths]
        pid = self.server.process.pid
        before = cpu_seconds(pid)
        calls = [lambda n=n: self.pool[n].timed(self.paths[n], GOVERNED_BODY, check_governed)
                 for n in range(len(self.pool))]
        samples, _wall = run_together(calls, per_client)
        time.sleep(0.2)  # the last calls' work after their answers (counts on commit, the executor's release)
        used = cpu_seconds(pid) - before
        if record:
            self.per_call_ms.append(used / len(samples) * 1000)
            self.calls += len(samples)
        else:
            self.warmup_calls += len(samples)

    def stop(self) -> None:
        for client in self.pool:
            client.close()
        self.server.stop()

    def summary(self) -> dict:
        return {"rounds": len(self.per_call_ms), "calls": self.calls,
                "cpu_ms_per_call_median": statistics.median(self.per_call_ms),
                "cpu_ms_per_call_mean": statistics.fmean(self.per_call_ms),
                "cpu_ms_per_call_min": min(self.per_call_ms), "cpu_ms_per_call_max": max(self.per_call_ms),
                "env": self.env}


def off_hook_ns(repeat: int = 200_000) -> float:
    """What one tracing hook costs with tracing off (the state of every deployment without an OTLP endpoint): a
    span opened and closed around nothing, in nanoseconds. Every hook of a call is this module-flag check."""
    sys.path.insert(0, str(ROOT / "platform"))
    from common import tracing

    assert not tracing.ENABLED
    started = time.perf_counter_ns()
    for _ in range(repeat):
        with tracing.child_span(None, "step"):
            pass
    return (time.perf_counter_ns() - started) / repeat


def print_table(results: dict, baseline: str) -> None:
    header = (f"{'variant':<13} {'rounds':>6} {'calls':>7} {'CPU ms/call (median)':>21} {'min':>7} {'max':>7} "
              f"{'ratio':>7}")
    print(header)
    print("-" * len(header))
    base = results[baseline]["cpu_ms_per_call_median"]
    for name, s in results.items():
        ratio = s["cpu_ms_per_call_median"] / base
        print(f"{name:<13} {s['rounds']:>6} {s['calls']:>7} {s['cpu_ms_per_call_median']:>21.3f} "
              f"{s['cpu_ms_per_call_min']:>7.3f} {s['cpu_ms_per_call_max']:>7.3f} {ratio:>7.3f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, well under two minutes")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients per variant (default 4)")
    parser.add_argument("--tracing", action="store_true", help="add the variant with tracing on (full sampling)")
    args = parser.parse_args(argv)
    rounds, per_client, warmup = (6, 40, 10) if args.quick else (16, 100, 20)

    sink = None
    variants = [("metrics_off", METRICS_OFF_ENV), ("metrics_on", METRICS_ON_ENV)]
    if args.tracing:
        sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
        threading.Thread(target=sink.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{sink.server_address[1]}"
        variants.append(("tracing_on", {k: v.replace("{sink}", url) for k, v in TRACING_ON_ENV.items()}))
    running = [Variant(name, env, args.clients) for name, env in variants]
    try:
        for variant in running:
            print(f"starting {variant.name}…", flush=True)
            variant.start()
            variant.round(warmup, record=False)
        for number in range(rounds):
            # each round in another order, so no variant always follows the same one
            order = running[number % len(running):] + running[:number % len(running)]
            for variant in order:
                variant.round(per_client)
            print(f"round {number + 1}/{rounds}: " + ", ".join(
                f"{v.name} {v.per_call_ms[-1]:.3f} ms" for v in running), flush=True)
    finally:
        for variant in running:
            variant.stop()
        if sink is not None:
            sink.shutdown()

    results = {variant.name: variant.summary() for variant in running}
    tracing_off = None
    if args.tracing:
        time.sleep(6)  # the batch processor's last export (its default delay is 5 s)
        traced = next(v for v in running if v.name == "tracing_on")
        spans_per_call = _Sink.spans / max(1, traced.calls + traced.warmup_calls)
        hook_ns = off_hook_ns()
        per_call_us = spans_per_call * hook_ns / 1000
        tracing_off = {"spans_per_call": spans_per_call, "off_hook_ns": hook_ns, "off_hooks_us_per_call": per_call_us,
                       "share_of_call": per_call_us / 1000 / results["metrics_on"]["cpu_ms_per_call_median"]}
    base = results["metrics_off"]["cpu_ms_per_call_median"]
    ratios = {name: s["cpu_ms_per_call_median"] / base for name, s in results.items()}
    print()
    print_table(results, "metrics_off")
    verdict = "ok" if ratios["metrics_on"] <= TARGET_METRICS_RATIO else "MISSES TARGET"
    print(f"\nmetrics on / off: {ratios['metrics_on']:.3f} (target <= {TARGET_METRICS_RATIO}: {verdict})")
    if tracing_off is not None:
        print(f"tracing on (full sampling) / metrics on: {ratios['tracing_on'] / ratios['metrics_on']:.3f}; "
              f"{tracing_off['spans_per_call']:.1f} spans a call")
        print(f"tracing off: {tracing_off['spans_per_call']:.1f} hooks a call x {tracing_off['off_hook_ns']:.0f} ns = "
              f"{tracing_off['off_hooks_us_per_call']:.2f} us a call, {tracing_off['share_of_call']:.4%} of its CPU")
    result = {
        "metrics_ratio": ratios["metrics_on"], "ratios": ratios, "target_metrics_ratio": TARGET_METRICS_RATIO,
        "variants": results, "tracing_off": tracing_off,
        "config": {"quick": args.quick, "clients": args.clients, "rounds": rounds, "calls_per_client": per_client,
                   "mode": "embedded (SQLite, in-process layer)", "measure": "server process CPU (user+system)"},
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()},
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
