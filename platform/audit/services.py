"""Writes to the audit log: append-only and hash-chained per tenant."""
import hashlib
import json

from django.db import connection, transaction
from django.utils import timezone

from tenancy.fastread import insert_row, tenant_scalar

from .models import Event


def event_digest(*, prev_hash: str, tenant_id: int, actor_label: str, verb: str, target: str, data, at) -> str:
    payload = json.dumps(
        [prev_hash, tenant_id, actor_label, verb, target, data, at.isoformat()],
        sort_keys=True, separators=(",", ":"), default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def _actor_label(actor) -> str:
    if actor is None:
        return "system"
    return str(getattr(actor, "username", None) or actor)


def audit_record(*, tenant, verb: str, target: str = "", actor=None, data: dict | None = None) -> Event:
    """Append an event to the tenant's chain. Runs inside the caller's transaction if there is one."""
    label = _actor_label(actor)
    user = actor if getattr(actor, "_meta", None) is not None else None
    with transaction.atomic(savepoint=False):
        if connection.vendor == "postgresql":
            # One writer per tenant chain at a time; SQLite's write lock already serialises.
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [7001, tenant.pk])
        prev_hash = tenant_scalar(Event, "hash", tenant.pk, order_by_id_desc=True) or ""
        at = timezone.now()
        data = data or {}
        event = Event(
            tenant=tenant, actor=user, actor_label=label, verb=verb, target=target, data=data, at=at,
            prev_hash=prev_hash,
            hash=event_digest(prev_hash=prev_hash, tenant_id=tenant.pk, actor_label=label, verb=verb,
                              target=target, data=data, at=at),
        )
        event.pk = insert_row(Event, tenant=tenant.pk, actor=user.pk if user else None, actor_label=label, verb=verb,
                              target=target, data=data, at=at, prev_hash=prev_hash, hash=event.hash)
    return event
