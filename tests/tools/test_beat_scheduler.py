"""Celery beat runs every periodic job of the runtime: its scheduler (settings.CELERY_BEAT_SCHEDULER) reads them
when beat starts, with no import hidden in a signal handler (docs/architecture.md)."""
from django.conf import settings

from toolkeeper.celery import app
from tools import tasks
from tools.calls.runtime import PERIODIC_TASK, DistributedRuntime


def test_beat_schedules_each_periodic_job_as_a_periodic_task(tmp_path, monkeypatch):
    assert settings.CELERY_BEAT_SCHEDULER == "tools.tasks:RuntimeScheduler"
    distributed = DistributedRuntime()  # beat runs in the distributed mode only
    monkeypatch.setattr(tasks, "runtime", lambda: distributed)
    jobs = distributed.periodic_jobs()
    assert "approvals.expire" in jobs  # an app's job, registered from its AppConfig.ready
    scheduler = tasks.RuntimeScheduler(app=app, schedule_filename=str(tmp_path / "beat-schedule"))
    try:
        planned = {name: entry for name, entry in scheduler.schedule.items() if entry.task == PERIODIC_TASK}
        assert sorted(planned) == sorted(jobs)
        for name, (_func, every_s) in jobs.items():
            assert planned[name].args == (name,)
            assert planned[name].schedule.run_every.total_seconds() == every_s
    finally:
        scheduler.close()
