"""The embedded mode's background duties, inside the one server process.

On start it takes over the calls a stopped process left behind (the local executor lives in one
process, so every call still `running` was orphaned), starts the tool processes if a tool runs in one,
then runs the periodic jobs apps register
(expiry, escalation, …) on a timer — the work Celery beat does in distributed mode.
"""
import logging
import threading
import time

from django.db import close_old_connections, transaction

from .decorators import tool_processes_warm
from .models import CallStatus, ToolCall
from .worker import call_settle_orphan

logger = logging.getLogger("toolkeeper.calls")


def calls_recover() -> dict:
    """Running calls are re-run if idempotent, else failed (WorkerLost); queued calls go to the executor."""
    from .executors import get_executor

    interrupted = 0
    with transaction.atomic():
        for call in ToolCall.all_tenants.select_related("tool").filter(status=CallStatus.RUNNING):
            outcome = call_settle_orphan(call, "the server stopped while the call ran")
            interrupted += outcome == "failed"
    queued = list(ToolCall.all_tenants.select_related("tool", "tenant").filter(status=CallStatus.QUEUED)
                  .order_by("created_at"))
    for call in queued:
        get_executor().submit(call)
    return {"requeued": len(queued), "interrupted": interrupted}


def run_due_jobs(last_run: dict, now: float) -> None:
    from .registry import periodic_jobs

    for name, (func, every_s) in periodic_jobs().items():
        if now - last_run.get(name, 0.0) < every_s:
            continue
        last_run[name] = now
        try:
            func()
        except Exception:
            logger.exception("periodic job %s failed", name)
        finally:
            close_old_connections()


def start_embedded_runtime(*, tick_s: float = 1.0) -> threading.Thread:
    def run():
        try:
            outcome = calls_recover()
            if any(outcome.values()):
                logger.warning("recovered calls from the previous run: %s", outcome)
        except Exception:
            logger.exception("call recovery failed")
        finally:
            close_old_connections()
        tool_processes_warm()
        last_run: dict = {}
        while True:
            run_due_jobs(last_run, time.monotonic())
            time.sleep(tick_s)

    thread = threading.Thread(target=run, name="toolkeeper-embedded", daemon=True)
    thread.start()
    return thread
