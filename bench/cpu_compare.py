#!/usr/bin/env python
"""CPU per governed call of all of Toolkeeper's processes, today's code against the new, in one run.

Two trees are served side by side, each by its own code (its own tests/live/server.py and
tests/distributed/stack.py, run in a process of their own with the tree first on the path, so a tree whose
settings or helpers differ is still served as it serves itself):

- base: `git archive` of --baseline (default bfc77d2, the code before issue 44's work) into a temporary
        directory, run with this checkout's virtualenv;
- new:  this working tree, or `git archive` of --new COMMIT.

In each mode:

- embedded:    one daphne process (SQLite, in-process channel layer and executor); measured: the server and
               its children (the MCP host process);
- distributed: tests/distributed/stack.py as bench/throughput.py starts it (daphne with the Celery executor, a
               prefork worker of 2 processes, beat, a private redis-server), on a PostgreSQL cluster of its own
               (bench/bench_pg.py: a cluster per tree, so that all of its processes and only they are the
               stack's); measured: the server's tree, the worker's, beat's, the redis-server and the cluster's
               processes (with the CPU of the backends that ended, from the postmaster's cutime/cstime).

three paths are called, each on an agent session of its own, one call at a time:

- rest:  POST /api/v1/sessions/{id}/calls {"name": "current_time", "input": {}, "wait": 10} (in-process tool);
- mcp:   `tools/call` of `current_time` on /mcp/ as the SDK client of the 2026 era sends it (bench/mcp_endpoint.py);
- proxy: the upstream's `echo` (bench/mcp_echo_server.py, one for the run, not counted) through the REST API
         (`mcp__bench__echo`), as bench/mcp_proxy.py calls it.

A figure is the user + system CPU (from /proc, not wall time) that the mode's processes used over a block of
calls, divided by the calls. Blocks alternate the trees (base new new base …: A B B A, so that neither is
always first) and rotate the paths; a path's figure is the median of its blocks. Reported: each tree's
figure per path and mode, the parts per process, and the reduction `1 - new / base`; the target is at least
30% lower on the MCP and proxied paths, and on every path in the distributed mode (docs/performance.md).

    .venv/bin/python bench/cpu_compare.py [--quick] [--modes embedded,distributed] [--baseline REF] [--new REF]
                                          [--calls N] [--rounds N] [--json PATH]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent

BASELINE = "bfc77d2"
TARGET = 0.30  # at least this much lower
PATHS = ("rest", "mcp", "proxy")
WARM_CALLS = 20  # a path's first calls on a tree: 10 left a pool process of the worker cold (a 124 ms block)
TARGETED = {"embedded": ("mcp", "proxy"), "distributed": PATHS}
BENCH_ENV = {"DEBUG": "0", "SECRET_KEY": "bench-only-" + "x" * 40, "LOG_LEVEL": "WARNING",
             "TOOLKEEPER_SECRETS_KEY": "YmVuY2gtb25seS14eHh4eHh4eHh4eHh4eHh4eHh4eHg=",
             "TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS": "127.0.0.1"}


# -- serving one tree with its own code (in a process of its own: `--serve TREE MODE`) --------------------

def serve(tree: str, mode: str) -> int:
    """Start the tree's server (or stack), print what the benchmark needs as one JSON line, serve until
    stdin closes, stop."""
    sys.path[:] = [tree] + [p for p in sys.path if Path(p or ".").resolve() not in (ROOT, BENCH_DIR)]
    os.chdir(tree)
    from tests.live.server import LiveServer

    with contextlib.ExitStack() as stack:
        if mode == "embedded":
            server = stack.enter_context(LiveServer(extra_env=BENCH_ENV, daphne_args=["-v", "0"]))
            pids = {"server": server.process.pid}
        else:
            from tests.distributed.stack import DistributedStack

            dist = stack.enter_context(DistributedStack(extra_env=BENCH_ENV, daphne_args=["-v", "0"],
                                                        worker_concurrency=2))
            server = dist.server
            pids = {"server": server.process.pid, "worker": dist.worker.pid, "beat": dist.beat.pid,
                    "redis": dist.redis.process.pid}
        print(json.dumps({"port": server.port, "url": server.url, "api_key": server.api_key,
                          "admin_api_key": server.admin_api_key, "pids": pids}), flush=True)
        sys.stdin.read()  # until the benchmark closes it (or ends)
    return 0


# -- the benchmark ---------------------------------------------------------------------------------------

def archive(ref: str) -> Path:
    """The tree of a commit in a temporary directory, with this checkout's virtualenv."""
    tree = Path(tempfile.mkdtemp(prefix=f"tk-bench-tree-{ref[:12]}-"))
    data = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=data, check=True)
    (tree / ".venv").symlink_to(os.path.realpath(ROOT / ".venv"))
    return tree


