"""Per-tenant versions, and the per-process caches they keep fresh.

What a call needs of a tenant's configuration (its tool catalog, its compiled rules) is costly to build
and rarely changes. Each such kind of configuration has a version row per tenant (a model with `tenant`
and `version`); every write bumps it in the writer's transaction, and each process keeps what it built
under the version it built it for. Reading the version is one small statement; a new version means a
rebuild, in every process, whatever wrote the change.
"""
import secrets
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from django.db import IntegrityError, transaction

from .fastread import tenant_scalar

T = TypeVar("T")


def version_bump(model, tenant_id: int) -> None:
    """Mark the tenant's configuration of this kind changed (inside the caller's transaction).

    The new version is random, never +1: after a rolled-back change a counter would hand out the same
    number again, and a process could keep what it built inside that transaction under it.
    """
    version = secrets.randbits(62)
    if model.objects.for_tenant(tenant_id).update(version=version):
        return
    try:
        with transaction.atomic():
            model.objects.create(tenant_id=tenant_id, version=version)
    except IntegrityError:  # another transaction created the row first
        model.objects.for_tenant(tenant_id).update(version=version)


def version_of(model, tenant_id: int) -> int:
    return tenant_scalar(model, "version", tenant_id) or 0


class VersionedCache(Generic[T]):
    """Values built per tenant, kept in this process as long as the tenant's version in `model` stays."""

    def __init__(self, model):
        self.model = model
        self._lock = threading.Lock()
        self._entries: dict[int, tuple[int, T]] = {}

    def get(self, tenant_id: int, build: Callable[[int, int], T], version: int | None = None) -> T:
        """The value for the tenant's current version (or for `version`, read just now by the caller from the
        same model); `build(tenant_id, version)` makes it when there is none."""
        if version is None:
            version = version_of(self.model, tenant_id)
        entry = self._entries.get(tenant_id)
        if entry is not None and entry[0] == version:
            return entry[1]
        value = build(tenant_id, version)
        with self._lock:
            self._entries[tenant_id] = (version, value)
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
