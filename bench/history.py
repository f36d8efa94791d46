#!/usr/bin/env python
"""CPU per governed call as a tenant's history grows: the same calls at 1k and at 100k stored calls, on SQLite
and on PostgreSQL.

Starts Toolkeeper with the local executor and the in-process channel layer (bench settings) and the upstream MCP
server of `bench/mcp_proxy.py`, on each database in turn:

- sqlite:   the embedded mode (the data dir's SQLite file), as `make run`;
- postgres: the same server on a fresh PostgreSQL database of a private cluster (bench/bench_pg.py: initdb per
            run, default settings), so that the database's CPU, where a scan would show, is measured too and
            is all this server's (the cluster's processes, with the backends that ended).

It measures three paths, each on a session of its own:

- rest:  POST /api/v1/sessions/{id}/calls with `wait`, the built-in `current_time`;
- mcp:   `tools/call` of `current_time` on /mcp/ (as `bench/mcp_endpoint.py` sends it), which first looks for a
         call of the session still waiting with the same arguments;
- proxy: the upstream's `echo` through the REST API (`mcp__bench__echo`), run by the MCP host process.

Each size has a server and a database of its own (on PostgreSQL, a cluster of its own), started side by side;
each history is grown by inserting rows straight into its database (copies of a finished call, each with its
event, in a session of its own: the tenant's past, not the measured sessions'), one to 1k stored calls (the
baseline), the other to 100k; on PostgreSQL the two tables are then analyzed, as autovacuum would after such an
insert. Then the sizes are measured interleaved: each round takes the paths in turn and, for each, a block of
calls on every size, the sizes' order alternating between rounds, so that the machine's drift over a run falls
on both alike (measured one after the other, a path's figure moved by up to 60% between the sizes with nothing
else running). A path's figure at a size is the CPU all of that size's processes (the server and its children,
and on PostgreSQL its cluster's; from /proc: user + system, not wall time) used over a block, divided by its
calls: the median of its blocks. The server's `read` system calls per call are reported beside it: on SQLite
they count the pages read from the file and its WAL, where a larger history shows first.
Target: at 100k, each path within 10% of its figure at 1k (`ratio` ≤ 1.10), on both databases.

    .venv/bin/python bench/history.py [--quick] [--db sqlite|postgres|both] [--json PATH]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sqlite3
import statistics
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH_DIR))

from bench_http import Client, cpu_by_process, new_session, process_tree  # noqa: E402
from bench_pg import PrivatePostgres  # noqa: E402
from mcp_endpoint import McpWireClient, RestClient  # noqa: E402
from mcp_proxy import EchoServer, ProxyClient, register_upstream  # noqa: E402

from tests.live.server import LiveServer  # noqa: E402

SIZES = (1_000, 100_000)
TARGET = 1.10  # CPU per call at the largest size at most this × at the smallest


class SqliteHistory:
    """The tenant's stored calls, grown by copying one finished call (and its first event) in one statement each."""

    def __init__(self, server: LiveServer, session: str):
        self.db = sqlite3.connect(server.data_dir / "common.sqlite3", timeout=60, isolation_level=None)
        self.session = session.replace("-", "")  # Django keeps a UUID on SQLite as 32 hex digits
        self.source = self.db.execute("SELECT id, tenant_id FROM tools_toolcall WHERE status = 'succeeded' "
                                      "ORDER BY created_at LIMIT 1").fetchone()
        self.batches = 0

    def stored(self) -> int:
        count = self.db.execute("SELECT COUNT(*) FROM tools_toolcall WHERE tenant_id = ?", [self.source[1]])
        return count.fetchone()[0]

    def grow_to(self, size: int) -> float:
        """Insert copies until the tenant has `size` calls; returns the seconds it took."""
        started, missing = time.perf_counter(), size - self.stored()
        if missing <= 0:
            return 0.0
        self.batches += 1
        prefix = f"history-{self.batches}-"
        columns = [row[1] for row in self.db.execute("PRAGMA table_info(tools_toolcall)")]
        values = {"id": "lower(hex(randomblob(16)))", "call_id": "? || n", "session_id": "?"}
        select = ", ".join(values.get(column, f"source.{column}") for column in columns)
        self.db.execute("BEGIN IMMEDIATE")
        self.db.execute(
            "WITH RECURSIVE numbers(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM numbers WHERE n < ?) "  # noqa: S608
            f"INSERT INTO tools_toolcall ({', '.join(columns)}) SELECT {select} FROM numbers, tools_toolcall AS source "
            "WHERE source.id = ?", [missing, prefix, self.session, self.source[0]])
        self.db.execute(
            "INSERT INTO tools_callevent (tenant_id, call_id, seq, kind, data, at) "
            "SELECT tenant_id, id, 1, 'status', '{\"status\": \"succeeded\"}', created_at FROM tools_toolcall "
            "WHERE session_id = ? AND call_id LIKE ?", [self.session, prefix + "%"])
        self.db.execute("COMMIT")
        return time.perf_counter() - started

    def close(self) -> None:
        self.db.close()


