#!/usr/bin/env python
"""The reviewer inbox under load (issue 3, point 8): 100k pending approval requests over 50 tenants.

Creates a fresh PostgreSQL database (bench_inbox_<random>), migrates it, bulk-creates the requests, and
measures in-process (Django's test client, the whole middleware and view stack, no network):

- the approvals API list, `GET /api/v1/approvals` with an admin key, and
- the inbox console page, `/t/<slug>/inbox/`, as a logged-in reviewer (skipped while it does not exist),

as p50/p99 ms and SQL queries per page (CaptureQueriesContext). The same is measured first with 1k requests:
the queries per page must not change with the number of requests. The database is dropped at the end.

    python bench/inbox.py [--quick] [--json PATH] [--pg postgres://postgres@127.0.0.1:5432/postgres]

--quick: 10k requests instead of 100k, fewer samples (under a minute).
Targets: page_p99_ms ≤ 150; queries per page constant in the number of requests.
"""
import argparse
import base64
import gc
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TENANTS = 50
BIG_SHARE = 0.10  # the measured tenant holds this share of all requests (one big tenant, 49 others)
SESSIONS_PER_TENANT = 10
VOTED_SHARE = 0.05  # requests that already have one vote (quorum queues)
REASON = "no rule matched: the tenant's default is ask"


# --- parent: the throwaway database ------------------------------------------------------------

def admin_connection(url: str):
    import psycopg

    return psycopg.connect(url, autocommit=True)


def database_url(base: str, name: str) -> str:
    head, _, _ = base.rpartition("/")
    return f"{head}/{name}"


def run_parent(args) -> int:
    name = f"bench_inbox_{secrets.token_hex(4)}"
    with admin_connection(args.pg) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    print(f"created database {name}", flush=True)
    try:
        env = {
            **os.environ,
            "DATABASE_URL": database_url(args.pg, name),
            "DJANGO_SETTINGS_MODULE": "toolkeeper.settings",
            "DEBUG": "0",
            "SECRET_KEY": "bench-inbox-" + secrets.token_hex(16),
            "TOOLKEEPER_SECRETS_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "ALLOWED_HOSTS": "testserver",
            "TOOLKEEPER_DATA_DIR": os.environ.get("TOOLKEEPER_DATA_DIR", "/tmp/toolkeeper-bench-inbox"),
        }
        env.pop("REDIS_URL", None)
        command = [sys.executable, __file__, "--child"] + (["--quick"] if args.quick else [])
        command += ["--gc-freeze"] if args.gc_freeze else ["--no-gc-freeze"]
        if args.json:
            command += ["--json", str(args.json)]
        return subprocess.run(command, env=env, cwd=ROOT, check=False).returncode
    finally:
        with admin_connection(args.pg) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name])
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        print(f"dropped database {name}", flush=True)


# --- child: populate and measure ---------------------------------------------------------------

def setup_django():
    sys.path[:0] = [str(ROOT), str(ROOT / "platform")]
    import django

    django.setup()
    from django.core.management import call_command

    started = time.perf_counter()
    call_command("migrate", verbosity=0, interactive=False)
    print(f"migrated in {time.perf_counter() - started:.1f} s", flush=True)


