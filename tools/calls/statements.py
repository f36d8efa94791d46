"""The SQL a call's hot path runs outside the ORM, in one place.

Each statement runs at least once per call, where building and compiling the ORM's version cost more than
the statement itself. Identifiers come from model metadata and every value is a parameter. The tenant id
is in the WHERE of each. Generic helpers (one value of a tenant's row, appending a row) stay in
`tenancy.fastread`.
"""
from contextlib import contextmanager
from contextvars import ContextVar

from tenancy.fastread import insert_instance, insert_instance_statement, instance_written, this_connection
from tools.models import AgentSession, CallEvent, CallStatus, ToolCall

INCREMENTS = frozenset({"attempts"})  # call fields an update may bump by one: pass `attempts=1`
IN_FLIGHT_STATUSES = (CallStatus.RECEIVED, CallStatus.QUEUED, CallStatus.RUNNING)


_update_statements: dict[tuple, tuple[str, list]] = {}  # (vendor, field names, statuses) → (UPDATE text, fields)


def _update_statement(conn, names: tuple[str, ...], statuses: int | None, condition: str = "") -> tuple[str, list]:
    key = (conn.vendor, names, statuses, condition)
    found = _update_statements.get(key)
    if found is not None:
        return found
    meta = ToolCall._meta
    quote = conn.ops.quote_name
    fields = [meta.get_field(name) for name in names]
    sets = []
    for name, field in zip(names, fields, strict=True):
        column = quote(field.column)
        sets.append(f"{column} = {column} + %s" if name in INCREMENTS else f"{column} = %s")
    seq_column = quote(meta.get_field("event_seq").column)
    sets.append(f"{seq_column} = {seq_column} + 1")
    where = [f"{quote(meta.pk.column)} = %s", f"{quote(meta.get_field('tenant').column)} = %s"]
    if statuses is not None:
        where.append(f"{quote(meta.get_field('status').column)} IN ({', '.join(['%s'] * statuses)})")
    if condition:
        where.append(condition)
    sql = f"UPDATE {quote(meta.db_table)} SET {', '.join(sets)} WHERE {' AND '.join(where)} RETURNING {seq_column}"  # noqa: S608
    found = _update_statements[key] = (sql, fields)
    return found


def _update_params(conn, call: ToolCall, fields: dict, model_fields: list, statuses, condition_params=()) -> list:
    params = []
    for (name, value), field in zip(fields.items(), model_fields, strict=True):
        if name in INCREMENTS:
            params.append(int(value))
            continue
        if field.is_relation and hasattr(value, "pk"):
            value = value.pk
        params.append(field.get_db_prep_save(value, conn))
    return params + [ToolCall._meta.pk.get_db_prep_value(call.pk, conn), call.tenant_id, *(statuses or ()),
                     *condition_params]


def call_update(call: ToolCall, *, from_statuses=None, fields: dict | None = None,
                condition: tuple[str, list] | None = None) -> int | None:
    """UPDATE the call (if still in `from_statuses`, and `condition` holds) and bump its event counter in the
    same statement; returns the new event number, or None when it did not apply."""
    conn = this_connection()
    fields = fields or {}
    statuses = None if from_statuses is None else [str(status) for status in from_statuses]
    condition_sql, condition_params = condition or ("", [])
    sql, model_fields = _update_statement(conn, tuple(fields), None if statuses is None else len(statuses),
                                          condition_sql)
    with conn.cursor() as cursor:
        cursor.execute(sql, _update_params(conn, call, fields, model_fields, statuses, condition_params))
        row = cursor.fetchone()
    return row[0] if row else None


_event_columns: dict[str, tuple[str, list]] = {}  # vendor → (column list, the fields of the values after seq)


def _event_shape(conn) -> tuple[str, list]:
    found = _event_columns.get(conn.vendor)
    if found is None:
        meta = CallEvent._meta
        quote = conn.ops.quote_name
        names = ("tenant", "call", "seq", "kind", "data", "at")
        columns = ", ".join(quote(meta.get_field(name).column) for name in names)
        found = _event_columns[conn.vendor] = (columns, [meta.get_field(name) for name in ("kind", "data", "at")])
    return found


