"""The statements one governed call costs, pinned per mode and database, so the path cannot grow unseen.

A governed call of `current_time` (allowed, no approval, a trivial tool) through `POST …/calls` with
`wait`, as the benchmarks send it (in the distributed test, without waiting). The local executor, when
the call may start at once, claims it in the request's own transaction (the move to `running`), so its
run writes only the result. Counted: the request's
statements (API key with the tenant's configuration versions, session, calls in flight, call counter,
the call's row written already `queued` with that event, its audit entry with the chain's head), the
run's (claim with its event, result with its event) for the local executor and for a Celery worker's
side. On PostgreSQL a status change and its event are one statement (a data-modifying WITH) that needs
no transaction of its own, and so are a new call's row and its first events; on SQLite, two.
A round trip to PostgreSQL is a statement, a BEGIN or a COMMIT (one BEGIN per commit counted here).
Changing a number here is a decision: say why in the commit.
"""
import time

import pytest
from django.db import connection

from tests.other_backend import assert_expected_vendor, run_on_other_backend
from tests.statements.trace import trace_on
from tools.calls import runtime as runtime_module
from tools.calls.executors import CeleryExecutor
from tools.calls.worker import worker_run_call
from tools.models import CallStatus, ToolCall

pytestmark = pytest.mark.django_db(transaction=True)

BODY = {"name": "current_time", "input": {}, "wait": 10}

KEY_AND_SESSION = [
    "SELECT tenancy_apikey",  # the key, its tenant and the tenant's configuration versions, in one
    "SELECT tools_agentsession",
]
SUBMISSION = [
    "SELECT tools_toolcall",  # calls in flight (the tenant has limits)
    "UPDATE tools_agentsession",  # the session's call counter
]
# the call's row, already moved to `queued`, with that event; skipped, not failed, if a generated id is taken
WRITTEN = {
    "postgresql": ["WITH INSERT INTO tools_toolcall INSERT INTO tools_callevent"],
    "sqlite": ["INSERT tools_toolcall", "INSERT tools_callevent"],
}
AUDITED = ["SELECT audit_chainhead", "INSERT audit_event", "UPDATE audit_chainhead"]  # the chain's head, locked
MOVE = {  # a status change with its event
    "postgresql": ["WITH UPDATE tools_toolcall INSERT INTO tools_callevent"],
    "sqlite": ["UPDATE tools_toolcall", "INSERT tools_callevent"],
}
BEGIN = {"postgresql": [], "sqlite": ["BEGIN"]}  # psycopg's BEGIN is not a cursor statement; SQLite's is

REQUEST = {vendor: KEY_AND_SESSION + BEGIN[vendor] + SUBMISSION + WRITTEN[vendor] + AUDITED for vendor in MOVE}
# The local executor, with room for the call, claims it in the request's transaction: the row is written
# already running, with both its events (queued, running) in the same statements.
REQUEST_CLAIMED = REQUEST
# succeeded. On PostgreSQL one statement outside a transaction: no BEGIN, no COMMIT.
RUN = {vendor: BEGIN[vendor] + MOVE[vendor] for vendor in MOVE}
RUN_COMMITS = {"postgresql": 0, "sqlite": 1}
CLAIM_LOCK = {"postgresql": ["SELECT"], "sqlite": []}  # PostgreSQL: the tenant's advisory claim lock
WORKER = {vendor: ["SELECT tools_toolcall"]  # the call, its session, tool and tenant, the configuration versions
          + BEGIN[vendor] + CLAIM_LOCK[vendor] + MOVE[vendor]  # the claim: cap, lease, running, event
          + BEGIN[vendor] + MOVE[vendor]  # succeeded
          for vendor in MOVE}
WORKER_COMMITS = {"postgresql": 1, "sqlite": 2}


def governed_call(world):
    response = world.a.client().post(f"/api/v1/sessions/{world.a.session.pk}/calls", BODY, format="json")
    assert response.status_code == 200, response.content
    return response.json()["calls"][0]


def settle_quietly():
    """Let the executor's thread finish writing before the trace is read (bounded)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        executor = runtime_module.runtime()._executor
        with executor._lock:
            if not executor._running:
                return
        time.sleep(0.01)


def test_a_governed_call_in_the_embedded_mode(world, monkeypatch, drain_calls):
    governed_call(world)  # warm: caches built, connections open
    settle_quietly()
    trace = trace_on(monkeypatch)
    call = governed_call(world)
    assert call["status"] == CallStatus.SUCCEEDED
    settle_quietly()
    vendor = connection.vendor
    assert trace.of("toolkeeper-db") == REQUEST_CLAIMED[vendor], trace.of("toolkeeper-db")
    assert trace.commits_of("toolkeeper-db") == 1
    assert trace.of("toolkeeper-call") == RUN[vendor], trace.of("toolkeeper-call")
    assert trace.commits_of("toolkeeper-call") == RUN_COMMITS[vendor]
    assert [thread for thread, _ in trace.statements if not thread.startswith(("toolkeeper-db", "toolkeeper-call"))
            ] == [], "statements outside the request and the run"


class HeldCalls(CeleryExecutor):
    """The Celery executor's side in the server, sending nothing: the test runs the worker's side itself."""

    sent: list = []

    def submit(self, call, *, stamped: bool = False) -> bool:
        self.sent.append((call.pk, stamped))
        return True


def test_a_governed_call_in_the_distributed_mode(world, monkeypatch):
    executor = HeldCalls()
    executor.sent = []
    monkeypatch.setattr(runtime_module.runtime(), "_executor", executor)
    BODY_NOW = {**BODY, "wait": 0}
    client = world.a.client()
    warm = client.post(f"/api/v1/sessions/{world.a.session.pk}/calls", BODY_NOW, format="json").json()["calls"][0]
    worker_run_call(call_id=warm["id"])
    trace = trace_on(monkeypatch)
    response = client.post(f"/api/v1/sessions/{world.a.session.pk}/calls", BODY_NOW, format="json")
    call = response.json()["calls"][0]
    assert call["status"] == CallStatus.QUEUED
    vendor = connection.vendor
    # dispatched_at is written with the move to queued
    assert trace.of("toolkeeper-db") == REQUEST[vendor], trace.of("toolkeeper-db")
    assert executor.sent[-1] == (ToolCall.objects.for_tenant(world.a.tenant).get(pk=call["id"]).pk, True)
    trace.clear()
    assert worker_run_call(call_id=call["id"]) == "claimed"
    assert trace.of("MainThread") == WORKER[vendor], trace.of("MainThread")
    assert trace.commits_of("MainThread") == WORKER_COMMITS[vendor]
    assert ToolCall.objects.for_tenant(world.a.tenant).get(pk=call["id"]).status == CallStatus.SUCCEEDED


@pytest.mark.sqlite_subprocess
def test_the_counts_hold_on_the_other_database(tmp_path):
    """The embedded mode's own database is SQLite: its counts are pinned too, whichever this run uses."""
    run_on_other_backend("tests/statements", tmp_path)


@pytest.mark.django_db
def test_the_expected_backend_is_in_use():
    assert_expected_vendor()
