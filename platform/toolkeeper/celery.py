"""The Celery app of the distributed mode: `celery -A toolkeeper worker`."""
import gc
import os

from celery import Celery
from celery.signals import task_prerun, worker_init, worker_process_init, worker_process_shutdown
from django.db import close_old_connections, connections

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolkeeper.settings")

from common import metrics  # noqa: E402  (after the settings module is named: it reads the metrics directory)

app = Celery("toolkeeper")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_process_init.connect
def prepare_worker_process(**kwargs):
    """A worker process runs one task at a time on one thread: it keeps its database connection between
    tasks, not pinged before each one (a round trip per task): a call's task reads its call first and opens
    the connection again if it was lost (`tools.calls.worker`); any other task fails once and runs again on its
    next period."""
    for connection in connections.all():
        connection.settings_dict["CONN_MAX_AGE"] = 60
    # Its metrics (common.metrics): a process id an ended child had starts without that one's live gauges; a
    # child runs one call at a time, so the worker's capacity is the sum over its children.
    metrics.process_dead(os.getpid())
    metrics.executor_capacity("celery", 1)
    # Long-lived objects of a worker process stay out of the garbage collector's full passes.
    gc.collect()
    gc.freeze()


@worker_process_shutdown.connect
def forget_worker_process(pid=None, **kwargs):
    """A child that ends takes its live gauges (busy, capacity) out of the sums."""
    metrics.process_dead(pid or os.getpid())


@worker_init.connect
def sweep_metrics(**kwargs):
    """A worker starting: the metrics files of processes that ended are removed (common.metrics.sweep)."""
    metrics.sweep()


@task_prerun.connect
def refresh_database_connections(**kwargs):
    """Before each task, as before each request: a connection that failed or aged is closed (and opened
    again on first use)."""
    close_old_connections()