def call_update_with_event(call: ToolCall, *, from_statuses=None, fields: dict | None = None, kind: str,
                           data: dict, at, condition: tuple[str, list] | None = None) -> int | None:
    """`call_update` and the event it numbers, written together; returns the event's number, or None (nothing
    written) when the call was not in one of `from_statuses` (or `condition`, more SQL for the WHERE with its
    parameters, did not hold). On PostgreSQL one statement (the UPDATE in a WITH, the INSERT reading its
    RETURNING): a round trip fewer for each of a call's status changes."""
    conn = this_connection()
    if conn.vendor != "postgresql":  # SQLite has no data-modifying WITH, and no network to save
        seq = call_update(call, from_statuses=from_statuses, fields=fields, condition=condition)
        if seq is not None:
            events_insert(call, [(seq, kind, data)], at=at)
        return seq
    fields = fields or {}
    statuses = None if from_statuses is None else [str(status) for status in from_statuses]
    condition_sql, condition_params = condition or ("", [])
    update_sql, model_fields = _update_statement(conn, tuple(fields), None if statuses is None else len(statuses),
                                                 condition_sql)
    columns, value_fields = _event_shape(conn)
    quote = conn.ops.quote_name
    seq_column = quote(ToolCall._meta.get_field("event_seq").column)
    sql = (f"WITH moved AS ({update_sql}) INSERT INTO {quote(CallEvent._meta.db_table)} ({columns}) "  # noqa: S608
           f"SELECT %s, %s, moved.{seq_column}, %s, %s, %s FROM moved RETURNING {quote('seq')}")
    params = _update_params(conn, call, fields, model_fields, statuses, condition_params)
    params += [call.tenant_id, ToolCall._meta.pk.get_db_prep_value(call.pk, conn),
               *(field.get_db_prep_save(value, conn) for field, value in zip(value_fields, (kind, data, at),
                                                                                strict=True))]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return row[0] if row else None


UNIQUE_CALL_ID = ("session", "call_id")


def call_insert_with_events(call: ToolCall, *, events: list[tuple[str, dict]], at, created=None) -> bool:
    """INSERT a new call's row, created at `created` (by default `at`), and its first events (kind, data) at `at`,
    numbered from 1 (the row's `event_seq` is their count), together; False, nothing written, when the session
    already has a call with its `call_id`.
    One statement for the events on SQLite; one for all on PostgreSQL: the events' INSERT reads the call's
    (in a WITH), so a taken id writes neither."""
    conn = this_connection()
    rows = [(seq, kind, data) for seq, (kind, data) in enumerate(events, start=1)]
    if conn.vendor != "postgresql":
        if not insert_instance(call, unless_taken=UNIQUE_CALL_ID, now=created or at):
            return False
        events_insert(call, rows, at=at)
        return True
    call_sql, params = insert_instance_statement(call, unless_taken=UNIQUE_CALL_ID, now=created or at)
    columns, value_fields = _event_shape(conn)
    quote = conn.ops.quote_name
    written_id = f"written.{quote(ToolCall._meta.pk.column)}"
    values = ", ".join(["(%s::integer, %s::varchar, %s::jsonb, %s::timestamptz)"] * len(rows))
    sql = (f"WITH written AS ({call_sql}) INSERT INTO {quote(CallEvent._meta.db_table)} ({columns}) "  # noqa: S608
           f"SELECT %s, {written_id}, v.seq, v.kind, v.data, v.at FROM written, (VALUES {values}) "
           f"AS v(seq, kind, data, at) RETURNING {quote('seq')}")
    params.append(call.tenant_id)
    kind_field, data_field, at_field = value_fields
    prepared_at = at_field.get_db_prep_save(at, conn)
    for seq, kind, data in rows:
        params += [seq, kind_field.get_db_prep_save(kind, conn), data_field.get_db_prep_save(data, conn), prepared_at]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        if cursor.fetchone() is None:
            return False
    instance_written(call)
    return True


def events_insert(call: ToolCall, rows: list[tuple[int, str, dict]], *, at) -> None:
    """INSERT events of a call, (seq, kind, data), in one statement (append-only: no model instance, no save
    machinery)."""
    conn = this_connection()
    columns, value_fields = _event_shape(conn)
    quote = conn.ops.quote_name
    kind_field, data_field, at_field = value_fields
    prepared_at = at_field.get_db_prep_save(at, conn)
    call_id = ToolCall._meta.pk.get_db_prep_value(call.pk, conn)
    params: list = []
    for seq, kind, data in rows:
        params += [call.tenant_id, call_id, seq, kind_field.get_db_prep_save(kind, conn),
                   data_field.get_db_prep_save(data, conn), prepared_at]
    placeholders = ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(rows))
    with conn.cursor() as cursor:
        cursor.execute(f"INSERT INTO {quote(CallEvent._meta.db_table)} ({columns}) VALUES {placeholders}",  # noqa: S608
                       params)


def session_call_count_add(session: AgentSession, added: int) -> int:
    """Add to the session's call counter in one statement; returns the new count."""
    meta = AgentSession._meta
    conn = this_connection()
    quote = conn.ops.quote_name
    with conn.cursor() as cursor:
        cursor.execute(
            f"UPDATE {quote(meta.db_table)} SET call_count = call_count + %s "  # noqa: S608 (identifiers from metadata)
            f"WHERE {quote(meta.pk.column)} = %s AND tenant_id = %s RETURNING call_count",
            [added, meta.pk.get_db_prep_value(session.pk, conn), session.tenant_id],
        )
        return cursor.fetchone()[0]


