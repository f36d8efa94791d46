"""Calls left behind by a stopped server process. The local executor lives in one process, so
when that process starts, every call still `running` was orphaned by its predecessor."""
import logging
import threading

from django.db import close_old_connections, transaction

from .events import call_transition
from .execution import _fail_fields
from .models import CallStatus, ToolCall

logger = logging.getLogger("toolkeeper.calls")


def calls_recover() -> dict:
    """Running calls are re-run if idempotent, else interrupted; queued calls go to the executor."""
    from .executors import get_executor

    interrupted = 0
    with transaction.atomic():
        for call in ToolCall.all_tenants.select_related("tool").filter(status=CallStatus.RUNNING):
            if call.tool is not None and call.tool.idempotent:
                call_transition(call=call, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.QUEUED)
            elif call_transition(call=call, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.INTERRUPTED,
                                 **_fail_fields(call, "WorkerLost", "the server stopped while the call ran")):
                interrupted += 1
    queued = list(ToolCall.all_tenants.select_related("tool", "tenant").filter(status=CallStatus.QUEUED)
                  .order_by("created_at"))
    for call in queued:
        get_executor().submit(call)
    return {"requeued": len(queued), "interrupted": interrupted}


def start_embedded_recovery() -> None:
    def run():
        try:
            outcome = calls_recover()
            if any(outcome.values()):
                logger.warning("recovered calls from the previous run: %s", outcome)
        except Exception:
            logger.exception("call recovery failed")
        finally:
            close_old_connections()

    threading.Thread(target=run, name="toolkeeper-recovery", daemon=True).start()
