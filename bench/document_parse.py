#!/usr/bin/env python
"""What reading a tenant's OpenAPI document costs, hostile shapes against a realistic document of the same size.

In-process, no database (Django is set up only to import the reader). Every document is read as
`POST /api/v1/http-tools/import` reads it: `tools.http_tools.services.openapi_parse`, which is
`common.documents.document_parse` with the import's bounds (IMPORT_MAX_BYTES, IMPORT_MAX_NODES, nesting
64) and the OpenAPI checks. The baseline is a realistic generated OpenAPI 3 document (resources with CRUD
operations, parameters, bodies, responses, described component schemas) of about the size limit, in YAML and
in JSON, measured in the same run; each hostile document is near the size limit too:

- flow nesting `[[[…`, `{a: {a: …`, block nesting `- - - …` and indented mappings (the shapes that were
  quadratic: 10 KB of `[` took seconds), the issue's 10 KB reproduction;
- many tiny nodes (`[1,1,1,…]`, `- 1` lines), long keys, many anchors, JSON nesting and tiny JSON nodes;

- many values that each cost the most to build: empty lists, tiny mappings, distinct ints, floats and dates.

Each is timed (CPU seconds, best of N) with libyaml's parser (the default when PyYAML has it) and with PyYAML's
pure-Python parser (the fallback, under the same bounds). Prints a table; writes JSON (--json PATH, by default
bench/results/document_parse.json). Target, with libyaml: every document, hostile or not, read or refused in
well under a second (≤ 0.5 s CPU). The ratio to the realistic document of the same format says how much more
work a hostile document buys than a legitimate one of its size (about 4× at most: the dearest, 1 MiB of
empty lists, is two of libyaml's events a value, and about half its cost is libyaml making them).

    .venv/bin/python bench/document_parse.py [--quick] [--json PATH]
"""
import argparse
import contextlib
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

import django  # noqa: E402

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolkeeper.settings")
django.setup()

import yaml  # noqa: E402

from common import documents  # noqa: E402
from common.errors import ServiceError  # noqa: E402
from tools.http_tools.services import IMPORT_MAX_BYTES, IMPORT_MAX_NODES, openapi_parse  # noqa: E402

TARGET_S = 0.5
WORDS = ["account", "project", "issue", "comment", "label", "user", "team", "repository", "release", "asset",
         "hook", "event", "key", "token", "status", "state", "created", "updated", "name", "description", "owner",
         "visibility", "default", "branch", "commit", "tag", "page", "sort", "direction", "since", "before",
         "after", "filter", "query", "returns", "list", "single", "resource", "identifier", "unique"]


# --- a realistic document ----------------------------------------------------------------------------

def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def _resource(rng: random.Random, n: int) -> tuple[str, dict, dict]:
    name = f"{rng.choice(WORDS)}{n}"
    schema_name = name.capitalize()
    properties = {}
    for index in range(rng.randint(5, 15)):
        kind = rng.choice(["string", "integer", "boolean", "enum", "array", "date"])
        prop = {"description": _sentence(rng, rng.randint(4, 14))}
        if kind == "enum":
            prop.update(type="string", enum=[rng.choice(WORDS) for _ in range(rng.randint(2, 5))])
        elif kind == "array":
            prop.update(type="array", items={"type": "string"})
        elif kind == "date":
            prop.update(type="string", format="date-time", example="2024-01-01T00:00:00Z")
        else:
            prop["type"] = kind
            if kind == "string":
                prop["maxLength"] = rng.choice([64, 255, 1000])
        properties[f"{rng.choice(WORDS)}_{index}"] = prop
    schema = {"type": "object", "properties": properties, "required": list(properties)[:2]}
    ref = {"$ref": f"#/components/schemas/{schema_name}"}

    def error():
        return {"description": "Error", "content": {"application/json": {"schema": {
            "type": "object", "properties": {"message": {"type": "string"}, "code": {"type": "integer"}}}}}}

    def answer(description, body):
        return {"description": description, "content": {"application/json": {"schema": body}}}

    paths = {
        f"/{name}s": {
            "get": {"operationId": f"list{schema_name}", "summary": _sentence(rng, 6), "tags": [name],
                    "description": _sentence(rng, 20),
                    "parameters": [{"$ref": "#/components/parameters/page"},
                                   {"name": "sort", "in": "query", "description": _sentence(rng, 8),
                                    "schema": {"type": "string", "enum": ["created", "updated"]}}],
                    "responses": {"200": answer("OK", {"type": "array", "items": dict(ref)}), "404": error()}},
            "post": {"operationId": f"create{schema_name}", "summary": _sentence(rng, 6), "tags": [name],
                     "requestBody": {"required": True, "content": {"application/json": {"schema": dict(ref)}}},
                     "responses": {"201": answer("Created", dict(ref)), "422": error()}}},
        f"/{name}s/{{id}}": {
            "parameters": [{"name": "id", "in": "path", "required": True, "schema": {"type": "integer"},
                            "description": _sentence(rng, 6)}],
            "get": {"operationId": f"get{schema_name}", "summary": _sentence(rng, 6), "tags": [name],
                    "responses": {"200": answer("OK", dict(ref)), "404": error()}},
            "delete": {"operationId": f"delete{schema_name}", "summary": _sentence(rng, 6), "tags": [name],
                       "responses": {"204": {"description": "Deleted"}, "404": error()}}},
    }
    return schema_name, schema, paths