def calls_in_flight(*, tenant, api_key=None) -> tuple[int, int]:
    """The tenant's calls received, queued or running, and how many of them are in sessions the key created.

    Checked on every submission, inside its transaction: one statement over the (tenant, status, session) index (the
    ORM's aggregate took over half a millisecond to build), reading only the calls in flight, which the
    limits keep few.
    """
    conn = this_connection()
    quote = conn.ops.quote_name
    call, session = ToolCall._meta, AgentSession._meta
    params: list = []
    key_count, join = "0", ""
    if api_key is not None:
        key_count = f"SUM(CASE WHEN s.{quote(session.get_field('api_key').column)} = %s THEN 1 ELSE 0 END)"
        join = (f" JOIN {quote(session.db_table)} s ON s.{quote(session.pk.column)} = "
                f"c.{quote(call.get_field('session').column)}")
        params.append(api_key.pk)
    sql = (f"SELECT COUNT(*), {key_count} FROM {quote(call.db_table)} c{join} "  # noqa: S608 (names from metadata)
           f"WHERE c.{quote(call.get_field('tenant').column)} = %s AND c.{quote(call.get_field('status').column)} "
           f"IN ({', '.join(['%s'] * len(IN_FLIGHT_STATUSES))})")
    params += [getattr(tenant, "pk", tenant), *IN_FLIGHT_STATUSES]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        tenant_count, key_in_flight = cursor.fetchone()
    return tenant_count, key_in_flight or 0


def session_calls_awaiting_approval(session: AgentSession, tool_name: str) -> list[tuple[object, object]]:
    """(id, input) of the session's calls of this tool that wait for a reviewer or their user, oldest first: looked
    up on every MCP call (a retry attaches to such a call), where compiling the queryset cost over a millisecond.

    Read through the (tenant, session, status) index and put in order here: with an ORDER BY, SQLite's planner
    walks the tenant's (tenant, created) index instead, every call the tenant ever made, to spare sorting the
    few rows found (docs/performance.md, "Flat with history")."""
    conn = this_connection()
    quote = conn.ops.quote_name
    meta = ToolCall._meta
    column = {name: quote(meta.get_field(name).column) for name in ("tenant", "session", "tool_name", "status",
                                                                     "input", "created_at")}
    sql = (f"SELECT {quote(meta.pk.column)}, {column['input']}, {column['created_at']} "  # noqa: S608
           f"FROM {quote(meta.db_table)} "
           f"WHERE {column['tenant']} = %s AND {column['session']} = %s AND {column['tool_name']} = %s "
           f"AND {column['status']} IN (%s, %s)")
    with conn.cursor() as cursor:
        cursor.execute(sql, [session.tenant_id, meta.pk.get_db_prep_value(session.pk, conn), tool_name,
                             str(CallStatus.AWAITING_APPROVAL), str(CallStatus.AWAITING_USER)])
        rows = cursor.fetchall()
    input_field = meta.get_field("input")
    created_field = meta.get_field("created_at")
    rows.sort(key=lambda row: created_field.to_python(row[2]))
    return [(meta.pk.to_python(pk), input_field.from_db_value(value, None, conn)) for pk, value, _ in rows]


def call_statuses(tenant_id: int, call_ids, *, with_cancel: bool = False) -> dict:
    """call id → status for these calls of the tenant (read by every waiting request, at least once); with
    `with_cancel`, call id → (status, whether a cancel was requested), for a worker's watch."""
    ids = [str(call_id) for call_id in call_ids]
    if not ids:
        return {}
    conn = this_connection()
    quote = conn.ops.quote_name
    meta = ToolCall._meta
    prepared = [meta.pk.get_db_prep_value(meta.pk.to_python(call_id), conn) for call_id in ids]
    cancel = f", {quote(meta.get_field('cancel_requested').column)}" if with_cancel else ""
    sql = (f"SELECT {quote(meta.pk.column)}, {quote(meta.get_field('status').column)}{cancel} "  # noqa: S608
           f"FROM {quote(meta.db_table)} WHERE {quote(meta.get_field('tenant').column)} = %s "
           f"AND {quote(meta.pk.column)} IN ({', '.join(['%s'] * len(prepared))})")
    with conn.cursor() as cursor:
        cursor.execute(sql, [tenant_id, *prepared])
        rows = cursor.fetchall()
    if with_cancel:
        return {str(meta.pk.to_python(row[0])): (row[1], bool(row[2])) for row in rows}
    return {str(meta.pk.to_python(pk)): status for pk, status in rows}


