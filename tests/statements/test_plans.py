"""No statement of a hot path reads a tenant's whole history: each database is asked for the plan of every
statement the hot paths ran, and a full scan of the calls, their events, the approval requests and votes or
the audit entries fails the test (docs/performance.md, "Flat with history").

The paths: a governed call over REST allowed (the local executor's claim and finish), asked (a reviewer's
decision, the retry's lookup of a waiting twin) and denied; its read, its wait and its events; the MCP
endpoint's admission, `tools/list` and `tools/call` (the functions its handlers run on the database pool);
a Celery worker's claim and finish; the audit entry of each. Every statement that names one of those tables
is explained: on SQLite (`EXPLAIN QUERY PLAN`) a `SCAN` of the table fails; on PostgreSQL (`EXPLAIN`, with
sequential scans turned off, so the plan shows whether an index *can* serve the statement on these tiny
tables) a `Seq Scan` fails. On both, so does an index read narrowed by the tenant alone: a tenant's
history is most of such a table.
"""
import json
import re

import pytest
from django.apps import apps
from django.db import connection

from approvals.models import ApprovalRequest, Vote
from approvals.services import request_decide, rule_create, rule_delete, rule_update
from audit.models import Event
from tests.bulk import copy_rows
from tests.statements.test_statements_per_call import HeldCalls, settle_quietly
from tests.statements.trace import trace_on
from tools.calls import runtime as runtime_module
from tools.calls.statements import call_statuses
from tools.calls.worker import worker_run_call
from tools.catalog.selectors import session_tools
from tools.gateway.entry import _caller_of
from tools.gateway.protocol import _submitted, call_tool_result, pending_approval_twin
from tools.models import AgentSession, CallEvent, CallStatus, ToolCall

pytestmark = pytest.mark.django_db(transaction=True)

# The tables that grow with a tenant's history. (The audit chain's heads do not: 16 a tenant.)
HISTORY = ("tools_toolcall", "tools_callevent", "approvals_approvalrequest", "approvals_vote", "audit_event")
TENANT_COLUMN = "tenant_id"
DML = ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH")


def columns_of(table: str) -> set[str]:
    model = next(model for model in apps.get_models() if model._meta.db_table == table)
    return {field.column for field in model._meta.concrete_fields}


def narrowing(condition: str, table: str) -> set[str]:
    """The table's columns a plan's index condition names."""
    return {column for column in columns_of(table) | {"rowid"} if re.search(rf"\b{column}\b", condition)}


def tenant_wide(condition: str, table: str) -> bool:
    return not (narrowing(condition, table) - {TENANT_COLUMN})


def aliases(sql: str) -> dict[str, str]:
    """Name in a plan → history table: the table itself and each alias the statement gives it."""
    found = {}
    for table, alias in re.findall(r'\b(?:FROM|JOIN|UPDATE|INTO)\s+"?(\w+)"?(?:\s+(?:AS\s+)?"?(\w+)"?)?', sql, re.I):
        if table in HISTORY:
            found[table] = table
            if alias and alias.upper() not in {"WHERE", "SET", "ON", "VALUES", "SELECT", "JOIN", "INNER", "LEFT",
                                               "ORDER", "GROUP", "LIMIT", "FOR", "RETURNING", "AS"}:
                found[alias] = table
    return found


def sqlite_scans(sql: str, params) -> list[str]:
    names = aliases(sql)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        details = [row[3] for row in cursor.fetchall()]
    found = []
    for detail in details:
        match = re.match(r"(SCAN|SEARCH) (\w+)(?: AS \w+)?(.*)$", detail)
        if not match or match.group(2) not in names:
            continue
        verb, table, rest = match.group(1), names[match.group(2)], match.group(3)
        condition = re.search(r"\((.*)\)\s*$", rest)
        if verb == "SCAN" or condition is None or tenant_wide(condition.group(1), table):
            found.append(detail)
    return found


def _nodes(plan: dict, relation: str | None = None):
    """(node, the relation it reads) for every node; a bitmap index scan reads its heap scan's relation."""
    relation = plan.get("Relation Name", relation)
    yield plan, relation
    for child in plan.get("Plans", ()):
        yield from _nodes(child, relation)


def postgresql_scans(sql: str, params) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    found = []
    for node, relation in _nodes(plan[0]["Plan"]):
        kind = node["Node Type"]
        if relation not in HISTORY or kind in ("Bitmap Heap Scan", "ModifyTable"):
            continue
        if kind == "Seq Scan":
            found.append(f"Seq Scan on {relation}")
        elif kind in ("Index Scan", "Index Only Scan", "Bitmap Index Scan") and tenant_wide(
                node.get("Index Cond", ""), relation):
            found.append(f"{kind} using {node.get('Index Name')} on {relation}: {node.get('Index Cond', '(none)')}")
    return found


def full_scans(texts) -> dict[str, list[str]]:
    """SQL → the full scans of history tables its plan makes, for each distinct statement that names one."""
    explain = postgresql_scans if connection.vendor == "postgresql" else sqlite_scans
    seen, found = set(), {}
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")  # the statistics autovacuum keeps: without them every condition looks alike
            cursor.execute("SET enable_seqscan = off")
    try:
        for sql, params in texts:
            if sql in seen or not sql.lstrip().upper().startswith(DML) or not aliases(sql):
                continue
            seen.add(sql)
            scans = explain(sql, params)
            if scans:
                found[sql] = scans
    finally:
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("RESET enable_seqscan")
    return found


GROWN = 2000  # copies of each row: enough for the planners to tell a tenant's history from one session's calls


