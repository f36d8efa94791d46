"""Run Schemathesis against a live Toolkeeper and hand back what it found, departures set apart.

Plain Python (no pytest), so a run can be repeated by hand against any server:

    .venv/bin/python -m tests.fuzz.schemathesis_run http://127.0.0.1:8000 <agent key> <admin key> \
        [--seed N] [--max-examples N]

Another seed draws other requests: a departure that holds only for the suite's seed is too wide or too
narrow, so try a few before trusting a change to departures.toml.

Determinism: one worker, Schemathesis's deterministic generation and a fixed seed, a bounded number
of examples per operation. The objects the fuzzer may reach by id (sessions, calls, tools, groups,
…) are made before the run and offered to it as dictionaries of real values (half of the draws), so
the operations get past the 404; everything the run creates comes from the same sequence of requests
in the same order, so the state it meets is the same from one run to the next.
"""
from __future__ import annotations

import argparse
import base64
import json
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
DEPARTURES = HERE / "departures.toml"
SEED = 20260101
MAX_EXAMPLES = 10  # per operation, in the fuzzing phase; the coverage phase adds its own bounded set
REAL_VALUE_PROBABILITY = 0.5
REQUEST_TIMEOUT_S = 75  # `wait` may hold an answer for 60 s


@dataclass(frozen=True)
class Finding:
    """One failed check of one request."""

    key: str  # which API key ran it: "agent" or "admin"
    operation: str  # "POST /api/v1/sessions"
    check: str  # "not_a_server_error", "positive_data_acceptance", …
    title: str
    status: int | None
    request_body: str
    response_body: str
    curl: str

    @property
    def error(self) -> dict:
        try:
            error = json.loads(self.response_body).get("error")
        except (ValueError, AttributeError):
            return {}
        return error if isinstance(error, dict) else {}

    def describe(self) -> str:
        return (f"[{self.key}] {self.operation}: {self.check} ({self.title}) → {self.status}\n"
                f"    response: {self.response_body[:400]}\n    {self.curl[:600]}")


@dataclass
class Departure:
    """A known way the API departs from its document, and why that is accepted (tests/fuzz/departures.toml)."""

    reason: str
    check: str
    operations: list[str] = field(default_factory=list)  # empty: every operation
    status: int | None = None
    error_fields: list[str] = field(default_factory=list)  # the error names only (some of) these fields
    message: str = ""  # a regular expression the response body must contain
    request: str = ""  # a regular expression the request body must contain
    used: int = 0

    def covers(self, finding: Finding) -> bool:
        if finding.check != self.check:
            return False
        if self.operations and finding.operation not in self.operations:
            return False
        if self.status is not None and finding.status != self.status:
            return False
        if self.error_fields:
            fields = finding.error.get("fields")
            if not isinstance(fields, dict) or not fields or not set(fields) <= set(self.error_fields):
                return False
        if self.message and not re.search(self.message, finding.response_body):
            return False
        return not self.request or bool(re.search(self.request, finding.request_body))


def load_departures(path: Path = DEPARTURES) -> list[Departure]:
    entries = tomllib.loads(path.read_text())["departure"]
    departures = [Departure(**entry) for entry in entries]
    for departure in departures:
        if not departure.reason.strip():
            raise ValueError(f"a departure without a reason: {departure}")
    return departures


@dataclass
class RunResult:
    key: str
    findings: list[Finding]
    cases: int
    errors: list[str]
    seconds: float
    output: str


# --- the objects the fuzzer may reach ---------------------------------------------------------------

