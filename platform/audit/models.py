from django.conf import settings
from django.db import models

from tenancy.scoping import TenantOwned


class AppendOnlyError(RuntimeError):
    pass


class Event(TenantOwned):
    """One audited action. Append-only; each row's hash covers its columns (audit.chain.HASHED_FIELDS) and the
    hash and id of the row before it in its strand."""

    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    actor_label = models.CharField(max_length=150, blank=True, default="")
    verb = models.CharField(max_length=64)
    target = models.CharField(max_length=200, blank=True, default="")
    data = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField()
    prev_hash = models.CharField(max_length=64, blank=True, default="")
    hash = models.CharField(max_length=64)
    # What made `hash` (audit.chain): rows written before the audit key was set stay plain SHA-256.
    algorithm = models.CharField(max_length=16, default="sha256")
    # Which columns `hash` covers (audit.chain.HASHED_FIELDS): 1 for the entries written before every column
    # was covered, and for any a server of that version writes (it does not name the column).
    version = models.PositiveSmallIntegerField(db_default=1)
    strand = models.PositiveSmallIntegerField(default=0)  # which of the tenant's chain strands (audit.chain)
    # How many entries each strand had when this one was appended (covered by its hash): a strand cut back
    # later has fewer than a later entry saw. Null for entries from before there were strands.
    seen = models.JSONField(null=True, blank=True)

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


class ChainHead(TenantOwned):
    """The newest state of one strand of a tenant's chain, updated in the transaction of every append to it.

    A chain alone cannot show that its newest entries were removed; the head can: it records how many
    entries there are and the newest one's id and hash. With the audit key, `signature` (an HMAC of the
    head) keeps the head itself from being rewound.
    """

    strand = models.PositiveSmallIntegerField(default=0)
    count = models.PositiveBigIntegerField(default=0)
    last_id = models.BigIntegerField(null=True, blank=True)
    hash = models.CharField(max_length=64, blank=True, default="")
    signature = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "strand"], name="one_audit_head_per_strand")]

    def __str__(self):
        return f"{self.tenant_id}/{self.strand}: {self.count} entries"
