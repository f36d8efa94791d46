"""The Celery app of the distributed mode: `celery -A toolkeeper worker`."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolkeeper.settings")

app = Celery("toolkeeper")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_finalize.connect
def schedule_periodic_jobs(sender, **kwargs):
    """Beat runs every periodic job the apps registered (expiry, reaper, dispatcher, …)."""
    from tools.registry import periodic_jobs
    from tools.tasks import run_periodic

    for name, (_func, every_s) in periodic_jobs().items():
        sender.add_periodic_task(every_s, run_periodic.s(name), name=name)