def prepare(url: str, agent_key: str, admin_key: str) -> dict[str, list]:
    """Create what the fuzzer should find, and return the dictionaries of real values it draws from."""
    with (httpx.Client(base_url=url, headers={"Authorization": f"Bearer {agent_key}"}, timeout=30) as agent,
          httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=30) as admin):
        def ok(response: httpx.Response) -> dict:
            if response.status_code >= 300:
                raise RuntimeError(f"{response.request.method} {response.request.url}: {response.status_code} "
                                   f"{response.text[:500]}")
            return response.json()

        def ids(path: str) -> list:
            return [item["id"] for item in ok(admin.get(path, params={"limit": 500}))["results"]]

        session = ok(agent.post("/api/v1/sessions", json={"agent": "fuzz-bot", "user": "fuzz@example.com"}))
        done = ok(agent.post(f"/api/v1/sessions/{session['id']}/calls",
                             json={"calls": [{"id": "fuzz_done", "name": "current_time", "input": {}}], "wait": 10}))
        # A call that waits for a reviewer: an ask rule for one agent only, so fuzzed sessions are not affected.
        ok(admin.post("/api/v1/rules", json={"behavior": "ask", "tool_pattern": "todo_write", "agents": ["fuzz-asker"],
                                             "note": "made for the fuzz run"}))
        asker = ok(agent.post("/api/v1/sessions", json={"agent": "fuzz-asker"}))
        asked = ok(agent.post(f"/api/v1/sessions/{asker['id']}/calls", json={
            "id": "fuzz_asked", "name": "todo_write",
            "input": {"todos": [{"content": "answer the fuzzer", "status": "pending"}]}}))
        if asked["calls"][0]["status"] != "awaiting_approval":
            raise RuntimeError(f"the ask rule did not ask: {asked}")
        # A call that waits for its session's user: a confirm rule, also for one agent only.
        ok(admin.post("/api/v1/rules", json={"behavior": "confirm", "tool_pattern": "todo_write",
                                             "agents": ["fuzz-confirmer"], "note": "made for the fuzz run"}))
        confirmer = ok(agent.post("/api/v1/sessions", json={"agent": "fuzz-confirmer"}))
        questioned = ok(agent.post(f"/api/v1/sessions/{confirmer['id']}/calls", json={
            "id": "fuzz_questioned", "name": "todo_write",
            "input": {"todos": [{"content": "confirm for the fuzzer", "status": "pending"}]}}))
        if questioned["calls"][0]["status"] != "awaiting_user":
            raise RuntimeError(f"the confirm rule did not ask: {questioned}")
        tools = ok(admin.get("/api/v1/tools", params={"limit": 500}))["results"]
        queues = ok(admin.get("/api/v1/queues", params={"limit": 500}))["results"]
        datasets = ok(admin.get("/api/v1/datasets", params={"limit": 500}))["results"]
        return {
            "sessions": [session["id"], asker["id"], confirmer["id"]],
            "finished_calls": [call["id"] for call in done["calls"]],
            "open_calls": [asked["calls"][0]["id"]],
            "questioned_calls": [questioned["calls"][0]["id"]],
            "tools": [tool["id"] for tool in tools],
            "tool_names": [tool["name"] for tool in tools],
            "groups": ids("/api/v1/groups"),
            "bindings": ids("/api/v1/bindings"),
            "rules": ids("/api/v1/rules"),
            "queues": [queue["id"] for queue in queues],
            "queue_names": [queue["name"] for queue in queues],
            "approvals": ids("/api/v1/approvals"),
            "datasets": [dataset["id"] for dataset in datasets],
            "dataset_names": [dataset["name"] for dataset in datasets],
            "documents": ids("/api/v1/documents"),
            "members": ["operator", "reviewer"],
        }


# Which dictionary feeds which parameter: (tag of the operations, parameter, dictionary).
BINDINGS = [
    ("sessions", "path.session_id", "sessions"),
    ("calls", "path.call_id", "finished_calls"),
    ("tools", "path.id", "tools"),
    ("groups", "path.id", "groups"),
    ("groups", "body.tools[*]", "tool_names"),
    ("bindings", "path.id", "bindings"),
    ("bindings", "body.tool", "tool_names"),
    ("rules", "path.id", "rules"),
    ("rules", "body.queue", "queue_names"),
    ("rules", "body.tool", "tool_names"),
    ("queues", "path.id", "queues"),
    ("queues", "body.reviewers[*]", "members"),
    ("queues", "body.escalation_reviewers[*]", "members"),
    ("approvals", "path.id", "approvals"),
    ("datasets", "path.id", "datasets"),
    ("documents", "path.id", "documents"),
    ("documents", "body.dataset", "dataset_names"),
]


