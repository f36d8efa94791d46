"""Executors take queued calls and have them run. The runtime (`tools.calls.runtime`) builds the one named by
`settings.TOOLKEEPER_EXECUTOR_CLASS`; both take `submit(call)` and `cancel(call_id)`.

- `LocalExecutor`: a thread pool in the server process (the embedded mode). It keeps each tenant under
  its `max_parallel_calls`, runs a session's `concurrency_safe=False` calls one at a time in the order
  they arrived, enforces each tool's timeout, and stops a call's tool when the call times out or is
  cancelled (tools.python.isolation).
- `CeleryExecutor`: sends each call to the Celery workers as a `tools.run_call` task, by name (the
  worker's side is `tools.calls.worker`), and sends again what a failed or lost dispatch left queued.
"""
import copy
import heapq
import itertools
import logging
import threading
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.db import close_old_connections
from django.db.models import Q
from django.utils import timezone

from common import metrics
from tools.calls.execution import call_claim, call_execute, call_time_out
from tools.models import CallStatus, ToolCall
from tools.python.isolation import CallStop

RUN_CALL_TASK = "tools.run_call"

logger = logging.getLogger("toolkeeper.calls")


@dataclass
class Job:
    call: ToolCall
    call_id: str
    tenant_id: int
    session_id: str
    concurrency_safe: bool
    max_parallel: int
    timeout_s: float
    cancelled: CallStop = field(default_factory=CallStop)
    started: bool = False  # claimed at submission: handed to the pool


class Deadlines:
    """One thread that fires the deadlines of running calls, instead of a timer thread started per call.

    `arm` returns a token; `disarm(token)` before the deadline and nothing fires. A deadline that passes
    runs its action on a thread of its own (it is rare, and may wait for the database), so one slow
    time-out never delays the next.
    """

    def __init__(self):
        self._heap: list[tuple[float, int]] = []
        self._actions: dict[int, tuple] = {}
        self._numbers = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, delay_s: float, action, *args) -> int:
        token = next(self._numbers)
        with self._changed:
            self._actions[token] = (action, args)
            heapq.heappush(self._heap, (time.monotonic() + delay_s, token))
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="toolkeeper-deadlines", daemon=True)
                self._thread.start()
            if self._heap[0][1] == token:
                self._changed.notify()
        return token

    def disarm(self, token: int) -> None:
        with self._changed:
            self._actions.pop(token, None)  # its heap entry is dropped when it comes up

    def _serve(self) -> None:
        while True:
            with self._changed:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._changed.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                _, token = heapq.heappop(self._heap)
                due = self._actions.pop(token, None)
            if due is not None:
                action, args = due
                threading.Thread(target=action, args=args, name="toolkeeper-time-out", daemon=True).start()


