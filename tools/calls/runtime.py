"""The runtime of the mode this process runs in: embedded (one server process) or distributed (server
processes, Celery workers and beat). The mode is decided once, in settings (`TOOLKEEPER_RUNTIME`,
derived from the `TOOLKEEPER_EXECUTOR` environment variable); everything else asks `runtime()`.

A runtime owns what differs between the modes:

- the executor (built from `settings.TOOLKEEPER_EXECUTOR_CLASS`): `LocalExecutor`, threads in this
  process (embedded) · `CeleryExecutor`, tasks for the workers (distributed);
- the waiter (`tools.calls.waiting`): `InProcessWaiter` · `ChannelLayerWaiter`;
- the periodic runner: a timer thread in the server process · Celery beat (`beat_schedule`);
- start-up recovery: at `start()`, orphaned `running` calls settled and `queued` ones submitted again ·
  the reaper and the dispatcher, periodic jobs of the distributed runtime.

Apps register periodic jobs (`tools.catalog.registry.register_periodic`); the runtime runs them.
"""
import logging
import queue
import threading
import time

from celery import current_app
from django.conf import settings
from django.db import close_old_connections, transaction
from django.utils.module_loading import import_string

from tools.calls.execution import call_settle_orphan
from tools.calls.waiting import ChannelLayerWaiter, InProcessWaiter, Waiter
from tools.calls.worker import calls_reap
from tools.catalog.registry import background_job, periodic_jobs
from tools.models import CallStatus, ToolCall
from tools.python.decorators import tool_processes_warm

# How a worker is started (`serve_cluster`, the Makefile's `worker`): without gossip, mingle and the worker heartbeat,
# which nothing here uses and which, on a Redis broker, can leave a worker connected but consuming nothing after Redis
# restarts (docs/architecture.md, "Workers and the broker").
WORKER_OPTIONS = ("--without-gossip", "--without-mingle", "--without-heartbeat")

logger = logging.getLogger("toolkeeper.calls")

PERIODIC_TASK = "tools.periodic"
BACKGROUND_TASK = "tools.background"


def background_run(name: str, args) -> None:
    """Run a registered background job (`tools.catalog.registry.register_background`); an unknown name does nothing."""
    job = background_job(name)
    if job is None:
        logger.warning("no background job named %s", name)
        return
    try:
        job(*args)
    finally:
        close_old_connections()


class BackgroundThreads:
    """A process's background threads (daemons: stopping the process does not wait for a slow receiver).

    A job already waiting to start is not handed over again: it has not yet read what the new one would read,
    so a burst of kicks while the threads are busy makes one more run, not one per kick.
    """

    def __init__(self, threads: int = 2):
        self.threads = threads
        self._jobs: queue.SimpleQueue | None = None
        self._waiting: set = set()  # (name, args) of jobs handed over and not started yet
        self._lock = threading.Lock()

    def hand(self, name: str, args=()) -> None:
        job = (name, repr(tuple(args)))
        with self._lock:
            if job in self._waiting:
                return
            self._waiting.add(job)
            if self._jobs is None:  # started on first use: in a Celery worker, in the process that got the task
                self._jobs = queue.SimpleQueue()
                for n in range(self.threads):
                    threading.Thread(target=self._serve, name=f"toolkeeper-background-{n}", daemon=True).start()
        self._jobs.put((job, name, tuple(args)))

    def _serve(self) -> None:
        while True:
            job, name, args = self._jobs.get()
            with self._lock:
                self._waiting.discard(job)
            try:
                background_run(name, args)
            except Exception:
                logger.exception("background job %s failed", name)


_background_threads: BackgroundThreads | None = None
_background_lock = threading.Lock()


def background_threads() -> BackgroundThreads:
    """This process's background threads (both modes: the server's embedded, each worker process's distributed)."""
    global _background_threads
    if _background_threads is None:
        with _background_lock:
            if _background_threads is None:
                _background_threads = BackgroundThreads()
    return _background_threads