def _toml(value) -> str:
    return json.dumps(value)  # the ASCII-only JSON of strings, numbers and lists is TOML too


def config_text(dictionaries: dict[str, list], seed: int = SEED, max_examples: int = MAX_EXAMPLES) -> str:
    # Hypothesis's health checks judge the speed of generation, which depends on the machine's load.
    lines = [f"seed = {seed}", "workers = 1", f"request-timeout = {REQUEST_TIMEOUT_S}",
             'suppress-health-check = ["all"]', "",
             "[generation]", "deterministic = true", f"max-examples = {max_examples}", "database = \"none\"", "",
             "[checks]", "enabled = true", ""]
    for name, values in dictionaries.items():
        if values:
            lines += [f"[dictionaries.{name}]", f"values = {_toml(values)}", ""]
    # The answer to a call's question: the one call that waits for its user (answered once, then 409).
    # Before the blocks by tag: of the blocks naming an operation's parameters, the first decides.
    if dictionaries.get("questioned_calls"):
        lines += ["[[operations]]", 'include-path-regex = "/answer$"', "[operations.parameters]",
                  f'"path.call_id" = {{ dictionary = "questioned_calls", probability = {REAL_VALUE_PROBABILITY} }}',
                  ""]
    by_tag: dict[str, list[tuple[str, str]]] = {}
    for tag, parameter, dictionary in BINDINGS:
        if dictionaries.get(dictionary):
            by_tag.setdefault(tag, []).append((parameter, dictionary))
    for tag, parameters in by_tag.items():
        lines += ["[[operations]]", f"include-tag = {_toml(tag)}", "[operations.parameters]"]
        lines += [f'"{parameter}" = {{ dictionary = {_toml(dictionary)}, probability = {REAL_VALUE_PROBABILITY} }}'
                  for parameter, dictionary in parameters]
        lines.append("")
    # The external result of a call that waits for one: the one open call, and finished ones (409).
    if dictionaries.get("open_calls"):
        lines += ["[[operations]]", 'include-path-regex = "/result$"', "[operations.parameters]",
                  f'"path.call_id" = {{ dictionary = "open_calls", probability = {REAL_VALUE_PROBABILITY} }}', ""]
    return "\n".join(lines)


# --- running -----------------------------------------------------------------------------------------

# Each key fuzzes the operations it may use (x-required-scope); that others answer it 403 is tested elsewhere.
KEYS_OPERATIONS = {
    "agent": ["--exclude-by", '/x-required-scope == ["admin"]'],
    "admin": ["--exclude-by", '/x-required-scope == ["agent"]'],
}


def run(url: str, key_name: str, key: str, dictionaries: dict[str, list], workdir: Path,
        seed: int = SEED, max_examples: int = MAX_EXAMPLES) -> RunResult:
    config = workdir / f"schemathesis-{key_name}.toml"
    config.write_text(config_text(dictionaries, seed, max_examples))
    report = workdir / f"{key_name}.ndjson"
    command = [_executable(), "--config-file", str(config), "run", f"{url}/api/schema/",
               "--header", f"Authorization: Bearer {key}", "--checks", "all", "--seed", str(seed),
               "--report", "ndjson", "--report-ndjson-path", str(report), "--no-color", "--output-truncate", "true",
               *KEYS_OPERATIONS[key_name]]
    started = time.monotonic()
    completed = subprocess.run(command, capture_output=True, text=True, cwd=workdir, timeout=1800,
                               stdin=subprocess.DEVNULL)
    seconds = time.monotonic() - started
    findings, cases, errors = read_report(report, key_name)
    if not report.exists() or completed.returncode not in (0, 1):
        errors.append(f"schemathesis exited with {completed.returncode}:\n{completed.stdout[-3000:]}\n"
                      f"{completed.stderr[-3000:]}")
    return RunResult(key_name, findings, cases, errors, seconds, completed.stdout)