class LocalExecutor:
    def __init__(self, workers: int | None = None):
        workers = settings.TOOLKEEPER_LOCAL_WORKERS if workers is None else workers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="toolkeeper-call")
        self._workers = workers
        self._lock = threading.Lock()
        self._waiting: deque[Job] = deque()
        self._running: dict[str, Job] = {}
        self._running_per_tenant: Counter = Counter()
        self._busy_sessions: set[str] = set()
        self._deadlines = Deadlines()
        metrics.executor_capacity("local", workers)

    def queued_fields(self) -> dict:
        """Fields the dispatch step writes with the move to `queued`: none here."""
        return {}

    @staticmethod
    def _job(call: ToolCall) -> Job:
        tool = call.tool
        return Job(
            call=copy.copy(call), call_id=str(call.pk), tenant_id=call.tenant_id, session_id=str(call.session_id),
            concurrency_safe=tool.concurrency_safe if tool else True,
            max_parallel=max(1, call.tenant.max_parallel_calls), timeout_s=tool.timeout_s if tool else 30.0,
        )

    def submit(self, call: ToolCall, *, stamped: bool = False) -> bool:
        job = self._job(call)
        with self._lock:
            self._waiting.append(job)
            self._start_eligible()
        return True

    def claim_now(self, call: ToolCall) -> Job | None:
        """A place for a queued call that may start at once (its tenant under its cap with none of its calls
        waiting; for an unsafe tool, its session free), counted as running from now; None when it must
        queue. The caller moves the call to `running` in its own transaction and, once that commits, hands
        the job to `start_claimed`; if it does not commit, to `release`. Only while a pool thread is free:
        a call marked running must not wait for one (a cancel would then interrupt a call that never ran)."""
        job = self._job(call)
        with self._lock:
            if (len(self._running) >= self._workers or not self._may_start(job)
                    or any(waiting.tenant_id == job.tenant_id for waiting in self._waiting)):
                return None
            self._count_running(job)
        return job

    def start_claimed(self, job: Job, call: ToolCall) -> None:
        with self._lock:
            if job.started:
                return
            job.started = True
        job.call = copy.copy(call)
        self._pool.submit(self._run, job, claimed=True)

    def release(self, job: Job) -> None:
        with self._lock:
            self._uncount_running(job)
            self._start_eligible()

    def cancel(self, call_id) -> None:
        """Wake a running call's tool; the caller has already settled the call's status."""
        with self._lock:
            job = self._running.get(str(call_id))
            if job is not None:
                job.cancelled.set()
            for waiting in self._waiting:
                if waiting.call_id == str(call_id):
                    waiting.cancelled.set()

    def _may_start(self, job: Job) -> bool:
        return self._running_per_tenant[job.tenant_id] < job.max_parallel and (
            job.concurrency_safe or job.session_id not in self._busy_sessions)

    def _count_running(self, job: Job) -> None:
        self._running[job.call_id] = job
        metrics.executor_busy("local", len(self._running))
        self._running_per_tenant[job.tenant_id] += 1
        if not job.concurrency_safe:
            self._busy_sessions.add(job.session_id)

    def _uncount_running(self, job: Job) -> None:
        self._running.pop(job.call_id, None)
        metrics.executor_busy("local", len(self._running))
        self._running_per_tenant[job.tenant_id] -= 1
        if not job.concurrency_safe:
            self._busy_sessions.discard(job.session_id)

    def _start_eligible(self) -> None:
        held_tenants: set[int] = set()
        held_sessions: set[str] = set()
        remaining: deque[Job] = deque()
        while self._waiting:
            job = self._waiting.popleft()
            # FIFO per tenant and per session: once a job waits, later ones of its kind wait too.
            tenant_full = self._running_per_tenant[job.tenant_id] >= job.max_parallel
            session_busy = not job.concurrency_safe and (
                job.session_id in self._busy_sessions or job.session_id in held_sessions)
            if job.tenant_id in held_tenants or tenant_full or session_busy:
                if tenant_full:
                    held_tenants.add(job.tenant_id)
                if not job.concurrency_safe:
                    held_sessions.add(job.session_id)
                remaining.append(job)
                continue
            self._count_running(job)
            self._pool.submit(self._run, job)
        self._waiting = remaining

    def _run(self, job: Job, *, claimed: bool = False) -> None:
        deadline = None
        try:
            call = job.call if claimed else call_claim(call=job.call)
            if call is not None and not job.cancelled.is_set():
                deadline = self._deadlines.arm(job.timeout_s, self._time_out, job, call)
                call_execute(call=call, cancelled=job.cancelled)
        except Exception:
            logger.exception("executor failed on call %s", job.call_id)
            close_old_connections()  # a broken connection is not reused by the next call
        finally:
            if deadline is not None:
                self._deadlines.disarm(deadline)
            with self._lock:
                self._uncount_running(job)
                self._start_eligible()

    def _time_out(self, job: Job, call: ToolCall) -> None:
        try:
            call_time_out(call=call, timeout_s=job.timeout_s)
        except Exception:
            logger.exception("could not time out call %s", job.call_id)
        finally:
            job.cancelled.set()
            close_old_connections()


class CeleryExecutor:
    """Hands calls to Celery workers. A failed dispatch (broker down) leaves the call queued; the
    periodic dispatcher (`dispatch_pending`) sends it once the broker is back."""

    def queued_fields(self) -> dict:
        """The dispatch step marks the call dispatched as it queues it (the message goes right after commit):
        one statement fewer per call than marking it after the send."""
        return {"dispatched_at": timezone.now()}

    def submit(self, call: ToolCall, *, stamped: bool = False) -> bool:
        """Send the call to the workers; `stamped`: its `dispatched_at` was written when it was queued."""
        timeout = call.tool.timeout_s if call.tool else 30.0
        try:
            current_app.send_task(RUN_CALL_TASK, args=[str(call.pk)], retry=False, soft_time_limit=timeout + 5,
                                  time_limit=timeout + 30)
        except Exception:
            logger.warning("could not dispatch call %s; it stays queued", call.pk, exc_info=True)
            if stamped:  # not sent after all: the periodic dispatcher sends it at its next pass
                ToolCall.objects.for_tenant(call.tenant_id).filter(pk=call.pk).update(dispatched_at=None)
            return False
        if not stamped:
            ToolCall.objects.for_tenant(call.tenant_id).filter(pk=call.pk).update(dispatched_at=timezone.now())
        return True

    def cancel(self, call_id) -> None:
        """Workers notice cancel requests themselves (their watchdog reads the call)."""

    def dispatch_pending(self, *, min_age_s: float = 2.0, redispatch_after_s: float = 60.0) -> int:
        """Periodic: (re)send queued calls whose dispatch failed (broker down) or whose message was lost."""
        now = timezone.now()
        never_or_long_ago = Q(dispatched_at__isnull=True) | Q(
            dispatched_at__lt=now - timedelta(seconds=redispatch_after_s))
        pending = ToolCall.all_tenants.select_related("tool", "tenant").filter(
            never_or_long_ago, status=CallStatus.QUEUED, created_at__lte=now - timedelta(seconds=min_age_s),
        ).order_by("created_at")[:1000]
        return sum(bool(self.submit(call)) for call in pending)