class Runtime:
    name = ""
    waiter: Waiter

    def __init__(self):
        self._executor = None
        self._lock = threading.Lock()

    @property
    def executor(self):
        """The executor named by settings, built on first use."""
        if self._executor is None:
            with self._lock:
                if self._executor is None:
                    self._executor = import_string(settings.TOOLKEEPER_EXECUTOR_CLASS)()
        return self._executor

    @executor.setter
    def executor(self, executor) -> None:
        self._executor = executor

    def periodic_jobs(self) -> dict:
        """name → (function, every_s): what the apps registered, and this mode's own."""
        return periodic_jobs()

    def run_soon(self, name: str, *args) -> None:
        """Hand a registered background job to this mode's workers; call it after commit."""
        raise NotImplementedError

    def start(self) -> None:
        """Called once by the server process (toolkeeper.asgi) when it starts."""

    def worker_process_start(self) -> None:
        """Each Celery worker process starts its own tool processes (tools declared with isolation="process")."""
        tool_processes_warm()


class EmbeddedRuntime(Runtime):
    """One server process does everything: it runs the calls, hears them settle, runs the periodic jobs,
    and on start takes over the calls a stopped process left behind (the local executor lives in one
    process, so every call still `running` was orphaned)."""

    name = "embedded"
    waiter = InProcessWaiter()

    def run_soon(self, name: str, *args) -> None:
        background_threads().hand(name, args)

    def calls_recover(self) -> dict:
        """Running calls are re-run if idempotent, else failed (WorkerLost); queued calls go to the executor."""
        interrupted = 0
        with transaction.atomic():
            for call in ToolCall.all_tenants.select_related("tool").filter(status=CallStatus.RUNNING):
                outcome = call_settle_orphan(call, "the server stopped while the call ran")
                interrupted += outcome == "failed"
        queued = list(ToolCall.all_tenants.select_related("tool", "tenant").filter(status=CallStatus.QUEUED)
                      .order_by("created_at"))
        for call in queued:
            self.executor.submit(call)
        return {"requeued": len(queued), "interrupted": interrupted}

    def run_due_jobs(self, last_run: dict, now: float) -> None:
        for name, (func, every_s) in self.periodic_jobs().items():
            if now - last_run.get(name, 0.0) < every_s:
                continue
            last_run[name] = now
            try:
                func()
            except Exception:
                logger.exception("periodic job %s failed", name)
            finally:
                close_old_connections()

    def start(self, *, tick_s: float = 1.0) -> threading.Thread:
        def run():
            try:
                outcome = self.calls_recover()
                if any(outcome.values()):
                    logger.warning("recovered calls from the previous run: %s", outcome)
            except Exception:
                logger.exception("call recovery failed")
            finally:
                close_old_connections()
            tool_processes_warm()
            last_run: dict = {}
            while True:
                self.run_due_jobs(last_run, time.monotonic())
                time.sleep(tick_s)

        thread = threading.Thread(target=run, name="toolkeeper-embedded", daemon=True)
        thread.start()
        return thread


class DistributedRuntime(Runtime):
    """Server processes take requests and hand calls to Celery workers; beat runs the periodic jobs, among
    them the recovery of calls whose worker died (the reaper) or whose dispatch failed (the dispatcher)."""

    name = "distributed"
    waiter = ChannelLayerWaiter()

    def run_soon(self, name: str, *args) -> None:
        """A Celery task whose worker hands the job to its process's background threads and returns at once, so
        a slow job never holds a worker slot that calls need."""
        try:
            current_app.send_task(BACKGROUND_TASK, args=(name, list(args)), ignore_result=True)
        except Exception:  # the broker is down: the app's periodic job picks the work up
            logger.exception("could not hand background job %s to the workers", name)

    def periodic_jobs(self) -> dict:
        return {"tools.reap": (self.calls_reap, 5), "tools.dispatch_pending": (self.calls_dispatch_pending, 5),
                **periodic_jobs()}

    def calls_reap(self) -> dict:
        """Settle the calls of dead workers, and send the re-queued ones at once."""
        counts = calls_reap()
        if counts["requeued"]:
            self.executor.dispatch_pending(min_age_s=0)
        return counts

    def calls_dispatch_pending(self) -> int:
        return self.executor.dispatch_pending()

    def beat_schedule(self, app) -> None:
        """Have Celery beat run every periodic job (as `tools.periodic` tasks)."""
        for name, (_func, every_s) in self.periodic_jobs().items():
            app.add_periodic_task(every_s, app.signature(PERIODIC_TASK, args=(name,)), name=name)

_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def runtime() -> Runtime:
    """This process's runtime, of the class `settings.TOOLKEEPER_RUNTIME` names."""
    global _runtime
    if _runtime is None:
        with _runtime_lock:
            if _runtime is None:
                _runtime = import_string(settings.TOOLKEEPER_RUNTIME)()
    return _runtime
