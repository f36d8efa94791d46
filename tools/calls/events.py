"""A call's state changes and progress: persisted as numbered CallEvents, broadcast after commit.

Every move of a call's status is a conditional UPDATE on the status it moves from, so two
actors (a worker and a cancel, two workers) can never both win. The same UPDATE takes the
event's sequence number (RETURNING) and, on PostgreSQL, inserts the event in the same statement. Failing a call is
one such move with a structured error (`call_fail`), whoever fails it. A call that settles tells
the waits of this process after commit (`tools.calls.waiting.settle_notify`).
"""
from contextlib import nullcontext

from django.db import transaction
from django.utils import timezone

from realtime.broadcast import publish_on_commit
from realtime.groups import calls_group, session_group
from tenancy.fastread import insert_instance, this_connection
from tools.calls.statements import INCREMENTS, UNIQUE_CALL_ID, call_insert_with_events, call_update_with_event
from tools.calls.traces import call_moved
from tools.calls.waiting import settle_notify
from tools.models import SETTLED_STATUSES, TERMINAL_STATUSES, CallStatus, ToolCall
from tools.python.results import call_error, error_result


def _writing():
    """The transaction of a status change and its event. On PostgreSQL they are one statement, which outside
    a transaction commits by itself: no BEGIN and COMMIT round trips (what runs on commit runs right after)."""
    conn = this_connection()
    if conn.vendor == "postgresql" and not conn.in_atomic_block:
        return nullcontext()
    return transaction.atomic(savepoint=False)


def _publish(call: ToolCall, seq: int, kind: str, data: dict, at) -> None:
    message = {
        "type": "call.event", "call": str(call.pk), "session": str(call.session_id), "seq": seq,
        "kind": kind, "data": data, "at": at.isoformat(),
    }
    publish_on_commit([session_group(call.tenant_id, call.session_id), calls_group(call.tenant_id)], message)


def call_event_append(*, call: ToolCall, kind: str, data: dict, while_status: str | None = None) -> int | None:
    """Append an event and return its number; with `while_status`, only while the call is still in it (else
    None, nothing written)."""
    at = timezone.now()
    with _writing():
        seq = call_update_with_event(call, from_statuses=None if while_status is None else [while_status],
                                     kind=kind, data=data, at=at)
        if seq is not None:
            _publish(call, seq, kind, data, at)
        return seq


def call_transition(*, call: ToolCall, from_statuses, to_status: str, event_data: dict | None = None,
                    condition: tuple[str, list] | None = None, **fields) -> bool:
    """Move the call to `to_status` if it is still in one of `from_statuses` (and `condition`, more of the
    UPDATE's WHERE with its parameters, holds). Returns whether it moved."""
    if to_status in TERMINAL_STATUSES and "finished_at" not in fields:
        fields["finished_at"] = timezone.now()
    at = timezone.now()
    data = {"status": to_status, **(event_data or {})}
    with _writing():
        seq = call_update_with_event(call, from_statuses=from_statuses, fields={"status": to_status, **fields},
                                     kind="status", data=data, at=at, condition=condition)
        if seq is None:
            return False
        before, call.status = call.status, to_status
        for name, value in fields.items():
            if name in INCREMENTS:
                value = getattr(call, name) + value
            setattr(call, name, value)
        call.event_seq = seq
        call_moved(call, before, to_status)
        _publish(call, seq, "status", data, at)
        if to_status in SETTLED_STATUSES:
            transaction.on_commit(lambda: settle_notify(call))
    return True


def call_record(call: ToolCall, *, status: str | None = None, passing: tuple[str, ...] = (),
                event_data: dict | None = None, **fields) -> bool:
    """Write a new call's row with these fields: with `status`, already moved there through `passing` (the
    statuses it passes on the way), each move's event written with it (one statement on PostgreSQL); without,
    as it stands (received, no event). Returns False, nothing written, when the session already has a call
    with its `call_id`."""
    for name, value in fields.items():
        setattr(call, name, value)
    # One reading of the clock for its first events and, for a call that settles at once (denied, failed at
    # submission), its end; the row is created then, or at a time read before (when it was received, a start),
    # never after.
    at = timezone.now()
    if status in TERMINAL_STATUSES and call.finished_at is None:
        call.finished_at = at
    created = min([at] + [t for t in (call.created_at, call.started_at, call.finished_at) if t is not None])
    if status is None:
        return insert_instance(call, unless_taken=UNIQUE_CALL_ID, now=created)
    events = [("status", {"status": passed}) for passed in passing]
    events.append(("status", {"status": status, **(event_data or {})}))
    call.status, call.event_seq = status, len(events)
    with _writing():
        if not call_insert_with_events(call, events=events, at=at, created=created):
            call.status, call.event_seq = CallStatus.RECEIVED, 0
            return False
        for seq, (kind, data) in enumerate(events, start=1):
            _publish(call, seq, kind, data, at)
        call_moved(call, None, status)
        if status in SETTLED_STATUSES:
            transaction.on_commit(lambda: settle_notify(call))
    return True


def call_failure(call: ToolCall, *, error_type: str, message: str, event_data: dict | None = None,
                 result: dict | None = None) -> tuple[dict, dict]:
    """The fields that settle a call with a structured error for the model, and its status event's data."""
    error = call_error(error_type=error_type, message=message, tool=call.tool_name, call_id=call.call_id)
    return ({"error": error, "result": error_result(error) if result is None else result},
            {"error": error, **(event_data or {})})


def call_fail(*, call: ToolCall, error_type: str, message: str, from_statuses, status: str = CallStatus.FAILED,
              event_data: dict | None = None, result: dict | None = None, **fields) -> bool:
    """Settle the call with a structured error for the model, if it is still in one of `from_statuses`.

    The error is the call's `error`, its result (unless `result` gives another, such as an external system's
    own error answer) and part of the status event, with `event_data` beside it. Returns whether it moved.
    """
    failure, data = call_failure(call, error_type=error_type, message=message, event_data=event_data, result=result)
    return call_transition(call=call, from_statuses=from_statuses, to_status=status, event_data=data,
                           **failure, **fields)