def calls_lease_renew(tenant_id: int, calls: list[ToolCall], *, until) -> int:
    """Extend the lease of these calls of the tenant, those still running, in one statement; returns how many."""
    conn = this_connection()
    quote = conn.ops.quote_name
    meta = ToolCall._meta
    pk = meta.pk
    sql = (f"UPDATE {quote(meta.db_table)} SET {quote(meta.get_field('lease_until').column)} = %s "  # noqa: S608
           f"WHERE {quote(meta.get_field('tenant').column)} = %s AND {quote(meta.get_field('status').column)} = %s "
           f"AND {quote(pk.column)} IN ({', '.join(['%s'] * len(calls))})")
    params = [meta.get_field("lease_until").get_db_prep_save(until, conn), tenant_id, str(CallStatus.RUNNING),
              *(pk.get_db_prep_value(call.pk, conn) for call in calls)]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


CLAIM_LOCK_SPACE = 7002  # advisory locks (PostgreSQL): 7001 is the audit chain's first append


_claim_unflushed: ContextVar[bool] = ContextVar("claim_unflushed", default=False)


@contextmanager
def claim_commit_unflushed():
    """Within this block, a claim's lock statement (`tenant_claims_serialise`) also has its transaction commit
    without waiting for the disk: `synchronous_commit` off for that transaction alone, in the same statement (an
    idempotent tool's claim: docs/notes/calls-and-execution.md, "Distributed execution")."""
    token = _claim_unflushed.set(True)
    try:
        yield
    finally:
        _claim_unflushed.reset(token)


def tenant_claims_serialise(tenant_id: int) -> None:
    """Claims of one tenant queue here until their transaction ends, so the running count a claim checks
    cannot go stale before it commits. A transaction-scoped advisory lock on PostgreSQL, not a lock on the
    tenant's row, which every insert of a row that refers to the tenant (calls, events) would wait behind;
    SQLite's single writer already serialises."""
    conn = this_connection()
    if conn.vendor == "postgresql":
        unflushed = ", set_config('synchronous_commit', 'off', true)" if _claim_unflushed.get() else ""
        with conn.cursor() as cursor:
            cursor.execute(f"SELECT pg_advisory_xact_lock(%s, %s){unflushed}", [CLAIM_LOCK_SPACE, tenant_id])


_claim_conditions: dict[tuple, str] = {}


def lease_lapsed_condition(now) -> tuple[str, list]:
    """The WHERE of a reaper's move beyond the call's status: its lease ran out before `now`. The reaper read
    the call earlier; a worker that renewed the lease since then keeps its call."""
    conn = this_connection()
    field = ToolCall._meta.get_field("lease_until")
    return f"{conn.ops.quote_name(field.column)} < %s", [field.get_db_prep_value(now, conn)]


def claim_condition(call: ToolCall, *, cap: int, in_session_order: bool) -> tuple[str, list]:
    """The WHERE of a claim beyond the call's own status: fewer than `cap` of the tenant's calls running and,
    `in_session_order` (a tool not safe to run concurrently), none of the session's unsafe calls running or
    queued before it. Checked in the claim's own UPDATE."""
    conn = this_connection()
    key = (conn.vendor, in_session_order)
    sql = _claim_conditions.get(key)
    if sql is None:
        from_call = ToolCall._meta
        quote = conn.ops.quote_name
        table, column = quote(from_call.db_table), {name: quote(from_call.get_field(name).column) for name in (
            "tenant", "status", "session", "tool", "created_at")}
        sql = (f"(SELECT COUNT(*) FROM {table} running WHERE running.{column['tenant']} = %s "  # noqa: S608
               f"AND running.{column['status']} = %s) < %s")
        if in_session_order:
            tool = from_call.get_field("tool").related_model._meta
            sql += (f" AND NOT EXISTS (SELECT 1 FROM {table} earlier JOIN {quote(tool.db_table)} unsafe "  # noqa: S608
                    f"ON unsafe.{quote(tool.pk.column)} = earlier.{column['tool']} "
                    f"WHERE earlier.{column['tenant']} = %s AND earlier.{column['session']} = %s "
                    f"AND unsafe.{quote(tool.get_field('concurrency_safe').column)} = %s "
                    f"AND (earlier.{column['status']} = %s OR (earlier.{column['status']} = %s "
                    f"AND earlier.{column['created_at']} < %s)))")
        sql = _claim_conditions[key] = sql
    params = [call.tenant_id, str(CallStatus.RUNNING), cap]
    if in_session_order:
        created = ToolCall._meta.get_field("created_at").get_db_prep_value(call.created_at, conn)
        params += [call.tenant_id, AgentSession._meta.pk.get_db_prep_value(call.session_id, conn), False,
                   str(CallStatus.RUNNING), str(CallStatus.QUEUED), created]
    return sql, params
