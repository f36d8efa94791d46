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

from common import metrics
from realtime.broadcast import publish_on_commit
from realtime.groups import calls_group, session_group, settled_group
from tenancy.fastread import insert_instance, this_connection
from tenancy.selectors import tenant_slug
from tools.calls.statements import INCREMENTS, UNIQUE_CALL_ID, call_insert_with_events, call_update_with_event
from tools.calls.traces import call_moved
from tools.calls.waiting import settle_notify
from tools.models import SETTLED_STATUSES, TERMINAL_STATUSES, CallStatus, Tool, ToolCall
from tools.python.results import call_error, error_result


def _writing():
    """The transaction of a status change and its event. On PostgreSQL they are one statement, which outside
    a transaction commits by itself: no BEGIN and COMMIT round trips (what runs on commit runs right after)."""
    conn = this_connection()
    if conn.vendor == "postgresql" and not conn.in_atomic_block:
        return nullcontext()
    return transaction.atomic(savepoint=False)


# --- the labels of a call's metrics (common.metrics): bounded, read without a query on the hot path ---

_tool_sources: dict[int, str] = {}  # a tool row's source never changes
NOT_ON_SURFACE = frozenset({"ToolNotAvailable", "ToolDefinitionChanged"})
TOOL_SOURCES_KEPT = 10_000


def call_tenant(call: ToolCall) -> str:
    if not metrics.TENANT_LABELS:
        return metrics.ALL_TENANTS
    return tenant_slug(call.tenant_id, call.tenant if ToolCall.tenant.is_cached(call) else None)


def call_source(call: ToolCall) -> str:
    """The kind of the call's tool: its source (python, mcp, http, external, builtin…), `declared` for a tool its
    app declared, `meta` for a meta tool, `none` for a call of no tool on the surface."""
    if call.declared_tool is not None:
        return "declared"
    if call.tool_id is None:
        error = call.error if isinstance(call.error, dict) else {}
        return "none" if error.get("errorType") in NOT_ON_SURFACE else "meta"
    if ToolCall.tool.is_cached(call) and call.tool is not None:
        return call.tool.source
    source = _tool_sources.get(call.tool_id)
    if source is None:
        found = Tool.objects.for_tenant(call.tenant_id).filter(pk=call.tool_id).values_list("source", flat=True)
        if len(_tool_sources) >= TOOL_SOURCES_KEPT:
            _tool_sources.clear()
        source = _tool_sources[call.tool_id] = found.first() or "none"
    return source


def _count_settled(call: ToolCall, created_at) -> None:
    """A call's final status, counted once its transaction commits (a rolled-back move never happened)."""
    decision = call.decision.get("behavior", "none") if isinstance(call.decision, dict) else "none"
    labels = {"tenant": call_tenant(call), "source": call_source(call), "status": str(call.status),
              "decision": decision if decision in ("allow", "deny", "ask", "confirm") else "none"}
    seconds = (call.finished_at - created_at).total_seconds() if call.finished_at and created_at else None
    transaction.on_commit(lambda: metrics.call_settled(seconds=seconds, **labels))


def _publish(call: ToolCall, seq: int, kind: str, data: dict, at) -> None:
    message = {
        "type": "call.event", "call": str(call.pk), "session": str(call.session_id), "seq": seq,
        "kind": kind, "data": data, "at": at.isoformat(),
    }
    groups = [session_group(call.tenant_id, call.session_id), calls_group(call.tenant_id)]
    if kind == "status" and data.get("status") in SETTLED_STATUSES:
        groups.append(settled_group(call.tenant_id))
    publish_on_commit(groups, message, status=kind == "status")


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
        if metrics.ENABLED and to_status in TERMINAL_STATUSES:
            _count_settled(call, call.created_at)
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
        if metrics.ENABLED and status in TERMINAL_STATUSES:
            _count_settled(call, created)
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
