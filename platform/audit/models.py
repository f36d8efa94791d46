from django.conf import settings
from django.db import models

from tenancy.scoping import TenantOwned


class AppendOnlyError(RuntimeError):
    pass


class Event(TenantOwned):
    """One audited action. Append-only; each row's hash covers the previous row's hash."""

    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    actor_label = models.CharField(max_length=150, blank=True, default="")
    verb = models.CharField(max_length=64)
    target = models.CharField(max_length=200, blank=True, default="")
    data = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField()
    prev_hash = models.CharField(max_length=64, blank=True, default="")
    hash = models.CharField(max_length=64)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["tenant", "target"]), models.Index(fields=["tenant", "-id"])]

    def __str__(self):
        return f"{self.verb} {self.target}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise AppendOnlyError("audit events are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnlyError("audit events are append-only")