class World:
    """50 tenants, each with an admin, a reviewer, an admin API key, sessions and a governed tool."""

    def __init__(self):
        from django.contrib.auth import get_user_model

        from approvals.services import default_queue, queue_save
        from tenancy.services import apikey_create, membership_set, tenant_create
        from tools.models import AgentSession, Tool

        users = get_user_model().objects  # password=None: no hashing, force_login needs none
        self.tenants = []
        started = time.perf_counter()
        for n in range(TENANTS):
            admin = users.create_user(username=f"admin{n:02d}", password=None)
            tenant = tenant_create(slug=f"t{n:02d}", name=f"Tenant {n:02d}", admin=admin, default_behavior="ask")
            reviewer = users.create_user(username=f"reviewer{n:02d}", password=None)
            membership_set(tenant=tenant, user=reviewer, role="reviewer")
            key = apikey_create(tenant=tenant, name="bench", scopes=["admin"]).key
            queues = [default_queue(tenant), queue_save(tenant=tenant, name="payments", required_approvals=2),
                      queue_save(tenant=tenant, name="deploys")]
            sessions = AgentSession.objects.bulk_create([
                AgentSession(tenant=tenant, agent=f"agent-{s % 3}", user=f"user{s}@example.com",
                             context={"ticket": s}) for s in range(SESSIONS_PER_TENANT)
            ])
            tool = Tool.objects.for_tenant(tenant).get(name="calculate")
            self.tenants.append({"tenant": tenant, "admin": admin, "reviewer": reviewer, "key": key,
                                 "queues": queues, "sessions": sessions, "tool": tool, "created": 0})
        print(f"{TENANTS} tenants in {time.perf_counter() - started:.1f} s", flush=True)

    @property
    def measured(self):
        return self.tenants[0]

    def total(self) -> int:
        return sum(t["created"] for t in self.tenants)


def add_requests(world: World, total: int, batch: int = 5000) -> None:
    """Bring the number of pending requests up to `total`: the measured tenant holds BIG_SHARE of them."""
    from django.db import connection, transaction

    from approvals.models import ApprovalRequest, Vote
    from tools.models import ToolCall

    started = time.perf_counter()
    targets = [round(total * BIG_SHARE)] + [0] * (TENANTS - 1)
    rest = total - targets[0]
    for i in range(1, TENANTS):
        targets[i] = rest // (TENANTS - 1) + (1 if i - 1 < rest % (TENANTS - 1) else 0)
    for entry, target in zip(world.tenants, targets, strict=True):
        tenant, tool = entry["tenant"], entry["tool"]
        while entry["created"] < target:
            count = min(batch, target - entry["created"])
            first = entry["created"]
            calls, requests = [], []
            for n in range(first, first + count):
                session = entry["sessions"][n % SESSIONS_PER_TENANT]
                expression = f"{n} * {n % 97} + {n % 13}"
                calls.append(ToolCall(
                    tenant=tenant, session=session, call_id=f"call_{n}", tool=tool, tool_name=tool.name,
                    input={"expression": expression}, effective_input={"expression": expression},
                    status="awaiting_approval", event_seq=1,
                    decision={"behavior": "ask", "rule": None, "reason": REASON},
                ))
            with transaction.atomic():
                ToolCall.objects.bulk_create(calls, batch_size=batch)
                for n, call in enumerate(calls, start=first):
                    queue = entry["queues"][n % 3]
                    requests.append(ApprovalRequest(
                        tenant=tenant, call=call, queue=queue, kind="approval", status="pending",
                        reason=call.decision["reason"], agent=call.session.agent, tool_name=tool.name,
                    ))
                ApprovalRequest.objects.bulk_create(requests, batch_size=batch)
                votes = [Vote(tenant=tenant, request=r, reviewer=entry["admin"], reviewer_label=entry["admin"].username,
                              decision="approve") for i, r in enumerate(requests) if i % int(1 / VOTED_SHARE) == 0]
                Vote.objects.bulk_create(votes, batch_size=batch)
            entry["created"] += count
    with connection.cursor() as cursor:  # spread opening times over the past weeks, oldest first
        cursor.execute("UPDATE approvals_approvalrequest SET opened_at = now() - (200000 - id) * interval '10 seconds'")
        cursor.execute("UPDATE tools_toolcall SET created_at = r.opened_at FROM approvals_approvalrequest r "
                       "WHERE r.call_id = tools_toolcall.id")
        cursor.execute("ANALYZE")
    print(f"{world.total()} pending requests ({world.measured['created']} in the measured tenant) "
          f"in {time.perf_counter() - started:.1f} s", flush=True)


