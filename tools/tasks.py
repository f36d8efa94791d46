"""Celery tasks of the distributed mode: thin wrappers that take ids or names and call the worker's side
(`tools.calls.worker`) or the runtime's periodic jobs (`tools.calls.runtime`)."""
import os

from celery import shared_task
from celery.beat import PersistentScheduler
from celery.signals import worker_init, worker_process_init, worker_process_shutdown
from django.conf import settings

from common import metrics
from tools.calls.executors import RUN_CALL_TASK
from tools.calls.runtime import BACKGROUND_TASK, PERIODIC_TASK, background_threads, runtime
from tools.calls.worker import ClaimOutcome, worker_run_call

WAIT_RETRY_S = 0.2


@shared_task(name=RUN_CALL_TASK, bind=True, acks_late=True, max_retries=None, ignore_result=True)
def run_call(self, call_id: str) -> str:
    outcome = worker_run_call(call_id=call_id)
    if outcome == ClaimOutcome.WAIT:
        raise self.retry(countdown=WAIT_RETRY_S)
    return outcome


@shared_task(name=PERIODIC_TASK, ignore_result=True)
def run_periodic(name: str) -> None:
    job = runtime().periodic_jobs().get(name)
    if job is not None:
        job[0]()


@shared_task(name=BACKGROUND_TASK, ignore_result=True)
def run_background(name: str, args: list) -> None:
    background_threads().hand(name, args)  # returns at once: the job runs in this process's background threads


class RuntimeScheduler(PersistentScheduler):
    """Celery beat's scheduler (settings.CELERY_BEAT_SCHEDULER): every periodic job of the runtime (expiry, the
    reaper, the dispatcher, …) as a `tools.periodic` task, read when beat starts, once Django is set up."""

    def setup_schedule(self):
        runtime().beat_schedule(self.app)
        super().setup_schedule()


@worker_process_init.connect
def start_worker_process(**kwargs) -> None:
    runtime().worker_process_start()
    # Its metrics (common.metrics): a process id an ended child had starts without that one's live gauges; a
    # child runs one call at a time, so the worker's capacity is the sum over its children.
    metrics.process_dead(os.getpid())
    metrics.executor_capacity("celery", 1)


@worker_process_shutdown.connect
def forget_worker_process(pid=None, **kwargs) -> None:
    """A child that ends takes its live gauges (busy, capacity) out of the sums."""
    metrics.process_dead(pid or os.getpid())


@worker_init.connect
def sweep_metrics(**kwargs) -> None:
    """A worker starting: the metrics files of processes that ended are removed (common.metrics.sweep); on a host
    of workers alone, TOOLKEEPER_WORKER_METRICS_ADDR serves their sums (without the database's gauges, which the
    servers' scrape has)."""
    metrics.sweep()
    metrics.serve_on(settings.TOOLKEEPER_WORKER_METRICS_ADDR, metrics.exposition)