def grow_history(world, *, allowed: str, asked: str) -> None:
    """A history behind the paths' own rows: copies of the allowed call in the same session, each with an event,
    an approval request and a vote copied from the asked call's, and as many audit entries. Rows only (no
    chain, no signal): what the planners see, not what the API shows."""
    tenant = world.a.tenant
    calls = ToolCall.objects.for_tenant(tenant)
    source = calls.get(pk=allowed)
    request = ApprovalRequest.objects.for_tenant(tenant).get(call_id=asked)
    session_id = AgentSession._meta.pk.get_db_prep_value(world.a.session.pk, connection)
    nth_call = ("(SELECT id FROM tools_toolcall WHERE session_id = %s AND call_id = 'history-' || n)", [session_id])
    copy_rows(source, GROWN, {"call_id": ("'history-' || n", [])})
    copy_rows(CallEvent.objects.for_tenant(tenant).filter(call_id=allowed).first(), GROWN, {"call_id": nth_call})
    copy_rows(request, GROWN, {"call_id": nth_call})
    nth_request = ("(SELECT r.id FROM approvals_approvalrequest r JOIN tools_toolcall c ON c.id = r.call_id "
                   "WHERE c.session_id = %s AND c.call_id = 'history-' || n)", [session_id])
    copy_rows(Vote.objects.for_tenant(tenant).get(request=request), GROWN, {"request_id": nth_request})
    copy_rows(Event.objects.for_tenant(tenant).order_by("-id").first(), GROWN)


def submit(client, session_id, **body):
    response = client.post(f"/api/v1/sessions/{session_id}/calls", {"name": "current_time", "input": {}, **body},
                           format="json")
    assert response.status_code == 200, response.content
    return response.json()["calls"][0]


def the_hot_paths(world, monkeypatch) -> int:
    """Run every hot path once; returns how many distinct statements named a history table."""
    client, session = world.a.client(), world.a.session
    submit(client, session.pk, wait=10)  # warm: caches built, so the trace holds what a call costs from then on
    settle_quietly()
    trace = trace_on(monkeypatch)

    allowed = submit(client, session.pk, wait=10)  # REST, allowed: the executor claims and finishes it
    assert allowed["status"] == CallStatus.SUCCEEDED
    settle_quietly()
    for path in (f"/api/v1/calls/{allowed['id']}", f"/api/v1/calls/{allowed['id']}?wait=1",
                 f"/api/v1/calls/{allowed['id']}/events"):
        assert client.get(path).status_code == 200, path

    rule = rule_create(tenant=world.a.tenant, behavior="ask", tool_pattern="current_time")
    asked = submit(client, session.pk, wait=0)
    assert asked["status"] == CallStatus.AWAITING_APPROVAL
    assert str(pending_approval_twin(session, "current_time", {}).pk) == asked["id"]  # the MCP retry's lookup
    assert client.get(f"/api/v1/calls/{asked['id']}?wait=0").status_code == 200
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call_id=asked["id"])
    request_decide(request=request, reviewer=world.a.users["reviewer"], decision="approve")
    settle_quietly()
    rule_update(rule=rule, behavior="deny")
    assert submit(client, session.pk, wait=0)["status"] == CallStatus.DENIED
    rule_delete(rule=rule)

    caller = _caller_of(f"Bearer {world.a.keys['agent']}", named=str(session.pk), agent="", opening=False,
                        message={"jsonrpc": "2.0", "id": 1, "method": "tools/call"})
    assert session_tools(caller.session, "mcp")  # tools/list
    exposed, calls = _submitted(caller, {"name": "current_time", "input": {}}, None)  # tools/call
    settle_quietly()
    assert call_statuses(session.tenant_id, [calls[0].pk]) == {str(calls[0].pk): CallStatus.SUCCEEDED}
    call_tool_result(calls[0], exposed)

    executor = HeldCalls()  # the distributed mode: a worker's claim and finish
    executor.sent = []
    monkeypatch.setattr(runtime_module.runtime(), "_executor", executor)
    queued = submit(client, session.pk, wait=0)
    assert worker_run_call(call_id=queued["id"]) == "claimed"

    texts = list(trace.texts)
    trace.clear()
    monkeypatch.undo()
    grow_history(world, allowed=allowed["id"], asked=asked["id"])
    scans = full_scans(texts)
    assert scans == {}, "\n\n".join(f"{sql}\n  → {found}" for sql, found in scans.items())
    return len({sql for sql, _ in texts if aliases(sql)})


def test_no_hot_statement_scans_a_tenants_history(world, monkeypatch, drain_calls):
    assert the_hot_paths(world, monkeypatch) >= 10  # the trace really held the paths' statements


def test_the_check_finds_a_full_scan(world):
    """The check itself: a statement narrowed by the tenant alone, and one by nothing, are found."""
    tenant = world.a.tenant.pk
    session_id = AgentSession._meta.pk.get_db_prep_value(world.a.session.pk, connection)
    by_tenant = "SELECT id FROM tools_toolcall WHERE tenant_id = %s AND tool_name = %s"
    by_nothing = "SELECT c.id FROM tools_callevent e JOIN tools_toolcall c ON c.id = e.call_id WHERE e.kind = %s"
    by_session = "SELECT id FROM tools_toolcall WHERE tenant_id = %s AND session_id = %s AND status = %s"
    found = full_scans([(by_tenant, [tenant, "x"]), (by_nothing, ["status"]),
                        (by_session, [tenant, session_id, "running"])])
    assert set(found) == {by_tenant, by_nothing}, found