def inbox_url(slug: str) -> str | None:
    from django.urls import NoReverseMatch, reverse

    for name in ("inbox:list", "inbox:inbox", "inbox:index", "inbox:pending"):
        try:
            return reverse(name, kwargs={"tenant": slug})
        except NoReverseMatch:
            continue
    from django.urls import Resolver404, resolve

    try:
        resolve(f"/t/{slug}/inbox/")
    except Resolver404:
        return None
    return f"/t/{slug}/inbox/"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def measure(client, url: str, samples: int, params: dict | None = None) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(3):  # warm-up
        response = client.get(url, params or {})
        assert response.status_code == 200, (url, response.status_code, response.content[:300])
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url, params or {})
    queries = list(captured.captured_queries)  # a view of the log: copy it before the next request resets it
    times, cpu = [], []
    for _ in range(samples):
        started, started_cpu = time.perf_counter(), time.thread_time()
        response = client.get(url, params or {})
        times.append((time.perf_counter() - started) * 1000)
        cpu.append((time.thread_time() - started_cpu) * 1000)
        assert response.status_code == 200
    plans = sql_profile([q["sql"] for q in queries])
    return {"p50_ms": round(percentile(times, 0.5), 2), "p99_ms": round(percentile(times, 0.99), 2),
            "cpu_p50_ms": round(percentile(cpu, 0.5), 2), "cpu_p99_ms": round(percentile(cpu, 0.99), 2),
            "queries": len(queries), "bytes": len(response.content),
            "db_ms": round(sum(p["ms"] for p in plans), 2), "sql": plans}


def sql_profile(statements: list[str]) -> list[dict]:
    """Each SELECT of a page again under EXPLAIN ANALYZE: server time and the rows it had to read."""
    from django.db import connection

    profile = []
    with connection.cursor() as cursor:
        for sql in statements:
            if not sql.lstrip().upper().startswith("SELECT"):
                profile.append({"sql": sql, "ms": 0.0, "rows_read": 0})
                continue
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
            plan = cursor.fetchone()[0]
            plan = plan[0] if isinstance(plan, list) else json.loads(plan)[0]

            def rows_read(node):
                own = node.get("Actual Rows", 0) * node.get("Actual Loops", 1) if "Scan" in node["Node Type"] else 0
                return own + sum(rows_read(child) for child in node.get("Plans", []))

            profile.append({"sql": sql, "ms": round(plan["Execution Time"], 3), "rows_read": rows_read(plan["Plan"])})
    return profile


def measure_all(world: World, samples: int) -> dict:
    from django.test import Client

    entry = world.measured
    slug = entry["tenant"].slug
    api = Client(HTTP_AUTHORIZATION=f"Bearer {entry['key']}")
    results = {"api": measure(api, "/api/v1/approvals", samples),
               "api_filtered": measure(api, "/api/v1/approvals", samples, {"queue": "payments", "agent": "agent-1"})}
    url = inbox_url(slug)
    if url is None:
        results["page"] = None
    else:
        console = Client()
        console.force_login(entry["reviewer"])
        results["page"] = measure(console, url, samples)
        results["page_filtered"] = measure(console, url, samples, {"queue": "payments"})
    return results


