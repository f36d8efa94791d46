"""The SQL a call's hot path runs outside the ORM, in one place.

Each statement runs at least once per call, where building and compiling the ORM's version cost more than
the statement itself. Identifiers come from model metadata and every value is a parameter. The tenant id
is in the WHERE of each. Generic helpers (one value of a tenant's row, appending a row) stay in
`tenancy.fastread`.
"""
from tenancy.fastread import insert_row, this_connection

from .models import AgentSession, CallEvent, CallStatus, ToolCall

INCREMENTS = frozenset({"attempts"})  # call fields an update may bump by one: pass `attempts=1`
IN_FLIGHT_STATUSES = (CallStatus.RECEIVED, CallStatus.QUEUED, CallStatus.RUNNING)


_update_statements: dict[tuple, tuple[str, list]] = {}  # (vendor, field names, statuses) → (UPDATE text, fields)


def _update_statement(conn, names: tuple[str, ...], statuses: int | None) -> tuple[str, list]:
    key = (conn.vendor, names, statuses)
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
    sql = f"UPDATE {quote(meta.db_table)} SET {', '.join(sets)} WHERE {' AND '.join(where)} RETURNING {seq_column}"  # noqa: S608
    found = _update_statements[key] = (sql, fields)
    return found


def call_update(call: ToolCall, *, from_statuses=None, fields: dict | None = None) -> int | None:
    """UPDATE the call (if still in `from_statuses`) and bump its event counter in the same statement;
    returns the new event number, or None when the call was not in one of those statuses."""
    conn = this_connection()
    fields = fields or {}
    statuses = None if from_statuses is None else [str(status) for status in from_statuses]
    sql, model_fields = _update_statement(conn, tuple(fields), None if statuses is None else len(statuses))
    params = []
    for (name, value), field in zip(fields.items(), model_fields, strict=True):
        if name in INCREMENTS:
            params.append(int(value))
            continue
        if field.is_relation and hasattr(value, "pk"):
            value = value.pk
        params.append(field.get_db_prep_save(value, conn))
    params += [ToolCall._meta.pk.get_db_prep_value(call.pk, conn), call.tenant_id, *(statuses or ())]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return row[0] if row else None


def event_insert(call: ToolCall, *, seq: int, kind: str, data: dict, at) -> int:
    """INSERT a call's event (append-only: no model instance, no save machinery); returns its id."""
    return insert_row(CallEvent, tenant=call.tenant_id, call=call.pk, seq=seq, kind=kind, data=data, at=at)


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


def session_call_ids_taken(session: AgentSession, candidates: list[str]) -> set[str]:
    """Which of these call ids the session already has."""
    meta = ToolCall._meta
    conn = this_connection()
    quote = conn.ops.quote_name
    marks = ", ".join(["%s"] * len(candidates))
    with conn.cursor() as cursor:
        cursor.execute(
            f"SELECT {quote('call_id')} FROM {quote(meta.db_table)} "  # noqa: S608 (identifiers from metadata)
            f"WHERE {quote('tenant_id')} = %s AND {quote('session_id')} = %s AND {quote('call_id')} IN ({marks})",
            [session.tenant_id, AgentSession._meta.pk.get_db_prep_value(session.pk, conn), *candidates],
        )
        return {row[0] for row in cursor.fetchall()}


def calls_in_flight(*, tenant, api_key=None) -> tuple[int, int]:
    """The tenant's calls received, queued or running, and how many of them are in sessions the key created.

    Checked on every submission, inside its transaction: one statement over the (tenant, status) index (the
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
    """(id, input) of the session's calls of this tool that wait for a reviewer, oldest first: looked up on
    every MCP call (a retry attaches to such a call), where compiling the queryset cost over a millisecond."""
    conn = this_connection()
    quote = conn.ops.quote_name
    meta = ToolCall._meta
    column = {name: quote(meta.get_field(name).column) for name in ("tenant", "session", "tool_name", "status",
                                                                     "input", "created_at")}
    sql = (f"SELECT {quote(meta.pk.column)}, {column['input']} FROM {quote(meta.db_table)} "  # noqa: S608
           f"WHERE {column['tenant']} = %s AND {column['session']} = %s AND {column['tool_name']} = %s "
           f"AND {column['status']} = %s ORDER BY {column['created_at']}")
    with conn.cursor() as cursor:
        cursor.execute(sql, [session.tenant_id, meta.pk.get_db_prep_value(session.pk, conn), tool_name,
                             str(CallStatus.AWAITING_APPROVAL)])
        rows = cursor.fetchall()
    input_field = meta.get_field("input")
    return [(meta.pk.to_python(pk), input_field.from_db_value(value, None, conn)) for pk, value in rows]
