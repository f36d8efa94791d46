"""Running one call on an executor: claim it, invoke its source, store the outcome; time it out; settle
it when the process that ran it died. Shared by both executors (`tools.executors` in the server process,
`tools.worker` in Celery workers), which decide when and where a call runs, not how.
"""
import logging
import threading

from django.utils import timezone

from .decorators import CallCancelled, ToolContext, ToolError
from .events import call_event_append, call_fail, call_transition
from .models import AgentSession, CallStatus, EventKind, ToolCall
from .registry import source_for
from .results import result_text, tool_result

logger = logging.getLogger("toolkeeper.calls")

MAX_ATTEMPTS = 3  # runs of an idempotent tool's call whose process died, before it fails with WorkerLost


def call_claim(*, call: ToolCall) -> ToolCall | None:
    """Take a queued call for running. Only one claimant ever wins (the UPDATE checks the status)."""
    moved = call_transition(call=call, from_statuses=[CallStatus.QUEUED], to_status=CallStatus.RUNNING,
                            started_at=timezone.now(), attempts=1)
    return call if moved else None


def call_execute(*, call: ToolCall, cancelled: threading.Event) -> None:
    """Invoke the claimed call's tool and record the outcome, unless someone settled it meanwhile."""
    tool = call.tool
    session: AgentSession = call.session

    def emit(text: str = "", *, progress: float | None = None, kind: str | None = None) -> None:
        if cancelled.is_set():
            raise CallCancelled("the call was cancelled")
        data = {"text": str(text)}
        if progress is not None:
            data["progress"] = max(0.0, min(1.0, float(progress)))
        kind = kind or (EventKind.PROGRESS if progress is not None else EventKind.OUTPUT)
        # Only while the call runs: a call settled by a timeout or a cancel shows nothing after its last status.
        if call_event_append(call=call, kind=kind, data=data, while_status=CallStatus.RUNNING) is None:
            raise CallCancelled("the call was cancelled")

    ctx = ToolContext(tenant=session.tenant, session=session, call=call, emit=emit, cancelled=cancelled)
    source = source_for(tool.source) if tool is not None else None
    try:
        if source is None:
            raise ToolError(f"no executor handles {call.tool_name}", error_type="ToolUnavailable")
        result = tool_result(source.invoke(tool, call.effective_input, ctx))
        if result["state"] == "error":  # a tool that answers with an error result failed, as if it raised
            raise ToolError(result_text(result) or "the tool reported an error")
    except CallCancelled:
        return  # whoever cancelled (or timed out) the call already settled it
    except ToolError as exc:
        call_fail(call=call, error_type=exc.error_type, message=str(exc), from_statuses=[CallStatus.RUNNING])
        return
    except Exception:
        logger.exception("tool %s raised on call %s", call.tool_name, call.pk)
        call_fail(call=call, error_type="ToolFailed", message="the tool failed with an unexpected error",
                  from_statuses=[CallStatus.RUNNING])
        return
    call_transition(call=call, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.SUCCEEDED,
                    result=result, error=None)


def call_time_out(*, call: ToolCall, timeout_s: float) -> bool:
    return call_fail(call=call, error_type="TimedOut", message=f"the tool did not finish within {timeout_s:g} s",
                     status=CallStatus.TIMED_OUT, from_statuses=[CallStatus.RUNNING])


def call_settle_orphan(call: ToolCall, reason: str) -> str:
    """A running call whose process died: re-queue it if its tool is idempotent, else fail it (WorkerLost)."""
    idempotent = call.tool is not None and call.tool.idempotent
    if idempotent and call.attempts < MAX_ATTEMPTS:
        if call_transition(call=call, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.QUEUED,
                           lease_until=None, dispatched_at=None, event_data={"retry": call.attempts + 1}):
            return "requeued"
    elif call_fail(call=call, error_type="WorkerLost", message=reason, from_statuses=[CallStatus.RUNNING],
                   lease_until=None, event_data={"reason": reason}):
        return "failed"
    return "unchanged"