class PostgresHistory:
    """The same on PostgreSQL: one INSERT … SELECT over generate_series a table, then ANALYZE."""

    def __init__(self, server: LiveServer, session: str):
        import psycopg

        self.db = psycopg.connect(server.database_url.replace("postgres://", "postgresql://", 1), autocommit=True)
        self.session = session
        self.source = self.db.execute("SELECT id, tenant_id FROM tools_toolcall WHERE status = 'succeeded' "
                                      "ORDER BY created_at LIMIT 1").fetchone()
        self.batches = 0

    def stored(self) -> int:
        count = self.db.execute("SELECT COUNT(*) FROM tools_toolcall WHERE tenant_id = %s", [self.source[1]])
        return count.fetchone()[0]

    def grow_to(self, size: int) -> float:
        started, missing = time.perf_counter(), size - self.stored()
        if missing <= 0:
            return 0.0
        self.batches += 1
        prefix = f"history-{self.batches}-"
        columns = [row[0] for row in self.db.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'tools_toolcall' "
            "ORDER BY ordinal_position")]
        values = {"id": "gen_random_uuid()", "call_id": "%s::text || n", "session_id": "%s::uuid"}
        select = ", ".join(values.get(column, f"source.{column}") for column in columns)
        with self.db.transaction():
            self.db.execute(
                f"INSERT INTO tools_toolcall ({', '.join(columns)}) SELECT {select} "  # noqa: S608
                "FROM generate_series(1, %s) AS n, tools_toolcall AS source WHERE source.id = %s",
                [prefix, self.session, missing, self.source[0]])
            self.db.execute(
                "INSERT INTO tools_callevent (tenant_id, call_id, seq, kind, data, at) "
                "SELECT tenant_id, id, 1, 'status', '{\"status\": \"succeeded\"}'::jsonb, created_at "
                "FROM tools_toolcall WHERE session_id = %s::uuid AND call_id LIKE %s", [self.session, prefix + "%"])
        self.db.execute("ANALYZE tools_toolcall")
        self.db.execute("ANALYZE tools_callevent")
        return time.perf_counter() - started

    def close(self) -> None:
        self.db.close()


def reading(components: list) -> float:
    return sum(sum(cpu_by_process(pids(), reaped=True).values()) for pids in components)


def read_syscalls(pids: list[int]) -> int:
    """`read` system calls made so far by these processes (on SQLite, pages read from the file or its WAL)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/io") as handle:
            total += next(int(line.split()[1]) for line in handle if line.startswith("syscr:"))
    return total


class Instance:
    """One server with a history of its own size: its database (on PostgreSQL, a private cluster), its three
    clients and the pids whose CPU it uses."""

    def __init__(self, db: str, size: int, upstream_url: str, stack: contextlib.ExitStack):
        self.db, self.size = db, size
        options: dict = {}
        self.components: list = []
        if db == "postgres":
            import psycopg

            pg = stack.enter_context(PrivatePostgres())
            with psycopg.connect(pg.admin_url.replace("postgres://", "postgresql://", 1), autocommit=True) as conn:
                conn.execute("CREATE DATABASE toolkeeper_history")
            options = {"database_url": pg.admin_url.rsplit("/", 1)[0] + "/toolkeeper_history",
                       "database_name": "toolkeeper_history"}
            self.components.append(pg.pids)
        self.server = LiveServer(settings_module="bench_settings", extra_pythonpath=[str(BENCH_DIR)],
                                 extra_env=BENCH_ENV, daphne_args=["-v", "0"], **options)
        print(f"{db}, {size:,}: starting daphne (local executor, in-process channel layer)…", flush=True)
        stack.enter_context(self.server)
        self.components.insert(0, lambda: process_tree(self.server.process.pid))
        register_upstream(self.server, upstream_url)
        http = Client(self.server.port, self.server.api_key)
        try:
            past = new_session(http, 9000)
            sessions = [new_session(http, 9001 + i) for i in range(2)]
        finally:
            http.close()
        self.paths = {"rest": RestClient(self.server, sessions[0]), "mcp": McpWireClient(self.server, sessions[1]),
                      "proxy": ProxyClient(self.server, 9003)}
        for client in self.paths.values():
            stack.callback(client.close)
            client.timed()  # a finished call to copy
        self.history = (PostgresHistory if db == "postgres" else SqliteHistory)(self.server, past)
        stack.callback(self.history.close)

    def grow(self) -> float:
        grown = self.history.grow_to(self.size)
        print(f"{self.db}, {self.size:,}: {self.history.stored():,} stored calls (grown in {grown:.1f} s)", flush=True)
        return grown

    def block(self, kind: str, calls: int) -> tuple[float, float, list[float]]:
        """`calls` calls of one path: CPU ms per call, read system calls per call of the server, wall times."""
        server_pids = self.components[0]
        cpu, reads = reading(self.components), read_syscalls(server_pids())
        wall = [self.paths[kind].timed() for _ in range(calls)]
        return ((reading(self.components) - cpu) * 1000 / calls, (read_syscalls(server_pids()) - reads) / calls,
                wall)


def measure(instances: list[Instance], calls: int, rounds: int) -> dict:
    """Every path's blocks on every size, interleaved: each round takes the paths in turn, and for each the sizes
    in an order that alternates between rounds (small first, then large first), so that the machine's drift over
    the run falls on both sizes alike. A figure is the median of a path's blocks at a size."""
    kinds = list(instances[0].paths)
    for instance in instances:  # warm: caches and pooled sessions
        for client in instance.paths.values():
            for _ in range(5):
                client.timed()
    cpu = {(i.size, kind): [] for i in instances for kind in kinds}
    reads = {(i.size, kind): [] for i in instances for kind in kinds}
    wall = {(i.size, kind): [] for i in instances for kind in kinds}
    for r in range(rounds):
        for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
            for instance in (instances if r % 2 == 0 else instances[::-1]):
                ms, syscalls, times = instance.block(kind, calls)
                cpu[instance.size, kind].append(ms)
                reads[instance.size, kind].append(syscalls)
                wall[instance.size, kind] += times
        print(f"  round {r + 1}/{rounds}: " + "  ".join(
            f"{kind} " + " / ".join(f"{cpu[i.size, kind][-1]:.1f}" for i in instances) for kind in kinds), flush=True)
    return {i.size: {kind: {"cpu_ms_per_call": statistics.median(cpu[i.size, kind]), "rounds": cpu[i.size, kind],
                            "read_syscalls_per_call": statistics.median(reads[i.size, kind]),
                            "p50_ms": statistics.median(wall[i.size, kind]) * 1000} for kind in kinds}
            for i in instances}