class Served:
    """A tree served by `--serve` in a subprocess; the pids of its processes come back from it."""

    def __init__(self, label: str, tree: Path, mode: str, pg=None):
        self.label, self.tree, self.mode, self.pg = label, tree, mode, pg
        self.process: subprocess.Popen | None = None
        self.log = tempfile.NamedTemporaryFile(prefix=f"tk-bench-serve-{label}-", suffix=".log", delete=False)  # noqa: SIM115

    def __enter__(self) -> Served:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TEST_PG_ADMIN_URL")}
        if self.pg is not None:
            env["TEST_PG_ADMIN_URL"] = self.pg.admin_url
        self.process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve", str(self.tree),
                                         self.mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log, env=env, cwd=self.tree, text=True)
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=30)
            raise RuntimeError(f"{self.label} ({self.mode}) did not start:\n{Path(self.log.name).read_text()[-4000:]}")
        info = json.loads(line)
        self.pids = info["pids"]
        self.server = SimpleNamespace(port=info["port"], url=info["url"], api_key=info["api_key"],
                                      admin_api_key=info["admin_api_key"])
        return self

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.log.close()
        os.unlink(self.log.name)

    def components(self) -> dict:
        """Each measured process group by name: a function listing its pids, asked at every reading."""
        from bench_http import process_tree

        found = {name: (lambda pid=pid: process_tree(pid)) for name, pid in self.pids.items()}
        if self.pg is not None:
            found["postgresql"] = self.pg.pids
        return found


def reading(components: dict) -> dict[str, float]:
    from bench_http import cpu_by_process

    return {name: sum(cpu_by_process(pids(), reaped=True).values()) for name, pids in components.items()}


def measure_mode(mode: str, trees: dict[str, Path], upstream_url: str, calls: int, rounds: int) -> dict:
    from bench_http import Client, new_session
    from bench_pg import PrivatePostgres
    from mcp_endpoint import McpWireClient, RestClient
    from mcp_proxy import ProxyClient, register_upstream

    cpu = {label: {path: [] for path in PATHS} for label in trees}
    parts = {label: {path: [] for path in PATHS} for label in trees}
    wall = {label: {path: [] for path in PATHS} for label in trees}
    with contextlib.ExitStack() as stack:
        served, clients = {}, {}
        for label, tree in trees.items():
            pg = stack.enter_context(PrivatePostgres()) if mode == "distributed" else None
            print(f"{mode}: starting {label} ({tree})…", flush=True)
            served[label] = stack.enter_context(Served(label, tree, mode, pg))
        # The clients connect once every tree serves: a keep-alive connection left idle while the next stack
        # started (a minute under load) was closed by the server (a broken pipe at the first call).
        for n, label in enumerate(trees):
            server = served[label].server
            register_upstream(server, upstream_url)
            http = Client(server.port, server.api_key)
            try:
                sessions = [new_session(http, 7000 + 10 * n + i) for i in range(2)]
            finally:
                http.close()
            clients[label] = {"rest": RestClient(server, sessions[0]), "mcp": McpWireClient(server, sessions[1]),
                              "proxy": ProxyClient(server, 7005 + 10 * n)}
            for client in clients[label].values():
                stack.callback(client.close)
        for label in trees:  # warm: caches, pooled sessions, each worker process's connections and MCP sessions
            for client in clients[label].values():
                for _ in range(WARM_CALLS):
                    client.timed()
        labels = list(trees)
        for r in range(rounds):
            order = labels if r % 4 in (0, 3) else labels[::-1]  # A B, B A, B A, A B, …
            for label in order:
                components = served[label].components()
                for path in PATHS[r % 3:] + PATHS[:r % 3]:
                    before = reading(components)
                    wall[label][path] += [clients[label][path].timed() for _ in range(calls)]
                    after = reading(components)
                    used = {name: (after[name] - before[name]) * 1000 / calls for name in after}
                    parts[label][path].append(used)
                    cpu[label][path].append(sum(used.values()))
            print(f"{mode}: round {r + 1}/{rounds}: " + "  ".join(
                f"{label} " + " ".join(f"{path} {cpu[label][path][-1]:.1f}" for path in PATHS) for label in labels),
                flush=True)
    result = {}
    for label in trees:
        result[label] = {}
        for path in PATHS:
            names = parts[label][path][0].keys()
            result[label][path] = {
                "cpu_ms_per_call": statistics.median(cpu[label][path]), "blocks": cpu[label][path],
                "parts_ms_per_call": {name: statistics.median(b[name] for b in parts[label][path]) for name in names},
                "block_parts": parts[label][path],
                "p50_ms": statistics.median(wall[label][path]) * 1000}
    return result