def _executable() -> str:
    candidate = Path(sys.executable).parent / "st"
    return str(candidate) if candidate.exists() else "st"


def _decode(content: dict | None) -> str:
    if not content:
        return ""
    if "$base64" in content:
        return base64.b64decode(content["$base64"]).decode("utf-8", "replace")
    return content.get("string", "") if isinstance(content, dict) else str(content)


def read_report(path: Path, key_name: str) -> tuple[list[Finding], int, list[str]]:
    findings: dict[tuple, Finding] = {}
    cases = 0
    errors = []
    if not path.exists():
        return [], 0, [f"no report at {path}"]
    with path.open() as lines:
        for line in lines:
            event = json.loads(line)
            kind, data = next(iter(event.items()))
            if kind in ("NonFatalError", "FatalError"):
                errors.append(json.dumps(data)[:2000])
            if kind != "ScenarioFinished":
                continue
            recorder = data.get("recorder") or {}
            cases += len(recorder.get("cases") or {})
            for case_id, checks in (recorder.get("checks") or {}).items():
                for check in checks:
                    if check.get("status") != "failure":
                        continue
                    failure = (check.get("failure_info") or {}).get("failure") or {}
                    interaction = (recorder.get("interactions") or {}).get(case_id) or {}
                    request = interaction.get("request") or {}
                    response = interaction.get("response") or {}
                    finding = Finding(
                        key=key_name, operation=failure.get("operation") or "", check=check["name"],
                        title=failure.get("title") or "", status=response.get("status_code"),
                        request_body=_decode(request.get("body")), response_body=_decode(response.get("content")),
                        curl=f"{request.get('method')} {request.get('uri')} {_decode(request.get('body'))[:300]}",
                    )
                    findings.setdefault((finding.operation, finding.check, finding.status, finding.response_body),
                                        finding)
    return list(findings.values()), cases, errors


def triage(findings: list[Finding], departures: list[Departure]) -> list[Finding]:
    """The findings no departure covers (and count the uses of each departure)."""
    unlisted = []
    for finding in findings:
        covering = next((d for d in departures if d.covers(finding)), None)
        if covering is None:
            unlisted.append(finding)
        else:
            covering.used += 1
    return unlisted


def fuzz(url: str, agent_key: str, admin_key: str, seed: int = SEED,
         max_examples: int = MAX_EXAMPLES) -> tuple[list[RunResult], list[Departure]]:
    dictionaries = prepare(url, agent_key, admin_key)
    departures = load_departures()
    with tempfile.TemporaryDirectory(prefix="tk-fuzz-") as workdir:
        results = [run(url, name, key, dictionaries, Path(workdir), seed, max_examples)
                   for name, key in (("agent", agent_key), ("admin", admin_key))]
    return results, departures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.schemathesis_run")
    parser.add_argument("url")
    parser.add_argument("agent_key")
    parser.add_argument("admin_key")
    parser.add_argument("--seed", type=int, default=SEED, help=f"the seed of the run (the suite's: {SEED})")
    parser.add_argument("--max-examples", type=int, default=MAX_EXAMPLES,
                        help=f"examples per operation (the suite's: {MAX_EXAMPLES})")
    args = parser.parse_args(argv)
    results, departures = fuzz(args.url, args.agent_key, args.admin_key, args.seed, args.max_examples)
    status = 0
    for result in results:
        unlisted = triage(result.findings, departures)
        print(f"{result.key}: {result.cases} cases in {result.seconds:.0f} s, {len(result.findings)} findings, "
              f"{len(unlisted)} not listed, {len(result.errors)} errors")
        print("\n".join(line for line in result.output.splitlines() if "(in " in line or "passed" in line))
        for finding in unlisted:
            print(finding.describe())
        for error in result.errors:
            print("ERROR", error)
        status |= bool(unlisted or result.errors)
    for departure in departures:
        print(f"departure used {departure.used}x: {departure.reason[:100]}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
