"""A call's trace and log context (docs/observability.md, "Traces" and "Logs"), on `common.tracing` and `common.logs`.

- `call_trace_fields(traceparent)`: at submission, the ids of the call's trace (the app's trace continued when it
  sent a valid `traceparent`), stored on the call: `trace_id`, `trace_span_id` (its root span), `trace_parent_id`
  (the app's span the root continues). Empty when tracing is off or the sampler drops the call.
- `call_span(call, step)`: where a call's work runs (the pipeline and its steps, the execution, the after-steps), a
  span of its trace, child of the stored root — in whatever process the work runs — and the log context of the
  records logged meanwhile (call_id, tenant, trace_id, step).
- `call_moved(call, before, after)`: from `tools.calls.events`, after a status change commits: a wait for a
  person or an outside system that ended becomes its span (from the status event that began it), and a call that
  reached its end records its root span, received → settled.

Each returns at once when neither tracing nor JSON logs are on.
"""
import contextlib

from django.db import transaction

from common import logs, tracing
from common.tracing import CallTrace
from tools.models import TERMINAL_STATUSES, CallEvent, CallStatus, EventKind, ToolCall

NO_TRACE: dict = {}
WAIT_SPANS = {CallStatus.AWAITING_APPROVAL: "approval_wait", CallStatus.AWAITING_EXTERNAL: "external_wait"}
ERROR_STATUSES = frozenset({CallStatus.FAILED, CallStatus.TIMED_OUT})


def call_trace_fields(traceparent=None) -> dict:
    """The trace fields of a new call (see the module's docstring)."""
    if not tracing.ENABLED:
        return NO_TRACE
    trace = tracing.trace_start(traceparent)
    if trace is None:
        return NO_TRACE
    return {"trace_id": trace.trace_hex, "trace_span_id": f"{trace.span_id:016x}",
            "trace_parent_id": f"{trace.parent_id:016x}" if trace.parent_id else ""}


def call_trace(call: ToolCall) -> CallTrace | None:
    return CallTrace.of(call.trace_id, call.trace_span_id, call.trace_parent_id) if call.trace_id else None


def _tenant(call: ToolCall) -> str:
    """The tenant's slug when it is at hand (no query for a log line), else its id."""
    if ToolCall.tenant.is_cached(call):
        return call.tenant.slug
    return str(call.tenant_id)


def call_span(call: ToolCall, step: str, attributes: dict | None = None, *, client: bool = False):
    """A context manager for a part of a call's work: its span (yielded; None when untraced) and its log context."""
    traced = tracing.ENABLED and bool(call.trace_id)
    if not (traced or logs.ACTIVE):
        return tracing.NO_SPAN
    return _call_span(call, step, attributes, traced, client)


@contextlib.contextmanager
def _call_span(call: ToolCall, step: str, attributes: dict | None, traced: bool, client: bool):
    with logs.log_context(call_id=str(call.pk), tenant=_tenant(call), trace_id=call.trace_id or None, step=step), \
            tracing.child_span(call_trace(call) if traced else None, step, attributes, client=client) as span:
        yield span


def call_moved(call: ToolCall, before: str | None, after: str) -> None:
    """After `call` moved from `before` to `after` (in the transaction of the move): its wait's span, its root."""
    if not (tracing.ENABLED and call.trace_id):
        return
    if before in WAIT_SPANS and before != after:
        ended = tracing.now_ns()
        transaction.on_commit(lambda: _wait_record(call, before, ended))
    if after in TERMINAL_STATUSES:
        transaction.on_commit(lambda: _root_record(call))


def _ns(moment) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def _wait_record(call: ToolCall, waited: str, end_ns: int) -> None:
    """The wait from the status event that began it to the move that ended it (a reviewer decided, a result came, it
    expired, it was cancelled)."""
    began = (CallEvent.objects.for_tenant(call.tenant_id)
             .filter(call_id=call.pk, kind=EventKind.STATUS, data__status=waited)
             .order_by("-seq").values_list("at", flat=True).first())
    tracing.span_record(call_trace(call), WAIT_SPANS[waited], start_ns=_ns(began) if began else end_ns,
                        end_ns=end_ns, attributes={"toolkeeper.call.id": str(call.pk),
                                                   "toolkeeper.wait.outcome": call.status})


def _root_record(call: ToolCall) -> None:
    """The call's root span: received (its row's creation) → settled (its end, committed: now, as this runs after
    the commit of the move that settled it, when the spans of the work that settled it have ended)."""
    now = tracing.now_ns()
    start_ns = _ns(call.created_at) if call.created_at is not None else now
    end_ns = max(_ns(call.finished_at), now) if call.finished_at is not None else now
    error = None
    if call.status in ERROR_STATUSES:
        error = (call.error or {}).get("errorType") if isinstance(call.error, dict) else None
        error = str(error or call.status)
    tracing.root_span_record(call_trace(call), f"execute_tool {call.tool_name}", start_ns=start_ns, end_ns=end_ns,
                             error=error, attributes={
                                 "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.tool_name,
                                 "gen_ai.tool.call.id": call.call_id, "toolkeeper.call.id": str(call.pk),
                                 "toolkeeper.tenant": _tenant(call), "toolkeeper.call.status": call.status,
                             })


def span_failed(span, error_type: str) -> None:
    """Mark a call's span (from `call_span`) failed with the error's type; a no-op for an untraced call."""
    tracing.span_error(span, error_type)
