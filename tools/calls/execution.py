"""Running one call on an executor: claim it, invoke its source, store the outcome; time it out; settle
it when the process that ran it died. Shared by both executors (`tools.calls.executors` in the server process,
`tools.calls.worker` in Celery workers), which decide when and where a call runs, not how.
"""
import logging
import threading
import time

from django.db.models import F
from django.utils import timezone

from common import metrics
from tools.calls.aftercare import Outcome, effects_record, error_is_transient, result_steps_run
from tools.calls.events import call_event_append, call_fail, call_source, call_transition
from tools.calls.questions import tool_ask
from tools.calls.statements import lease_lapsed_condition
from tools.calls.traces import call_span, span_failed
from tools.catalog.registry import source_for
from tools.models import AgentSession, CallStatus, EventKind, ToolCall
from tools.python.decorators import LOG_LEVELS, CallCancelled, ToolContext, ToolError, progress_numbers
from tools.python.results import result_text, tool_result

logger = logging.getLogger("toolkeeper.calls")

MAX_LOG_EVENTS = 200  # log messages a call's run keeps (a tool's `ctx.log`, its MCP server's); the rest are dropped
MAX_LOG_CHARS = 2000  # of one log message
MAX_ATTEMPTS = 3  # runs of an idempotent tool's call whose process died, before it fails with WorkerLost


def call_claim(*, call: ToolCall) -> ToolCall | None:
    """Take a queued call for running. Only one claimant ever wins (the UPDATE checks the status)."""
    moved = call_transition(call=call, from_statuses=[CallStatus.QUEUED], to_status=CallStatus.RUNNING,
                            started_at=timezone.now(), attempts=1)
    return call if moved else None


def call_execute(*, call: ToolCall, cancelled: threading.Event) -> None:
    """Invoke the claimed call's tool, pass the outcome through the after-execution steps (which may run it
    again) and record it, unless someone settled the call meanwhile: within the call's `execution` span, in this
    process (a server's executor thread, a Celery worker)."""
    with call_span(call, "execution") as span:
        outcome = _execute(call, cancelled)
        if outcome is not None and outcome.error is not None:
            span_failed(span, outcome.error[0])
    if outcome is None:
        return
    if outcome.error is not None:
        error_type, message = outcome.error
        call_fail(call=call, error_type=error_type, message=message, from_statuses=[CallStatus.RUNNING],
                  **outcome.fields)
        return
    call_transition(call=call, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.SUCCEEDED,
                    result=outcome.result, error=None, **outcome.fields)


def _execute(call: ToolCall, cancelled: threading.Event) -> Outcome | None:
    """`call_execute`'s runs of the tool and its after-steps: the outcome to settle the call with; None when
    someone else settled it meanwhile."""
    tool = call.tool
    session: AgentSession = call.session

    logged = 0

    def emit(text: str = "", *, progress: float | None = None, kind: str | None = None,
             completed: float | None = None, total: float | None = None, level: str | None = None) -> None:
        nonlocal logged
        if cancelled.is_set():
            raise CallCancelled("the call was cancelled")
        data = {"text": str(text)}
        if progress is not None:
            data["progress"] = max(0.0, min(1.0, float(progress)))
        completed, total = progress_numbers(completed, total)
        if completed is not None:  # counts as the tool (or its MCP server) gave them
            data["completed"] = completed
            if total is not None:
                data["total"] = total
        kind = kind or (EventKind.PROGRESS if progress is not None or completed is not None else EventKind.OUTPUT)
        if kind == EventKind.LOG:
            logged += 1
            if logged > MAX_LOG_EVENTS:
                return  # a chatty tool's further log messages are dropped, not stored
            data = {"text": data["text"][:MAX_LOG_CHARS], "level": level if level in LOG_LEVELS else "info"}
        # Only while the call runs: a call settled by a timeout or a cancel shows nothing after its last status.
        if call_event_append(call=call, kind=kind, data=data, while_status=CallStatus.RUNNING) is None:
            raise CallCancelled("the call was cancelled")

    def ask(message: str, requested_schema: dict | None, timeout_s: float | None) -> dict:
        return tool_ask(call=call, message=message, requested_schema=requested_schema, cancelled=cancelled,
                        seconds=timeout_s)

    ctx = ToolContext(tenant=session.tenant, session=session, call=call, emit=emit, cancelled=cancelled, ask=ask)
    source = source_for(tool.source) if tool is not None else None
    deadline = time.monotonic() + (tool.timeout_s if tool is not None else 30.0)  # the executor's own timer rules
    attempt = 1
    while True:
        run = metrics.stopwatch("execution")
        outcome = _invoke(call, source, ctx, attempt=attempt, deadline=deadline)
        run.stop_with(call_source, call)
        if outcome is None:
            return None  # whoever cancelled (or timed out) the call already settled it
        with call_span(call, "after_steps"):
            result_steps_run(outcome)
            if not effects_record(outcome, while_status=CallStatus.RUNNING):
                return None
        if outcome.retry_after is None:
            break
        # The wait ends early at a cancel or the timeout, which settle the call themselves.
        if cancelled.wait(outcome.retry_after) or not _next_attempt(call):
            return None
        attempt += 1
    return outcome