def explain(world: World) -> str:
    """The plan of the list's main query, for the record."""
    from django.db import connection

    from approvals.selectors import inbox_requests

    queryset = inbox_requests(tenant=world.measured["tenant"])[:50]
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def run_child(args) -> int:
    setup_django()
    small, large = 1_000, (10_000 if args.quick else 100_000)
    samples = 30 if args.quick else 150
    world = World()
    report = {}
    for total in (small, large):
        add_requests(world, total)
        if args.gc_freeze:  # what a server can do once after start-up: long-lived objects leave the GC's scans
            gc.collect()
            gc.freeze()
        report[total] = measure_all(world, samples)
        report[total]["measured_tenant_requests"] = world.measured["created"]

    def row(label, total, figures):
        if figures is None:
            print(f"{label:<22} {total:>8}   (no inbox page yet: inbox URLs are not mounted)")
            return
        print(f"{label:<22} {total:>8} {figures['p50_ms']:>8} {figures['p99_ms']:>8} {figures['cpu_p50_ms']:>8} "
              f"{figures['cpu_p99_ms']:>8} {figures['db_ms']:>7} {figures['queries']:>8}")

    print()
    print(f"{'':<22} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8} {'cpu p50':>8} {'cpu p99':>8} {'db ms':>7} "
          f"{'queries':>8}")
    for total, figures in report.items():
        row("api list", total, figures["api"])
        row("api list filtered", total, figures["api_filtered"])
        row("inbox page", total, figures["page"])
        if figures["page"] is not None:
            row("inbox page filtered", total, figures["page_filtered"])

    big, little = report[large], report[small]
    constant = {name: little[name]["queries"] == big[name]["queries"]
                for name in ("api", "api_filtered", "page", "page_filtered") if big.get(name) is not None}
    page = big.get("page")
    summary = {
        "page_p99_ms": page["p99_ms"] if page else None,
        "page_p50_ms": page["p50_ms"] if page else None,
        "api_p99_ms": big["api"]["p99_ms"],
        "api_p50_ms": big["api"]["p50_ms"],
        "page_cpu_p99_ms": page["cpu_p99_ms"] if page else None,
        "page_db_ms": page["db_ms"] if page else None,
        "load_average": os.getloadavg(), "cpus": os.cpu_count(),
        "queries_per_page": page["queries"] if page else big["api"]["queries"],
        "queries_per_page_detail": {f"{name}_{total}": report[total][name]["queries"]
                                    for total in report for name in constant},
        "queries_constant": all(constant.values()),
        "requests": large, "tenants": TENANTS, "measured_tenant_requests": big["measured_tenant_requests"],
        "targets": {"page_p99_ms": 150, "queries_constant": True}, "quick": args.quick, "gc_freeze": args.gc_freeze,
        "details": {str(total): {name: ({k: v for k, v in figures.items() if k != "sql"}
                                        if isinstance(figures, dict) else figures)
                                 for name, figures in report[total].items()} for total in report},
    }
    print()
    print(f"queries per page constant from {small} to {large} requests: {summary['queries_constant']} "
          f"({summary['queries_per_page_detail']})")
    if page is None:
        print("inbox page: not measured (not mounted yet); api list p99 "
              f"{summary['api_p99_ms']} ms")
    else:
        met = page["p99_ms"] <= 150 and summary["queries_constant"]
        print(f"inbox page p99 {page['p99_ms']} ms (target ≤ 150); api p99 {summary['api_p99_ms']} ms; "
              + ("targets met" if met else "TARGET MISSED"))
    if args.explain:
        print("\nEXPLAIN of the list query:\n" + explain(world))
    for name in constant:
        print(f"\nSQL of one {name}: server ms and rows read at {small} → {large} requests")
        for before, after in zip(little[name]["sql"], big[name]["sql"], strict=False):
            print(f"  {before['ms']:>7} → {after['ms']:>7} ms {before['rows_read']:>7} → {after['rows_read']:>7} rows  "
                  + " ".join(after["sql"].split())[:150])
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2, default=str))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10k requests, fewer samples")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--pg", default=os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
                        help="a PostgreSQL URL allowed to create and drop databases")
    parser.add_argument("--explain", action="store_true", help="print the list query's plan and SQL")
    parser.add_argument("--gc-freeze", action=argparse.BooleanOptionalAction, default=True,
                        help="gc.freeze() before measuring, as the server does after start-up (default); "
                             "--no-gc-freeze shows the share of full GC passes in the tail")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json:
        args.json = args.json.resolve()
    return run_child(args) if args.child else run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
