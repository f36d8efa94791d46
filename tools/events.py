"""A call's state changes and progress: persisted as numbered CallEvents, broadcast after commit.

Every move of a call's status is a conditional UPDATE on the status it moves from, so two
actors (a worker and a cancel, two workers) can never both win. The same UPDATE takes the
event's sequence number (RETURNING), so a transition costs two statements.
"""
from django.db import connection, transaction
from django.utils import timezone

from realtime.broadcast import publish_on_commit
from realtime.groups import calls_group, session_group
from tenancy.fastread import insert_row

from .models import SETTLED_STATUSES, TERMINAL_STATUSES, CallEvent, ToolCall
from .waiting import settle_notify

INCREMENTS = frozenset({"attempts"})  # fields a transition may bump by one: pass `attempts=1`


def _update_call(call: ToolCall, *, from_statuses=None, fields: dict | None = None) -> int | None:
    """UPDATE the call (if still in `from_statuses`), bump its event counter; returns the new seq or None."""
    meta = ToolCall._meta
    quote = connection.ops.quote_name
    sets, params = [], []
    for name, value in (fields or {}).items():
        field = meta.get_field(name)
        column = quote(field.column)
        if name in INCREMENTS:
            sets.append(f"{column} = {column} + %s")
            params.append(int(value))
        else:
            sets.append(f"{column} = %s")
            if field.is_relation and hasattr(value, "pk"):
                value = value.pk
            params.append(field.get_db_prep_save(value, connection))
    seq_column = quote(meta.get_field("event_seq").column)
    sets.append(f"{seq_column} = {seq_column} + 1")
    where = [f"{quote(meta.pk.column)} = %s", f"{quote(meta.get_field('tenant').column)} = %s"]
    params += [meta.pk.get_db_prep_value(call.pk, connection), call.tenant_id]
    if from_statuses is not None:
        statuses = list(from_statuses)
        where.append(f"{quote(meta.get_field('status').column)} IN ({', '.join(['%s'] * len(statuses))})")
        params += [str(status) for status in statuses]
    # Identifiers come from model metadata; every value is a parameter.
    sql = f"UPDATE {quote(meta.db_table)} SET {', '.join(sets)} WHERE {' AND '.join(where)} RETURNING {seq_column}"  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return row[0] if row else None


def _record(call: ToolCall, seq: int, kind: str, data: dict) -> CallEvent:
    event = CallEvent(tenant_id=call.tenant_id, call_id=call.pk, seq=seq, kind=kind, data=data, at=timezone.now())
    event.pk = insert_row(CallEvent, tenant=event.tenant_id, call=event.call_id, seq=seq, kind=kind, data=data,
                          at=event.at)
    message = {
        "type": "call.event", "call": str(call.pk), "session": str(call.session_id), "seq": seq,
        "kind": kind, "data": data, "at": event.at.isoformat(),
    }
    publish_on_commit([session_group(call.tenant_id, call.session_id), calls_group(call.tenant_id)], message)
    return event


def call_event_append(*, call: ToolCall, kind: str, data: dict, while_status: str | None = None) -> CallEvent | None:
    """Append an event; with `while_status`, only while the call is still in it (else None, nothing written)."""
    with transaction.atomic(savepoint=False):
        seq = _update_call(call, from_statuses=None if while_status is None else [while_status])
        if seq is None:
            return None
        return _record(call, seq, kind, data)


def call_transition(*, call: ToolCall, from_statuses, to_status: str, event_data: dict | None = None,
                    **fields) -> bool:
    """Move the call to `to_status` if it is still in one of `from_statuses`. Returns whether it moved."""
    if to_status in TERMINAL_STATUSES and "finished_at" not in fields:
        fields["finished_at"] = timezone.now()
    with transaction.atomic(savepoint=False):
        seq = _update_call(call, from_statuses=from_statuses, fields={"status": to_status, **fields})
        if seq is None:
            return False
        call.status = to_status
        for name, value in fields.items():
            if name in INCREMENTS:
                value = getattr(call, name) + value
            setattr(call, name, value)
        call.event_seq = seq
        _record(call, seq, "status", {"status": to_status, **(event_data or {})})
        if to_status in SETTLED_STATUSES:
            transaction.on_commit(lambda: settle_notify(call))
    return True
