"""A worker's claim waits for the disk unless its tool is idempotent (docs/notes/calls-and-execution.md,
"Distributed execution"): a claim a database crash forgets runs its call again, which only an idempotent tool's
call may do. Run in this process (the worker's side called directly): no stack needed."""
import pytest
from django.db import connection

from tests.statements.trace import trace_on
from tests.tools.support import install_tool, registered_tool, unique_name
from tools.calls import runtime as runtime_module
from tools.calls.executors import CeleryExecutor
from tools.calls.submit import calls_submit
from tools.calls.worker import worker_run_call
from tools.catalog.services import session_create
from tools.models import CallStatus, ToolCall

pytestmark = pytest.mark.django_db(transaction=True)


class HeldCalls(CeleryExecutor):
    """The server's side sends nothing: the test runs the worker's side itself."""

    def submit(self, call, *, stamped: bool = False) -> bool:
        return True


def again() -> str:
    """Idempotent."""
    return "ran"


def once() -> str:
    """Not idempotent."""
    return "ran"


def test_only_an_idempotent_tools_claim_commits_without_waiting_for_the_disk(world, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("a claim's commit waits for the disk on PostgreSQL; SQLite's writer is the embedded mode's")
    monkeypatch.setattr(runtime_module.runtime(), "_executor", HeldCalls())
    names = {"idempotent": unique_name("again"), "not idempotent": unique_name("once")}
    with registered_tool(again, name=names["idempotent"], idempotent=True), \
            registered_tool(once, name=names["not idempotent"]):
        for name in names.values():
            install_tool(world.a.tenant, name)
        session = session_create(tenant=world.a.tenant, agent="claims")
        calls = calls_submit(session=session, calls=[{"name": name, "input": {}} for name in names.values()])
        assert [call.status for call in calls] == [CallStatus.QUEUED] * 2
        trace = trace_on(monkeypatch)
        claims = {}
        for kind, call in zip(names, calls, strict=True):
            trace.clear()
            assert worker_run_call(call_id=str(call.pk)) == "claimed"
            claims[kind] = [sql for sql, _ in trace.texts if "pg_advisory_xact_lock" in sql]
    assert all(len(statements) == 1 for statements in claims.values()), claims
    assert "synchronous_commit" in claims["idempotent"][0]
    assert "synchronous_commit" not in claims["not idempotent"][0]
    settled = ToolCall.objects.for_tenant(world.a.tenant).filter(pk__in=[call.pk for call in calls])
    assert {call.status for call in settled} == {CallStatus.SUCCEEDED}
    with connection.cursor() as cursor:  # the setting ended with the claim's transaction
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"
