"""Running one call: claim it, invoke its source, store the outcome. Shared by every executor."""
import logging
import threading

from django.utils import timezone

from .decorators import CallCancelled, ToolContext, ToolError
from .events import call_event_append, call_transition
from .models import AgentSession, CallStatus, EventKind, ToolCall
from .registry import source_for
from .results import call_error, error_result, tool_result

logger = logging.getLogger("toolkeeper.calls")


def _fail_fields(call: ToolCall, error_type: str, message: str) -> dict:
    error = call_error(error_type=error_type, message=message, tool=call.tool_name, call_id=call.call_id)
    return {"error": error, "result": error_result(error)}


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
        value = source.invoke(tool, call.effective_input, ctx)
        outcome = {"to_status": CallStatus.SUCCEEDED, "result": tool_result(value), "error": None}
    except CallCancelled:
        return  # whoever cancelled (or timed out) the call already settled it
    except ToolError as exc:
        outcome = {"to_status": CallStatus.FAILED, **_fail_fields(call, exc.error_type, str(exc))}
    except Exception:
        logger.exception("tool %s raised on call %s", call.tool_name, call.pk)
        outcome = {"to_status": CallStatus.FAILED,
                   **_fail_fields(call, "ToolFailed", "the tool failed with an unexpected error")}
    event = {"error": outcome["error"]} if outcome["error"] else None
    call_transition(call=call, from_statuses=[CallStatus.RUNNING], event_data=event, **outcome)


def call_time_out(*, call: ToolCall, timeout_s: float) -> bool:
    fields = _fail_fields(call, "TimedOut", f"the tool did not finish within {timeout_s:g} s")
    return call_transition(call=call, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.TIMED_OUT,
                           event_data={"error": fields["error"]}, **fields)


def run_meta_tool(ctx) -> None:
    """Meta tools change the session itself; they run inline, in the request."""
    from .selectors import META_RESET_TOOLS
    from .services import session_groups_reset

    call = ctx.call
    ctx.transition(CallStatus.RUNNING, started_at=timezone.now())
    if call.tool_name == META_RESET_TOOLS:
        try:
            value = session_groups_reset(session=ctx.session, choices=call.effective_input)
        except ToolError as exc:
            call_transition(call=call, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.FAILED,
                            **_fail_fields(call, exc.error_type, str(exc)))
            return
        call_transition(call=call, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.SUCCEEDED,
                        result=tool_result(value))
