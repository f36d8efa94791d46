"""Writes to the audit log: append-only and hash-chained per tenant, with a head per chain."""
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from tenancy.fastread import insert_row, this_connection
from toolkeeper.errors import ServiceError

from .chain import KEYED, PLAIN, audit_key, entry_digest, entry_payload, head_signature, head_signed_by
from .models import ChainHead, Event
from .selectors import UNSIGNED, ChainCheck, audit_check


def event_digest(*, prev_hash: str, tenant_id: int, actor_label: str, verb: str, target: str, data, at,
                 algorithm: str = PLAIN, key: bytes = b"") -> str:
    payload = entry_payload(prev_hash=prev_hash, tenant_id=tenant_id, actor_label=actor_label, verb=verb,
                            target=target, data=data, at=at)
    return entry_digest(payload, algorithm=algorithm, key=key)


def _actor_label(actor) -> str:
    if actor is None:
        return "system"
    return str(getattr(actor, "username", None) or actor)


@dataclass
class Head:
    count: int
    last_id: int | None
    hash: str
    signature: str


def _head_columns(conn) -> list[str]:
    return [conn.ops.quote_name(ChainHead._meta.get_field(name).column)
            for name in ("count", "last_id", "hash", "signature")]


def _read_head(tenant_id: int, *, lock: bool) -> Head | None:
    """The tenant's head; with `lock`, held (FOR UPDATE) until the transaction ends, so appends queue on it."""
    conn = this_connection()
    quote = conn.ops.quote_name
    suffix = " FOR UPDATE" if lock and conn.features.has_select_for_update else ""
    sql = (f"SELECT {', '.join(_head_columns(conn))} FROM {quote(ChainHead._meta.db_table)} "  # noqa: S608
           f"WHERE {quote('tenant_id')} = %s{suffix}")
    with conn.cursor() as cursor:
        cursor.execute(sql, [tenant_id])
        row = cursor.fetchone()
    return Head(*row) if row else None


def _locked_head(tenant_id: int) -> Head | None:
    head = _read_head(tenant_id, lock=True)
    conn = this_connection()
    if head is None and conn.vendor == "postgresql":
        # A chain's first append has no head row to lock: serialise those with an advisory lock, then look
        # again (a concurrent first append may have made it). SQLite's write lock already serialises.
        with conn.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [7001, tenant_id])
        head = _read_head(tenant_id, lock=True)
    return head


def _write_head(tenant_id: int, head: Head, *, new: bool) -> None:
    if new:
        insert_row(ChainHead, tenant=tenant_id, count=head.count, last_id=head.last_id, hash=head.hash,
                   signature=head.signature)
        return
    conn = this_connection()
    quote = conn.ops.quote_name
    assignments = ", ".join(f"{column} = %s" for column in _head_columns(conn))
    sql = f"UPDATE {quote(ChainHead._meta.db_table)} SET {assignments} WHERE {quote('tenant_id')} = %s"  # noqa: S608
    with conn.cursor() as cursor:
        cursor.execute(sql, [head.count, head.last_id, head.hash, head.signature, tenant_id])


def _signs(key: bytes, tenant_id: int, head: Head | None) -> bool:
    """Whether an append may sign the new head: only one that extends a signed head (or starts a chain).

    An unsigned head (a chain begun before the key was set) stays unsigned until `verify_audit --sign`
    vouches for it; a head whose signature does not match keeps that signature, so it stays broken.
    """
    if not key:
        return False
    if head is None:
        return True
    return head_signed_by(key, signature=head.signature, tenant_id=tenant_id, count=head.count,
                          last_id=head.last_id, hash=head.hash)


def audit_record(*, tenant, verb: str, target: str = "", actor=None, data: dict | None = None) -> Event:
    """Append an event to the tenant's chain. Runs inside the caller's transaction if there is one."""
    label = _actor_label(actor)
    user = actor if getattr(actor, "_meta", None) is not None else None
    key = audit_key()
    algorithm = KEYED if key else PLAIN
    with transaction.atomic(savepoint=False):
        head = _locked_head(tenant.pk)
        prev_hash = head.hash if head else ""
        at = timezone.now()
        data = data or {}
        event = Event(
            tenant=tenant, actor=user, actor_label=label, verb=verb, target=target, data=data, at=at,
            prev_hash=prev_hash, algorithm=algorithm,
            hash=event_digest(prev_hash=prev_hash, tenant_id=tenant.pk, actor_label=label, verb=verb,
                              target=target, data=data, at=at, algorithm=algorithm, key=key),
        )
        event.pk = insert_row(Event, tenant=tenant.pk, actor=user.pk if user else None, actor_label=label, verb=verb,
                              target=target, data=data, at=at, prev_hash=prev_hash, hash=event.hash,
                              algorithm=algorithm)
        new_head = Head(count=(head.count if head else 0) + 1, last_id=event.pk, hash=event.hash,
                        signature=head.signature if head else "")
        if _signs(key, tenant.pk, head):
            new_head.signature = head_signature(key=key, tenant_id=tenant.pk, count=new_head.count,
                                                last_id=new_head.last_id, hash=new_head.hash)
        _write_head(tenant.pk, new_head, new=head is None)
    return event


def audit_chain_sign(*, tenant) -> ChainCheck:
    """Vouch for a chain begun before the audit key was set: verify it and, if it is intact but unsigned,
    sign its head (and record that it was signed). Any other chain is left as it is; returns its check."""
    key = audit_key()
    if not key:
        raise ServiceError("set TOOLKEEPER_AUDIT_KEY to sign audit chains")
    check = audit_check(tenant=tenant, key=key)
    if check.status != UNSIGNED:
        return check
    with transaction.atomic():
        head = _locked_head(tenant.pk)
        check = audit_check(tenant=tenant, key=key, resume=check)  # the entries appended since the walk
        if check.status != UNSIGNED:
            return check
        head.signature = head_signature(key=key, tenant_id=tenant.pk, count=head.count, last_id=head.last_id,
                                        hash=head.hash)
        _write_head(tenant.pk, head, new=False)
        audit_record(tenant=tenant, verb="audit.signed", target=f"tenant:{tenant.slug}",
                     data={"entries": check.entries})
    return audit_check(tenant=tenant, key=key, resume=check)
