#!/usr/bin/env python
"""Decision time of the permission engine as a tenant's rules grow (issue 3, point 8).

In-process, no database (Django is set up only to load the engine's module): rules are plain objects
compiled into `approvals.engine.RuleIndex`, and each
query is one `approvals.engine.decide(...)` — the same function the call pipeline, `rules/evaluate` and the
console simulator use. One tenant with 100 / 1k / 10k / 100k rules in a realistic mix (exact tool names,
MCP server globs, argument globs, agent- and user-scoped rules, a few tenant-wide globs), queried with calls
that hit and miss. Prints a table; `--json PATH` writes the figures.

    python bench/policy.py [--quick] [--json PATH]

Targets: p50 at 10k rules ≤ 50 µs, and p50(100k) / p50(100) ≤ 2 (flat as rules grow). The baseline of the
growth ratio is measured in the same run; a brute-force loop over all rules at 1k is printed for contrast.

Long arguments: `long_arg_p99_ms` is the decision for a 64 KB argument (words and runs of white space) against
1,000 argument-glob rules on the same tool (`git * --force` and the like), none of which matches, so every
rule looks at the whole argument. Target ≤ 10 ms; it is printed beside the p99 of short arguments at 1k rules
from the same run.
"""
import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

import django  # noqa: E402

# The engine module loads the policy version's model; Django is set up for that alone (no database is used).
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolkeeper.settings")
django.setup()

from approvals.engine import RuleIndex, compile_rule, decide  # noqa: E402

SIZES = (100, 1_000, 10_000, 100_000)
COMMANDS = ["git status", "git push origin main", "git push --force", "rm -rf /tmp/x", "ls -la", "kubectl get pods",
            "kubectl delete pod api prod", "make deploy", "gitx", "cat /etc/passwd"]
ARG_GLOBS = ["git *", "git push *", "rm *", "* --force", "ls", "kubectl * prod", "make *", "cat /etc/*"]
PATHS = ["/etc/*", "/home/*", "/var/log/*", "*.pem"]