def realistic(resources: int, seed: int = 1) -> dict:
    rng = random.Random(seed)
    document = {"openapi": "3.0.3", "info": {"title": "Generated API", "version": "1.0.0",
                                             "description": _sentence(rng, 30)},
                "servers": [{"url": "https://api.example.com/v1"}], "paths": {},
                "components": {"schemas": {}, "parameters": {"page": {
                    "name": "page", "in": "query", "description": "Page number.",
                    "schema": {"type": "integer", "minimum": 1, "default": 1}}}}}
    for n in range(resources):
        schema_name, schema, paths = _resource(rng, n)
        document["components"]["schemas"][schema_name] = schema
        document["paths"].update(paths)
    return document


def render(document: dict, form: str) -> str:
    if form == "json":
        return json.dumps(document, indent=2)
    dumper = yaml.CSafeDumper if documents.CParser is not None else yaml.SafeDumper
    return yaml.dump(document, Dumper=dumper, sort_keys=False, width=120)


def realistic_text(form: str, limit: int) -> str:
    """The largest realistic document of `form` within `limit` bytes."""
    per_resource = len(render(realistic(20), form).encode()) / 20
    resources = int(limit / per_resource)
    while True:
        text = render(realistic(resources), form)
        if len(text.encode()) <= limit:
            return text
        resources -= max(1, resources // 100)


def nodes_of(value) -> int:
    if isinstance(value, dict):
        return 1 + sum(1 + nodes_of(item) for item in value.values())
    if isinstance(value, list):
        return 1 + sum(nodes_of(item) for item in value)
    return 1


# --- hostile documents ---------------------------------------------------------------------------------

def hostile(limit: int) -> dict[str, str]:
    head = "openapi: 3.0.0\npaths: {}\nx: "
    room = limit - len(head) - 16
    repro = "openapi: 3.0.0\nx: " + "[" * 5000 + "]" * 5000
    return {
        "issue's 10 KB [[[ (YAML)": repro,
        "flow [[[ (YAML)": head + "[" * (room // 2) + "]" * (room // 2),
        "flow {a: {a: (YAML)": head + "{a: " * (room // 5) + "1" + "}" * (room // 5),
        "block - - - (YAML)": "openapi: 3.0.0\npaths: {}\nx:\n  " + "- " * (room // 2) + "1",
        "indented mappings (YAML)": head.rstrip() + "\n" + "".join(" " * (i + 1) + "a:\n" for i in range(1400)),
        "tiny [1,1,1 (YAML)": head + "[" + "1," * (room // 2) + "1]",
        "tiny - 1 lines (YAML)": "openapi: 3.0.0\npaths: {}\nx:\n" + "- 1\n" * (room // 4),
        "empty lists [[],[] (YAML)": head + "[" + "[]," * (room // 3) + "[]]",
        "tiny maps {a: 1} (YAML)": head + "[" + "{a: 1}," * (room // 7) + "{a: 1}]",
        "distinct ints (YAML)": head + "[" + ",".join(str(n) for n in range(room // 7)) + "]",
        "distinct floats (YAML)": head + "[" + ",".join(f"{n}.5" for n in range(room // 9)) + "]",
        "distinct dates (YAML)": head + "[" + ",".join(
            f"{1000 + n // 336}-{1 + n // 28 % 12:02}-{1 + n % 28:02}" for n in range(room // 11)) + "]",
        "long keys (YAML)": head.rstrip() + "\n" + "".join(f"  {i:0>1000}: 1\n" for i in range(room // 1010)),
        "anchors (YAML)": head.rstrip() + "\n" + "".join(f"  a{i}: &a{i} 1\n" for i in range(room // 20)),
        "nesting [[[ (JSON)": '{"openapi": "3.0.0", "paths": {}, "x": ' + "[" * (room // 2) + "]" * (room // 2) + "}",
        "tiny [1,1,1 (JSON)": '{"openapi": "3.0.0", "paths": {}, "x": [' + "1," * (room // 2) + "1]}",
    }


# --- measuring ---------------------------------------------------------------------------------------------

def outcome(text: str) -> str:
    try:
        openapi_parse(text)
    except ServiceError as exc:
        return "refused: " + " ".join(exc.fields["document"])[:70]
    return "read"


def best_of(text: str, rounds: int) -> float:
    """CPU seconds of this process (the machine may be shared: CPU time is the cost, wall time would add the
    waits for a core), the best of `rounds`."""
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        with contextlib.suppress(ServiceError):
            openapi_parse(text)
        best = min(best, time.process_time() - started)
    return best


def measure(texts: dict[str, str], rounds: int, parser: str) -> dict:
    saved = documents.CParser
    if parser == "python":
        documents.CParser = None
    try:
        return {name: {"bytes": len(text.encode()), "outcome": outcome(text), "seconds": best_of(text, rounds)}
                for name, text in texts.items()}
    finally:
        documents.CParser = saved


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round each, no pure-Python pass")
    parser.add_argument("--json", metavar="PATH", default=str(ROOT / "bench" / "results" / "document_parse.json"),
                        help="where to write the results as JSON")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else 3

    print(f"libyaml: {'yes' if documents.CParser is not None else 'no'}; size limit {IMPORT_MAX_BYTES} bytes, "
          f"at most {IMPORT_MAX_NODES} values, nesting 64", flush=True)
    baselines = {f"realistic OpenAPI ({form.upper()})": realistic_text(form, IMPORT_MAX_BYTES)
                 for form in ("yaml", "json")}
    node_counts = {name: nodes_of(json.loads(json.dumps(yaml.load(text, Loader=yaml.CSafeLoader))))
                   for name, text in baselines.items()}
    texts = {**baselines, **hostile(IMPORT_MAX_BYTES)}
    parsers = ["libyaml", "python"] if documents.CParser is not None and not args.quick else \
        ["libyaml" if documents.CParser is not None else "python"]
    results = {name: measure(texts, rounds, name) for name in parsers}

    header = f"{'document':<28} {'bytes':>9} " + " ".join(f"{p + ' ms':>12} {'ratio':>6}" for p in parsers) + \
        "  outcome"
    print(header)
    print("-" * len(header))
    verdicts = []
    for name in texts:
        form = "JSON" if name.endswith("(JSON)") else "YAML"
        base = f"realistic OpenAPI ({form})"
        cells = []
        for p in parsers:
            seconds = results[p][name]["seconds"]
            ratio = seconds / results[p][base]["seconds"]
            results[p][name]["ratio_to_baseline"] = ratio
            cells.append(f"{seconds * 1000:>12.1f} {ratio:>6.2f}")
        first = results[parsers[0]][name]
        print(f"{name:<28} {first['bytes']:>9} " + " ".join(cells) + f"  {first['outcome'][:60]}")
        verdicts.append(first["seconds"] <= TARGET_S)
    for name, count in node_counts.items():
        print(f"{name}: {count} values (the bound: {IMPORT_MAX_NODES})")
    ok = all(verdicts)
    worst = max((results[parsers[0]][name]["ratio_to_baseline"], name) for name in texts if name not in baselines)
    print(f"target (≤ {TARGET_S} s CPU each, {parsers[0]}): {'ok' if ok else 'MISSED'}; the dearest hostile "
          f"document: {worst[0]:.1f}× the realistic one ({worst[1]})")

    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "target": {"seconds": TARGET_S}, "met": ok, "worst_ratio_to_baseline": worst[0], "parsers": results,
        "realistic_values": node_counts,
        "bounds": {"bytes": IMPORT_MAX_BYTES, "values": IMPORT_MAX_NODES, "nesting": 64},
        "config": {"quick": args.quick, "rounds": rounds, "python": platform.python_version(),
                   "pyyaml": yaml.__version__, "libyaml": documents.CParser is not None},
    }, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