def main(argv=None) -> int:
    if argv is None and len(sys.argv) == 4 and sys.argv[1] == "--serve":
        return serve(sys.argv[2], sys.argv[3])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer and shorter blocks (a few minutes)")
    parser.add_argument("--modes", default="embedded,distributed", help="embedded, distributed or both (default)")
    parser.add_argument("--baseline", default=BASELINE, help="today's code: a commit (default %(default)s)")
    parser.add_argument("--new", help="the new code: a commit (default: this working tree)")
    parser.add_argument("--calls", type=int, help="calls a block (default 40 with --quick, else 150)")
    parser.add_argument("--rounds", type=int, help="rounds, each a block per tree and path (default 4 with "
                        "--quick, else 8)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    args = parser.parse_args(argv)
    calls = args.calls or (40 if args.quick else 150)
    rounds = args.rounds or (4 if args.quick else 8)
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(TARGETED):
        parser.error(f"unknown mode in {args.modes!r}")

    sys.path[:0] = [str(ROOT), str(BENCH_DIR)]
    from mcp_proxy import EchoServer

    made: list[Path] = []
    try:
        trees = {"base": archive(args.baseline)}
        made.append(trees["base"])
        if args.new:
            trees["new"] = archive(args.new)
            made.append(trees["new"])
        else:
            trees["new"] = ROOT
        results = {}
        started = time.monotonic()
        with EchoServer() as upstream:
            for mode in modes:
                results[mode] = measure_mode(mode, trees, upstream.url, calls, rounds)
    finally:
        for tree in made:
            shutil.rmtree(tree, ignore_errors=True)

    print(f"\nCPU ms per governed call, all of Toolkeeper's processes (median of {rounds} blocks of {calls} calls; "
          f"{time.monotonic() - started:.0f} s)")
    print(f"{'mode':<12} {'path':<6} {'base':>7} {'new':>7} {'lower by':>9}  {'p50 ms base → new':>18}  verdict")
    reductions: dict[str, dict[str, float]] = {}
    for mode, by_tree in results.items():
        reductions[mode] = {}
        for path in PATHS:
            base, new = by_tree["base"][path], by_tree["new"][path]
            lower = reductions[mode][path] = 1 - new["cpu_ms_per_call"] / base["cpu_ms_per_call"]
            verdict = ("ok" if lower >= TARGET else "MISSES TARGET") if path in TARGETED[mode] else "(no target)"
            print(f"{mode:<12} {path:<6} {base['cpu_ms_per_call']:>7.2f} {new['cpu_ms_per_call']:>7.2f} "
                  f"{lower:>8.0%}  {base['p50_ms']:>7.2f} → {new['p50_ms']:<7.2f}  {verdict}")
    print("\nper process, ms per call (base → new):")
    for mode, by_tree in results.items():
        for path in PATHS:
            names = by_tree["base"][path]["parts_ms_per_call"]
            listed = "  ".join(f"{name} {by_tree['base'][path]['parts_ms_per_call'][name]:.2f} → "
                               f"{by_tree['new'][path]['parts_ms_per_call'].get(name, 0.0):.2f}" for name in names)
            print(f"  {mode:<12} {path:<6} {listed}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "baseline": args.baseline, "new": args.new or "working tree", "calls": calls, "rounds": rounds,
            "quick": args.quick, "target": TARGET, "targeted": TARGETED, "results": results,
            "reductions": reductions}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
