"""The Celery app of the distributed mode: `celery -A toolkeeper worker`."""
import gc
import os

from celery import Celery
from celery.signals import task_prerun, worker_process_init, worker_process_shutdown
from django.db import close_old_connections, connections

from common.tracing import tracing_flush, tracing_setup
from realtime.broadcast import publish_status_inline

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolkeeper.settings")

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
    publish_status_inline()  # one call at a time: its settle goes out from the task's thread (realtime.broadcast)
    tracing_setup(role="worker")  # its spans say they come from a worker (docs/observability.md)
    # Long-lived objects of a worker process stay out of the garbage collector's full passes.
    gc.collect()
    gc.freeze()


@worker_process_shutdown.connect
def flush_traces(**kwargs):
    """A worker process ends without `atexit`: the spans it still holds are exported first."""
    tracing_flush()


@task_prerun.connect
def refresh_database_connections(**kwargs):
    """Before each task, as before each request: a connection that failed or aged is closed (and opened
    again on first use)."""
    close_old_connections()

