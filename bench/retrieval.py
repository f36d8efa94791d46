"""Retrieval benchmark: knowledge_search's full-text search on SQLite and on PostgreSQL.

    python bench/retrieval.py [--quick] [--json PATH] [--backends sqlite,postgres]

Builds a synthetic but word-realistic corpus (a fixed vocabulary with Zipf-like word frequencies,
seeded, so every run sees the same text) of 100,000 chunks (10,000 with --quick), ingests it
through the real service (`documents_ingest_bulk`, batches of 500) into a fresh temporary
database per backend — a SQLite file, and a PostgreSQL database created and dropped by this
script (server from BENCH_POSTGRES_URL, default postgres://postgres@127.0.0.1:5432/postgres) —
then times `chunks_search` (top 5, snippets included) for a seeded mix of queries: all datasets,
one dataset, and a bound department filter. Each backend runs in a subprocess of its own with
DATABASE_URL set. The baseline, measured in the same run on the same database, is a primary-key
lookup of one chunk; the table shows search latency as a ratio of it too.

Prints a table and writes JSON: sqlite_p50_ms, sqlite_p99_ms, postgres_p50_ms, postgres_p99_ms,
ingest_docs_per_s (the slower backend's), per-backend ingest rates, and the details. Target:
p99 <= 50 ms on both backends.
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
TARGET_P99_MS = 50.0
SEED = 20261129
DEPARTMENTS = ["hr", "it", "finance", "engineering", "security", "legal", "sales", "facilities"]
DATASETS = ["handbook", "runbooks", "policies", "wiki"]

# Frequent English words first (the head of the Zipf curve), then domain words; a seeded tail of
# pronounceable made-up words brings the vocabulary to VOCABULARY_SIZE.
_BASE_WORDS_TEXT = """
the of and to a in is it you that he was for on are with as his they be at one have this from or had by
not word but what some we can out other were all there when up use your how said an each she which do
their time if will way about many then them write would like so these her long make thing see him two has
look more day could go come did number sound no most people my over know water than call first who may down
side been now find any new work part take get place made live where after back little only round man year
came show every good me give our under name very through just form sentence great think say help low line
differ turn cause much mean before move right boy old too same tell does set three want air well also play
small end put home read hand port large spell add even land here must big high such follow act why ask men
change went light kind off need house picture try us again animal point mother world near build self earth
father head stand own page should country found answer school grow study still learn plant cover food sun
four between state keep eye never last let thought city tree cross farm hard start might story saw far sea
draw left late run while press close night real life few north open seem together next white children begin
got walk example ease paper group always music those both mark often letter until mile river car feet care
second book carry took science eat room friend began idea fish mountain stop once base hear horse cut sure
watch color face wood main enough plain girl usual young ready above ever red list though feel talk bird soon
body dog family direct pose leave song measure door product black short numeral class wind question happen
complete ship area half rock order fire south problem piece told knew pass since top whole king space heard
best hour better true during hundred five remember step early hold west ground interest reach fast verb sing
listen six table travel less morning ten simple several vowel toward war lay against pattern slow center love
person money serve appear road map rain rule govern pull cold notice voice unit power town fine certain fly
fall lead cry dark machine note wait plan figure star box noun field rest correct able pound done beauty drive
stood contain front teach week final gave green oh quick develop ocean warm free minute strong special mind
behind clear tail produce fact street inch multiply nothing course stay wheel full force blue object decide
surface deep moon island foot system busy test record boat common gold possible plane stead dry wonder laugh
thousand ago ran check game shape equate hot miss brought heat snow tire bring yes distant fill east paint
language among employee vacation leave policy expense receipt laptop vpn password account server database
backup restore deploy release incident alert review request approval manager budget invoice contract customer
ticket network access security report training onboarding office printer meeting calendar project deadline
"""
BASE_WORDS = _BASE_WORDS_TEXT.split()
SYLLABLES = ["ka", "lo", "mi", "ra", "ten", "vor", "sil", "an", "del", "pra", "qui", "zu", "mel", "tor", "bex",
             "ni", "sha", "gor", "fin", "lu", "dra", "ves", "po", "cal", "rin", "to", "mar", "hel", "ob", "ius"]
VOCABULARY_SIZE = 20000
ZIPF_S = 1.07


def vocabulary(rng: random.Random) -> list[str]:
    words = list(dict.fromkeys(BASE_WORDS))
    seen = set(words)
    while len(words) < VOCABULARY_SIZE:
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


class Corpus:
    """Seeded documents whose chunks add up to the requested number."""

    def __init__(self, seed: int = SEED):
        self.rng = random.Random(seed)
        self.words = vocabulary(self.rng)
        weights = [1 / (rank ** ZIPF_S) for rank in range(1, len(self.words) + 1)]
        total = 0.0
        self.cum = []
        for weight in weights:
            total += weight
            self.cum.append(total)

    def sample(self, k: int) -> list[str]:
        return self.rng.choices(self.words, cum_weights=self.cum, k=k)

    def sentence(self) -> str:
        words = self.sample(self.rng.randint(8, 20))
        return " ".join(words).capitalize() + "."

    def paragraph(self) -> str:
        return " ".join(self.sentence() for _ in range(self.rng.randint(3, 6)))

    def document(self, number: int) -> dict:
        title = " ".join(self.sample(self.rng.randint(2, 5))).title()
        text = "\n\n".join(self.paragraph() for _ in range(self.rng.randint(2, 6)))
        return {"title": f"{title} {number}", "text": text, "external_id": f"doc-{number}",
                "metadata": {"department": self.rng.choice(DEPARTMENTS),
                             "visibility": self.rng.choice(["internal", "internal", "public"])}}

    def query(self) -> str:
        """2-5 content words, as a model writes them: stop words are skipped, frequent words are likelier."""
        from knowledge.fts import STOP_WORDS

        words = []
        while len(words) < self.rng.randint(2, 5):
            word = self.sample(1)[0]
            if word not in STOP_WORDS and word not in words:
                words.append(word)
        return " ".join(words)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


# --- the worker: one backend, in its own process -------------------------------------------------

def worker(chunks_wanted: int, queries: int, out_path: str) -> None:
    sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolkeeper.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from knowledge.chunking import chunk_text
    from knowledge.selectors import chunks_search
    from knowledge.services import dataset_create, documents_ingest_bulk
    from tenancy.services import tenant_create

    call_command("migrate", verbosity=0, interactive=False)
    tenant = tenant_create(slug="bench", name="Bench")
    other = tenant_create(slug="other", name="Other")  # a second tenant, so the tenant filter has work to do
    datasets = {name: dataset_create(tenant=tenant, name=name) for name in DATASETS}
    other_dataset = dataset_create(tenant=other, name="handbook")

    corpus = Corpus()
    by_dataset: dict[str, list] = {name: [] for name in DATASETS}
    chunk_total, number = 0, 0
    while chunk_total < chunks_wanted:
        document = corpus.document(number)
        chunk_total += len(chunk_text(document["text"]))
        by_dataset[DATASETS[number % len(DATASETS)]].append(document)
        number += 1
    documents = number
    started = time.perf_counter()
    for name, docs in by_dataset.items():
        documents_ingest_bulk(tenant=tenant, dataset=datasets[name], documents=docs, batch_size=500)
    ingest_s = time.perf_counter() - started
    documents_ingest_bulk(tenant=other, dataset=other_dataset,
                          documents=[corpus.document(10_000_000 + i) for i in range(max(50, documents // 20))],
                          batch_size=500)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ANALYZE knowledge_chunk")
            cursor.execute("SELECT count(*) FROM knowledge_chunk WHERE tenant_id = %s", [tenant.pk])
        else:
            cursor.execute("ANALYZE")
            cursor.execute("SELECT count(*) FROM knowledge_chunk WHERE tenant_id = %s", [tenant.pk])
        stored_chunks = cursor.fetchone()[0]

    rng = random.Random(SEED + 1)
    plan = []
    for _ in range(queries):
        kind = rng.random()
        if kind < 0.5:
            plan.append(("all", corpus.query(), "*", None))
        elif kind < 0.75:
            plan.append(("dataset", corpus.query(), [rng.choice(DATASETS)], None))
        else:
            plan.append(("filter", corpus.query(), "*", {"department": rng.choice(DEPARTMENTS)}))
    for _, query, scope, filters in plan[:20]:  # warm caches
        chunks_search(tenant=tenant, query=query, datasets=scope, filters=filters, top_k=5)
    timings: dict[str, list[float]] = {"all": [], "dataset": [], "filter": []}
    empty = 0
    for kind, query, scope, filters in plan:
        t0 = time.perf_counter()
        hits = chunks_search(tenant=tenant, query=query, datasets=scope, filters=filters, top_k=5)
        timings[kind].append((time.perf_counter() - t0) * 1000)
        empty += not hits
    baseline = []
    with connection.cursor() as cursor:
        cursor.execute("SELECT min(id), max(id) FROM knowledge_chunk")
        low, high = cursor.fetchone()
        for _ in range(200):
            t0 = time.perf_counter()
            cursor.execute("SELECT id, text FROM knowledge_chunk WHERE id = %s AND tenant_id = %s",
                           [rng.randint(low, high), tenant.pk])
            cursor.fetchall()
            baseline.append((time.perf_counter() - t0) * 1000)
    every = [t for values in timings.values() for t in values]
    result = {
        "vendor": connection.vendor,
        "chunks": stored_chunks,
        "documents": documents,
        "ingest_s": round(ingest_s, 2),
        "ingest_docs_per_s": round(documents / ingest_s, 1),
        "ingest_chunks_per_s": round(stored_chunks / ingest_s, 1),
        "queries": len(every),
        "empty_results": empty,
        "p50_ms": round(statistics.median(every), 2),
        "p99_ms": round(percentile(every, 0.99), 2),
        "max_ms": round(max(every), 2),
        "by_scope_p99_ms": {kind: round(percentile(values, 0.99), 2) for kind, values in timings.items() if values},
        "baseline_pk_lookup_p50_ms": round(statistics.median(baseline), 3),
    }
    result["p50_over_baseline"] = round(result["p50_ms"] / max(result["baseline_pk_lookup_p50_ms"], 1e-6), 1)
    Path(out_path).write_text(json.dumps(result))


# --- the driver ----------------------------------------------------------------------------------

def _pg_admin_url() -> str:
    return os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")


def run_backend(backend: str, chunks: int, queries: int, workdir: Path) -> dict:
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
        subprocess.run([sys.executable, __file__, "--worker", "--chunks", str(chunks), "--queries", str(queries),
                        "--out", str(out)], env=env, cwd=ROOT, check=True)
        return json.loads(out.read_text())
    finally:
        if dropper is not None:
            dropper()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10,000 chunks instead of 100,000")
    parser.add_argument("--json", metavar="PATH", help="write the results here")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--chunks", type=int)
    parser.add_argument("--queries", type=int)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    chunks = args.chunks or (10_000 if args.quick else 100_000)
    queries = args.queries or (200 if args.quick else 500)
    if args.worker:
        worker(chunks, queries, args.out)
        return 0
    results = {}
    with tempfile.TemporaryDirectory(prefix="tk-bench-") as tmp:
        for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
            print(f"{backend}: building {chunks:,} chunks and running {queries} searches…", flush=True)
            results[backend] = run_backend(backend, chunks, queries, Path(tmp))
    print()
    header = f"{'backend':<10} {'chunks':>8} {'docs/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} " \
             f"{'p99 all/dataset/filter':>24} {'p50/baseline':>13}"
    print(header)
    print("-" * len(header))
    for backend, r in results.items():
        scopes = "/".join(f"{r['by_scope_p99_ms'].get(k, 0):.1f}" for k in ("all", "dataset", "filter"))
        print(f"{backend:<10} {r['chunks']:>8,} {r['ingest_docs_per_s']:>8,.0f} {r['p50_ms']:>8.2f} "
              f"{r['p99_ms']:>8.2f} {r['max_ms']:>8.2f} {scopes:>24} {r['p50_over_baseline']:>12.1f}x")
    summary = {"chunks": chunks, "target_p99_ms": TARGET_P99_MS}
    for backend, r in results.items():
        key = "postgres" if backend.startswith("postgres") else backend
        summary[f"{key}_p50_ms"] = r["p50_ms"]
        summary[f"{key}_p99_ms"] = r["p99_ms"]
        summary[f"{key}_ingest_docs_per_s"] = r["ingest_docs_per_s"]
    if results:
        summary["ingest_docs_per_s"] = min(r["ingest_docs_per_s"] for r in results.values())
    summary["details"] = results
    met = all(r["p99_ms"] <= TARGET_P99_MS for r in results.values())
    print(f"\ntarget p99 <= {TARGET_P99_MS:g} ms: {'met' if met else 'MISSED'}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