BENCH_ENV = {"DEBUG": "0", "SECRET_KEY": "bench-only-" + "x" * 40, "LOG_LEVEL": "WARNING",
             "TOOLKEEPER_SECRETS_KEY": "YmVuY2gtb25seS14eHh4eHh4eHh4eHh4eHh4eHh4eHg=",
             "TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS": "127.0.0.1"}


def run_database(db: str, upstream_url: str, sizes: tuple[int, ...], calls: int, rounds: int) -> dict:
    """A server per size on `db`, each history grown to its size, then measured side by side."""
    with contextlib.ExitStack() as stack:
        instances = [Instance(db, size, upstream_url, stack) for size in sizes]
        grown = {instance.size: instance.grow() for instance in instances}
        print(f"{db}: measuring {rounds} rounds of {calls} calls a path and size…", flush=True)
        return {"results": measure(instances, calls, rounds), "grown_s": grown}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls a round, about two minutes a database")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument("--db", choices=("sqlite", "postgres", "both"), default="both",
                        help="the database(s) to measure on (default %(default)s)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="stored calls, smallest (the baseline) "
                        "first (default %(default)s)")
    parser.add_argument("--calls", type=int, help="calls of a path a round (default 80 with --quick, else 200)")
    args = parser.parse_args(argv)
    calls, rounds = (80, 5) if args.quick else (200, 9)
    calls = args.calls or calls
    sizes = tuple(int(size) for size in args.sizes.split(","))
    databases = ("sqlite", "postgres") if args.db == "both" else (args.db,)

    runs = {}
    with EchoServer() as upstream:
        for db in databases:
            runs[db] = run_database(db, upstream.url, sizes, calls, rounds)

    small, large = sizes[0], sizes[-1]
    print(f"\n{'db':<9} {'path':<6} {'CPU ms/call at ' + format(small, ','):>20} {'at ' + format(large, ','):>12} "
          f"{'ratio':>6}  {'p50 ms':>13}  {'reads/call':>12}")
    for db, run in runs.items():
        results = run["results"]
        run["ratios"] = {kind: results[large][kind]["cpu_ms_per_call"] / results[small][kind]["cpu_ms_per_call"]
                         for kind in results[small]}
        for kind, ratio in run["ratios"].items():
            verdict = "ok" if ratio <= TARGET else "MISSES TARGET"
            before, after = results[small][kind], results[large][kind]
            print(f"{db:<9} {kind:<6} {before['cpu_ms_per_call']:>20.2f} {after['cpu_ms_per_call']:>12.2f} "
                  f"{ratio:>6.2f}  {before['p50_ms']:>5.2f} → {after['p50_ms']:<5.2f}  "
                  f"{before['read_syscalls_per_call']:>5.1f} → {after['read_syscalls_per_call']:<5.1f}  "
                  f"(target ≤ {TARGET}: {verdict})")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "sizes": list(sizes), "target": TARGET, "quick": args.quick, "calls": calls, "rounds": rounds,
            "databases": {db: {"results": {str(k): v for k, v in run["results"].items()}, "ratios": run["ratios"],
                               "grown_s": run["grown_s"]} for db, run in runs.items()}}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