def tenant_shape(n: int) -> dict:
    """How many distinct tools, MCP servers and agents a tenant with n rules has."""
    return {"tools": max(20, n // 5), "servers": max(4, n // 50), "agents": max(5, n // 200), "users": max(5, n // 100)}


def make_rules(n: int, rng: random.Random) -> list:
    shape = tenant_shape(n)
    rules = []

    def add(behavior, tool_pattern, *, arg_match=None, agents=(), users=(), priority=0):
        rules.append(SimpleNamespace(
            id=len(rules) + 1, behavior=behavior, tool_pattern=tool_pattern, priority=priority,
            arg_match=arg_match or {}, agents=list(agents), users=list(users), queue_id=None, note="",
        ))

    # a few tenant-wide rules every tenant has
    add("deny", "*", arg_match={"command": "* --no-verify"})
    add("ask", "mcp__*", users=["intern@example.com"])
    add("deny", "mcp__*__delete_*")
    while len(rules) < n:
        kind = rng.random()
        tool = f"tool_{rng.randrange(shape['tools'])}"
        server = f"mcp__srv{rng.randrange(shape['servers'])}__"
        behavior = rng.choice(["allow", "allow", "allow", "ask", "deny"])
        priority = rng.choice([0, 0, 0, 10, -5])
        if kind < 0.30:  # exact tool names
            add(behavior, tool, priority=priority)
        elif kind < 0.45:  # a whole MCP server
            add(rng.choice(["allow", "ask"]), server + "*", priority=priority)
        elif kind < 0.55:  # part of a server's tools
            add(behavior, server + rng.choice(["get_*", "list_*", "create_*", "update_*"]), priority=priority)
        elif kind < 0.80:  # argument globs
            arg = {"command": rng.choice(ARG_GLOBS)} if rng.random() < 0.7 else {"path": rng.choice(PATHS)}
            add(behavior, tool if rng.random() < 0.8 else server + "*", arg_match=arg, priority=priority)
        elif kind < 0.95:  # agent-scoped
            agents = [f"agent-{rng.randrange(shape['agents'])}"]
            add(behavior, tool if rng.random() < 0.7 else server + "*", agents=agents, priority=priority)
        else:  # user-scoped
            add(behavior, tool, users=[f"user{rng.randrange(shape['users'])}@example.com"], priority=priority)
    return rules


def make_queries(n_rules: int, count: int, rng: random.Random) -> list[dict]:
    shape = tenant_shape(n_rules)
    queries = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.45:  # a tool that has rules
            tool = f"tool_{rng.randrange(shape['tools'])}"
        elif kind < 0.75:  # an MCP server's tool
            tool = f"mcp__srv{rng.randrange(shape['servers'])}__" + rng.choice(
                ["get_issue", "list_repos", "create_pr", "update_file", "delete_branch", "search"])
        elif kind < 0.90:  # a tool no rule names (a miss)
            tool = f"untouched_{rng.randrange(1000)}"
        else:  # an MCP server without rules
            tool = f"mcp__elsewhere{rng.randrange(50)}__do_thing"
        effective_input = {"command": rng.choice(COMMANDS)}
        if rng.random() < 0.3:
            effective_input["path"] = rng.choice(["/etc/hosts", "/home/a/notes", "/tmp/x", "key.pem"])
        queries.append({
            "tool_name": tool, "effective_input": effective_input,
            "agent": f"agent-{rng.randrange(shape['agents'] + 5)}",
            "user": f"user{rng.randrange(shape['users'] + 5)}@example.com" if rng.random() < 0.8 else "",
            "read_only_trusted": rng.random() < 0.1, "auto_allow_read_only": True, "default_behavior": "ask",
        })
    return queries


LONG_ARG_CHARS = 65_536
# Each rule's glob is its own (numbered), so no rule reuses another's work; a quarter look for a word inside.
LONG_ARG_GLOBS = ["git * --force{n}", "git push * --force{n}", "* --no-verify{n}", "rm * /srv/{n}", "kubectl * prod{n}",
                  "make * deploy{n}", "* --force{n} *", "curl * | sh{n}", "cat /etc/{n}*", "*.pem{n}", "sudo{n} *",
                  "git * origin{n} * --force *", "git * --force-with-lease main{n}", "* main{n} *"]


def long_arg_rules(rng: random.Random) -> list:
    rules = []
    while len(rules) < 1_000:
        globs = [glob.format(n=len(rules)) for glob in rng.sample(LONG_ARG_GLOBS, rng.choice([1, 1, 2]))]
        rules.append(SimpleNamespace(
            id=len(rules) + 1, behavior=rng.choice(["deny", "ask", "allow"]), tool_pattern="shell",
            priority=rng.choice([0, 0, 10]), arg_match={"command": globs if len(globs) > 1 else globs[0]},
            agents=[], users=[], queue_id=None, note="",
        ))
    return rules


def long_arguments(rng: random.Random) -> list[str]:
    """64 KB commands that start like the globs and match none: a white space run after `git`, and words."""
    spaces = " \t\n  "
    texts = ["git" + " " * (LONG_ARG_CHARS - 3), "git" + (spaces * LONG_ARG_CHARS)[:LONG_ARG_CHARS - 3]]
    words = ["git", "push", "origin", "--force-with-lease", "main", "--forced", "/etc", "x" * 30, "|", "sh"]
    for _ in range(4):
        parts, size = ["git"], 3
        while size < LONG_ARG_CHARS - 40:
            part = rng.choice(words) + rng.choice([" ", " ", "  ", "\t", "\n "])
            parts.append(part)
            size += len(part)
        texts.append("".join(parts) + "done")
    return texts


def time_long_arguments(count: int, rng: random.Random) -> list[float]:
    """Decisions for 64 KB arguments against 1,000 argument-glob rules (ms)."""
    index = RuleIndex(long_arg_rules(rng))
    queries = [{"tool_name": "shell", "effective_input": {"command": text}, "agent": "a", "user": "",
                "read_only_trusted": False, "auto_allow_read_only": True, "default_behavior": "ask"}
               for text in long_arguments(rng)]
    for query in queries:  # warm-up: globs compiled
        assert decide(index, **query).rule is None  # no rule matches: every rule looks at the whole argument
    times = []
    gc.disable()
    try:
        for number in range(count):
            start = time.perf_counter_ns()
            decide(index, **queries[number % len(queries)])
            times.append((time.perf_counter_ns() - start) / 1e6)
    finally:
        gc.enable()
    return sorted(times)


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def time_pass(index, queries: list[dict], into: list[float]) -> None:
    """One pass over the queries, each decision timed on its own (µs)."""
    clock = time.perf_counter_ns
    for query in queries:
        start = clock()
        decide(index, **query)
        into.append((clock() - start) / 1000)


def brute_force_decide(compiled: list, *, tool_name, effective_input, agent, user, read_only_trusted,
                       auto_allow_read_only, default_behavior):
    """The baseline: look at every rule."""
    matched = [r for r in compiled if r.matches(tool_name=tool_name, effective_input=effective_input, agent=agent,
                                                user=user)]
    matched.sort(key=lambda r: r.sort_key)
    if matched and matched[0].behavior in ("deny", "ask"):
        return matched[0].behavior
    if read_only_trusted and auto_allow_read_only:
        return "allow"
    return "allow" if matched else default_behavior


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer queries (about 10 s)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    rng = random.Random(20261129)
    n_queries, rounds = (2_000, 3) if args.quick else (5_000, 8)

    built = {}
    for size in SIZES:
        rules = make_rules(size, rng)
        started = time.perf_counter()
        index = RuleIndex(rules)
        build_ms = (time.perf_counter() - started) * 1000
        queries = make_queries(size, n_queries, rng)
        for query in queries:  # warm-up: compiled globs cached, memory touched
            decide(index, **query)
        built[size] = (index, queries, build_ms, [])
    # Sizes are measured in interleaved rounds, so a busy machine slows every size alike and the growth
    # ratio compares like with like.
    gc.disable()
    try:
        for _ in range(rounds):
            for index, queries, _build, times in built.values():
                time_pass(index, queries, times)
    finally:
        gc.enable()

    results = {}
    print(f"{'rules':>8} {'build ms':>9} {'candidates':>10} {'p50 µs':>8} {'p99 µs':>8} {'mean µs':>8}  decisions")
    for size, (index, queries, build_ms, times) in built.items():
        times.sort()
        candidates = statistics.mean(len(index.candidates(q["tool_name"])) for q in queries)
        behaviors: dict[str, int] = {}
        for query in queries:
            decision = decide(index, **query)
            key = decision.behavior + ("" if decision.rule else "*")
            behaviors[key] = behaviors.get(key, 0) + 1
        results[size] = {
            "rules": size, "build_ms": round(build_ms, 1), "mean_candidates": round(candidates, 1),
            "p50_us": round(percentile(times, 0.50), 2), "p99_us": round(percentile(times, 0.99), 2),
            "mean_us": round(statistics.fmean(times), 2), "decisions": len(times), "behaviors": behaviors,
        }
        row = results[size]
        mix = " ".join(f"{k}:{v}" for k, v in sorted(behaviors.items()))
        print(f"{size:>8} {row['build_ms']:>9} {row['mean_candidates']:>10} {row['p50_us']:>8} {row['p99_us']:>8} "
              f"{row['mean_us']:>8}  {mix}")
    print("(behavior* = decided without a rule: the tenant default or read-only auto-allow)")

    # the baseline an index avoids: every rule looked at, at 1k rules
    baseline_rules = [compile_rule(r) for r in make_rules(1_000, rng)]
    baseline_queries = make_queries(1_000, 300 if args.quick else 1_000, rng)
    naive = []
    for query in baseline_queries:
        start = time.perf_counter_ns()
        brute_force_decide(baseline_rules, **query)
        naive.append((time.perf_counter_ns() - start) / 1000)
    naive.sort()
    naive_p50 = round(percentile(naive, 0.5), 2)

    long_times = time_long_arguments(60 if args.quick else 300, rng)
    long_p50, long_p99 = round(percentile(long_times, 0.5), 3), round(percentile(long_times, 0.99), 3)

    growth = round(results[100_000]["p50_us"] / results[100]["p50_us"], 2)
    summary = {
        "p50_us_10k": results[10_000]["p50_us"], "p99_us_10k": results[10_000]["p99_us"],
        "growth_100k_over_100": growth, "naive_p50_us_1k": naive_p50,
        "long_arg_p50_ms": long_p50, "long_arg_p99_ms": long_p99,
        "short_arg_p99_ms_1k": results[1_000]["p99_us"] / 1000,
        "targets": {"p50_us_10k": 50, "growth_100k_over_100": 2, "long_arg_p99_ms": 10},
        "sizes": {str(k): v for k, v in results.items()}, "quick": args.quick, "python": sys.version.split()[0],
    }
    print()
    print(f"p50 at 10k rules: {summary['p50_us_10k']} µs (target ≤ 50)   p99: {summary['p99_us_10k']} µs")
    print(f"growth p50(100k)/p50(100): {growth} (target ≤ 2)")
    print(f"brute force over 1k rules, p50: {naive_p50} µs (what the index avoids)")
    print()
    print(f"{'argument':>10} {'rules':>6} {'p50 ms':>8} {'p99 ms':>8}")
    print(f"{'short':>10} {1000:>6} {results[1_000]['p50_us'] / 1000:>8.3f} {results[1_000]['p99_us'] / 1000:>8.3f}")
    print(f"{'64 KB':>10} {1000:>6} {long_p50:>8.3f} {long_p99:>8.3f}   (every rule an argument glob on the tool)")
    print(f"long_arg_p99_ms: {long_p99} ms (target ≤ 10)")
    ok = summary["p50_us_10k"] <= 50 and growth <= 2 and long_p99 <= 10
    print("targets met" if ok else "TARGET MISSED")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
