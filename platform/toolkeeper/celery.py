"""The Celery app of the distributed mode: `celery -A toolkeeper worker`."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolkeeper.settings")

app = Celery("toolkeeper")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