def _invoke(call: ToolCall, source, ctx: ToolContext, *, attempt: int, deadline: float) -> Outcome | None:
    """One run of the tool, as an outcome for the after-execution steps; None when the call was cancelled."""
    outcome = Outcome(call=call, tool=call.tool, attempt=attempt, deadline=deadline)
    try:
        if source is None:
            raise ToolError(f"no executor handles {call.tool_name}", error_type="ToolUnavailable")
        result = tool_result(source.invoke(call.tool, call.effective_input, ctx))
        if result["state"] == "error":  # a tool that answers with an error result failed, as if it raised
            raise ToolError(result_text(result) or "the tool reported an error")
    except CallCancelled:
        return None
    except ToolError as exc:
        outcome.fail(exc.error_type, str(exc))
        outcome.transient = error_is_transient(exc)
        return outcome
    except Exception:
        logger.exception("tool %s raised on call %s", call.tool_name, call.pk)
        outcome.fail("ToolFailed", "the tool failed with an unexpected error")
        return outcome
    outcome.result = result
    return outcome


def _next_attempt(call: ToolCall) -> bool:
    """Count the next run, if the call still runs."""
    moved = ToolCall.objects.for_tenant(call.tenant_id).filter(pk=call.pk, status=CallStatus.RUNNING).update(
        attempts=F("attempts") + 1)
    if moved:
        call.attempts += 1
    return bool(moved)


def call_time_out(*, call: ToolCall, timeout_s: float) -> bool:
    return call_fail(call=call, error_type="TimedOut", message=f"the tool did not finish within {timeout_s:g} s",
                     status=CallStatus.TIMED_OUT, from_statuses=[CallStatus.RUNNING, CallStatus.AWAITING_USER])


def call_settle_orphan(call: ToolCall, reason: str, *, lease_lapsed_by=None) -> str:
    """A running call whose process died: re-queue it if its tool is idempotent, else fail it (WorkerLost).
    With `lease_lapsed_by`, only while its lease still ends before that time (a renewal since keeps it)."""
    idempotent = call.tool is not None and call.tool.idempotent
    condition = lease_lapsed_condition(lease_lapsed_by) if lease_lapsed_by is not None else None
    if idempotent and call.attempts < MAX_ATTEMPTS:
        if call_transition(call=call, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.QUEUED,
                           condition=condition, lease_until=None, dispatched_at=None,
                           event_data={"retry": call.attempts + 1}):
            return "requeued"
    elif call_fail(call=call, error_type="WorkerLost", message=reason, from_statuses=[CallStatus.RUNNING],
                   condition=condition, lease_until=None, event_data={"reason": reason}):
        return "failed"
    return "unchanged"
