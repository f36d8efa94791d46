"""Celery tasks: thin wrappers that fetch by id and call the services."""
from celery import shared_task
from celery.signals import worker_process_init

from .decorators import tool_processes_warm
from .registry import periodic_jobs
from .worker import ClaimOutcome, worker_run_call

WAIT_RETRY_S = 0.2


@shared_task(name="tools.run_call", bind=True, acks_late=True, max_retries=None, ignore_result=True)
def run_call(self, call_id: str) -> str:
    outcome = worker_run_call(call_id=call_id)
    if outcome == ClaimOutcome.WAIT:
        raise self.retry(countdown=WAIT_RETRY_S)
    return outcome


@shared_task(name="tools.periodic", ignore_result=True)
def run_periodic(name: str) -> None:
    job = periodic_jobs().get(name)
    if job is not None:
        job[0]()


@worker_process_init.connect
def warm_tool_processes(**kwargs) -> None:
    """Each worker process starts its own tool processes (tools declared with isolation="process")."""
    tool_processes_warm()
