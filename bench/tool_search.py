#!/usr/bin/env python
"""Tool search benchmark: `search_tools` over a tenant of 10,000 tools, on PostgreSQL (and SQLite).

    python bench/tool_search.py [--quick] [--json PATH] [--backends postgres,sqlite] [--tools N]

Builds, in a fresh temporary database per backend (a PostgreSQL database created and dropped by this script,
server from BENCH_POSTGRES_URL, default postgres://postgres@127.0.0.1:5432/postgres; a SQLite file), one tenant
of N tools (10,000; 2,000 with --quick) shaped like MCP servers' tools: `mcp__<server>__<verb>_<noun>` with a
sentence of description and an input schema of three described properties, 200 servers of 50 tools. The
servers' tools are spread over groups as a tenant would: an operator-managed group that is on, switchable
groups, an operator-managed group that is off (unreachable), and a group limited to another agent; a deny rule
hides one server's tools. A second tenant holds as many tools, so the tenant condition has work to do.

Then it times `tools.catalog.search.tools_search` — the function `search_tools` runs, policy included —
for a seeded mix of queries (one to four words, rare and common, some matching nothing), for a session of a
tenant that lists the core and the tool search. Each backend runs in a subprocess of its own with DATABASE_URL
set; PostgreSQL's statistics are gathered after the build (ANALYZE, as autovacuum would after a bulk sync). The
baseline, measured in the same run on the same database, is a primary-key lookup of one tool.

Prints a table and writes JSON: postgres_p50_ms, postgres_p99_ms, sqlite_p50_ms, sqlite_p99_ms and the details.
Target: p99 <= 20 ms on PostgreSQL at 10,000 tools.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_P99_MS = 20.0
SEED = 20261206
SERVER_TOOLS = 50

VERBS = ["get", "list", "create", "update", "delete", "search", "archive", "assign", "close", "merge", "export",
         "import", "approve", "comment", "tag", "move", "copy", "schedule", "cancel", "refund"]
NOUNS = ["issue", "pull_request", "repository", "branch", "invoice", "customer", "ticket", "incident", "page",
         "dashboard", "alert", "deployment", "pod", "secret", "user", "team", "order", "payment", "shipment",
         "document", "calendar_event", "email", "message", "channel", "file", "folder", "report", "contract",
         "lead", "opportunity", "campaign", "build", "pipeline", "artifact", "metric", "log", "trace", "task"]
ADJECTIVES = ["open", "closed", "pending", "archived", "recent", "shared", "private", "public", "failed", "draft"]
DOMAINS = ["github", "jira", "stripe", "zendesk", "pagerduty", "grafana", "kubernetes", "vault", "slack", "gmail",
           "salesforce", "hubspot", "notion", "drive", "datadog", "sentry", "shopify", "linear", "asana", "confluence"]
QUERY_WORDS = (VERBS + [n.replace("_", " ") for n in NOUNS] + ADJECTIVES + DOMAINS
               + ["zebra", "quantum", "bluefin", "xylophone"])  # words no tool has


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def tool_rows(tenant, count: int, rng: random.Random) -> list:
    from tools.models import Tool, ToolSource

    rows = []
    for number in range(count):
        server, verb, noun = f"{DOMAINS[(number // SERVER_TOOLS) % len(DOMAINS)]}{number // SERVER_TOOLS}", \
            rng.choice(VERBS), rng.choice(NOUNS)
        name = f"mcp__{server}__{verb}_{noun}_{number % SERVER_TOOLS}"
        adjective = rng.choice(ADJECTIVES)
        description = (f"{verb.capitalize()} a {adjective} {noun.replace('_', ' ')} in {server.rstrip('0123456789')}"
                       f" and return its {rng.choice(NOUNS).replace('_', ' ')} with {rng.choice(ADJECTIVES)} fields.")
        schema = {"type": "object", "properties": {
            f"{noun}_id": {"type": "string", "description": f"The {noun.replace('_', ' ')} to {verb}."},
            "owner": {"type": "string", "description": f"Who owns the {rng.choice(NOUNS).replace('_', ' ')}."},
            "limit": {"type": "integer", "description": "How many results at most."}}}
        rows.append(Tool(tenant=tenant, name=name, description=description, input_schema=schema,
                         source=ToolSource.EXTERNAL, source_ref=name))
    return rows


def worker(tools_wanted: int, queries: int, out_path: str) -> None:
    sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolkeeper.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from approvals.services import rule_create
    from tenancy.services import tenant_create, tenant_governance_set
    from tools.catalog.search import tools_search
    from tools.catalog.services import group_create, session_create
    from tools.catalog.snapshot import catalog_snapshot
    from tools.models import AgentSession, Tool

    call_command("migrate", verbosity=0, interactive=False)
    rng = random.Random(SEED)
    tenant = tenant_create(slug="bench", name="Bench")
    other = tenant_create(slug="other", name="Other")
    started = time.perf_counter()
    for owner in (tenant, other):
        rows = tool_rows(owner, tools_wanted, rng)
        for start in range(0, len(rows), 1000):
            Tool.objects.bulk_create(rows[start:start + 1000])
    build_s = time.perf_counter() - started
    tools = list(Tool.objects.for_tenant(tenant).filter(source_ref__startswith="mcp__").order_by("id"))
    servers = [tools[i:i + SERVER_TOOLS] for i in range(0, len(tools), SERVER_TOOLS)]
    # groups as a tenant would have them: 40% of the servers operator-managed and on, 40% switchable, 10% off,
    # 10% limited to another agent
    for number, server in enumerate(servers):
        kind = number % 10
        options = ({"switchable": False, "default_active": True} if kind < 4 else
                   {"switchable": True, "default_active": False} if kind < 8 else
                   {"switchable": False, "default_active": False} if kind == 8 else
                   {"switchable": False, "default_active": True, "agents": ["finance-bot"]})
        group_create(tenant=tenant, name=f"server{number}", tools=server, **options)
    rule_create(tenant=tenant, behavior="deny", tool_pattern=servers[1][0].name.rsplit("__", 1)[0] + "__*")
    tenant_governance_set(tenant=tenant, tool_surface="search")
    session = session_create(tenant=tenant, agent="support-bot")
    session = AgentSession.objects.for_tenant(tenant).select_related("tenant").get(pk=session.pk)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:  # what autovacuum does after a bulk sync, done now
            cursor.execute("ANALYZE")

    query_rng = random.Random(SEED + 1)
    texts = [" ".join(query_rng.sample(QUERY_WORDS, query_rng.choice([1, 2, 2, 3, 4]))) for _ in range(queries)]
    catalog_snapshot(tenant.pk)
    for text in texts[:20]:  # warm-up: the snapshot, the rule index, the statement plans
        tools_search(session=session, query=text)
    times, found = [], []
    for text in texts:
        start = time.perf_counter()
        hits = tools_search(session=session, query=text)
        times.append((time.perf_counter() - start) * 1000)
        found.append(len(hits))
    baseline = []
    pks = [tool.pk for tool in query_rng.sample(tools, min(200, len(tools)))]
    for pk in pks:
        start = time.perf_counter()
        Tool.objects.for_tenant(tenant).filter(pk=pk).values_list("name", flat=True).first()
        baseline.append((time.perf_counter() - start) * 1000)
    result = {
        "backend": connection.vendor, "tools": tools_wanted, "queries": len(texts), "build_s": round(build_s, 1),
        "p50_ms": round(percentile(times, 0.5), 3), "p99_ms": round(percentile(times, 0.99), 3),
        "max_ms": round(max(times), 3), "mean_hits": round(statistics.mean(found), 2),
        "empty_answers": sum(1 for n in found if n == 0),
        "baseline_pk_lookup_p50_ms": round(statistics.median(baseline), 3),
    }
    result["p50_over_baseline"] = round(result["p50_ms"] / max(result["baseline_pk_lookup_p50_ms"], 1e-6), 1)
    Path(out_path).write_text(json.dumps(result))


# --- the driver ----------------------------------------------------------------------------------

def _pg_admin_url() -> str:
    return os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")


def run_backend(backend: str, tools: int, queries: int, workdir: Path) -> dict:
    out = workdir / f"{backend}.json"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(TOOLKEEPER_DATA_DIR=str(workdir / "data"), LOG_LEVEL="WARNING", TOOLKEEPER_EXECUTOR="local")
    dropper = None
    if backend == "sqlite":
        env["DATABASE_URL"] = f"sqlite:///{workdir / 'bench.sqlite3'}"
    else:
        import psycopg

        admin_url = _pg_admin_url()
        name = f"tk_bench_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

        def dropper():
            with psycopg.connect(admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

        base, _, _ = admin_url.rpartition("/")
        env["DATABASE_URL"] = f"{base}/{name}"
    try:
        subprocess.run([sys.executable, __file__, "--worker", "--tools", str(tools), "--queries", str(queries),
                        "--out", str(out)], env=env, cwd=ROOT, check=True)
        return json.loads(out.read_text())
    finally:
        if dropper is not None:
            dropper()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 tools instead of 10,000")
    parser.add_argument("--json", metavar="PATH", help="write the results here")
    parser.add_argument("--backends", default="postgres,sqlite")
    parser.add_argument("--tools", type=int)
    parser.add_argument("--queries", type=int)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    tools = args.tools or (2_000 if args.quick else 10_000)
    queries = args.queries or (200 if args.quick else 1000)
    if args.worker:
        worker(tools, queries, args.out)
        return 0
    results = {}
    with tempfile.TemporaryDirectory(prefix="tk-bench-") as tmp:
        for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
            print(f"{backend}: building {tools:,} tools and running {queries} searches…", flush=True)
            results[backend] = run_backend(backend, tools, queries, Path(tmp))
    print()
    header = f"{'backend':<10} {'tools':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'hits':>6} " \
             f"{'empty':>6} {'pk ms':>7} {'p50/baseline':>13}"
    print(header)
    print("-" * len(header))
    for backend, r in results.items():
        print(f"{backend:<10} {r['tools']:>8,} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['max_ms']:>8.2f} "
              f"{r['mean_hits']:>6.1f} {r['empty_answers']:>6} {r['baseline_pk_lookup_p50_ms']:>7.3f} "
              f"{r['p50_over_baseline']:>12.1f}x")
    summary = {"tools": tools, "target_p99_ms": TARGET_P99_MS}
    for backend, r in results.items():
        key = "postgres" if backend.startswith("postgres") else backend
        summary[f"{key}_p50_ms"] = r["p50_ms"]
        summary[f"{key}_p99_ms"] = r["p99_ms"]
    summary["details"] = results
    if "postgres" in results:
        met = results["postgres"]["p99_ms"] <= TARGET_P99_MS
        print(f"\ntarget p99 <= {TARGET_P99_MS:g} ms on PostgreSQL: {'met' if met else 'MISSED'}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
