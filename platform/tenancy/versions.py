"""Per-tenant versions, and the per-process caches they keep fresh.

What a call needs of a tenant's configuration (its tool catalog, its compiled rules) is costly to build
and rarely changes. Each such kind of configuration has a version row per tenant (a model with `tenant`
and `version`); every write bumps it in the writer's transaction, and each process keeps what it built
under the version it built it for. Reading the version is one small statement; a new version means a
rebuild, in every process, whatever wrote the change.
"""
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Generic, TypeVar

from django.db import IntegrityError, transaction

from tenancy.fastread import tenant_scalar
from tenancy.signals import version_bumped

T = TypeVar("T")

_versioned_models: list = []  # the version models of every VersionedCache, in the order they were made
# (tenant id, {version model: version}, when read) read with a request's API key or a worker's call
_known: ContextVar[tuple[int, dict, float] | None] = ContextVar("known_versions", default=None)
# How long versions read with the key or the call stand in for reading them again: a long tool run still
# sees a change made while it ran (a new redaction rule, say) when its result is stored.
KNOWN_FOR_S = 1.0


def versioned_models() -> tuple:
    """The version models the caches of this process check: read beside a request's API key."""
    return tuple(_versioned_models)


@contextmanager
def versions_known(tenant_id: int, versions: dict | None, read_at: float) -> Iterator[None]:
    """Inside the block, until KNOWN_FOR_S after `read_at` (time.monotonic() when they were read, in the
    same statement as the request's key or the worker's call), `version_of` answers from `versions`
    instead of reading each version again."""
    token = _known.set((tenant_id, dict(versions), read_at) if versions else None)
    try:
        yield
    finally:
        _known.reset(token)


def version_bump(model, tenant_id: int) -> None:
    """Mark the tenant's configuration of this kind changed (inside the caller's transaction).

    The new version is random, never +1: after a rolled-back change a counter would hand out the same
    number again, and a process could keep what it built inside that transaction under it.
    """
    version = secrets.randbits(62)
    known = _known.get()
    if known is not None and known[0] == tenant_id:
        known[1].pop(model, None)  # read from the database from now on: it knows whether this change commits
    if not model.objects.for_tenant(tenant_id).update(version=version):
        try:
            with transaction.atomic():
                model.objects.create(tenant_id=tenant_id, version=version)
        except IntegrityError:  # another transaction created the row first
            model.objects.for_tenant(tenant_id).update(version=version)
    version_bumped.send(sender=model, tenant_id=tenant_id)


def version_of(model, tenant_id: int) -> int:
    known = _known.get()
    if known is not None and known[0] == tenant_id and time.monotonic() - known[2] < KNOWN_FOR_S:
        found = known[1].get(model)
        if found is not None:
            return found
    return tenant_scalar(model, "version", tenant_id) or 0


class VersionedCache(Generic[T]):
    """Values built per tenant, kept in this process as long as the tenant's version in `model` stays."""

    def __init__(self, model):
        self.model = model
        if model not in _versioned_models:
            _versioned_models.append(model)
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
