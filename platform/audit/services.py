"""Writes to the audit log: append-only and hash-chained per tenant in strands, with a head per strand."""
import random
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from audit.chain import (
    KEYED,
    PLAIN,
    SCHEME,
    STRANDS,
    audit_key,
    entry_digest,
    entry_payload,
    head_signature,
    head_signed_by,
)
from audit.models import ChainHead, Event
from audit.selectors import UNSIGNED, ChainCheck, audit_check
from common.errors import ServiceError
from tenancy.fastread import insert_row, this_connection


def _actor_label(actor) -> str:
    if actor is None:
        return "system"
    return str(getattr(actor, "username", None) or actor)


@dataclass
class Head:
    strand: int
    count: int
    last_id: int | None
    hash: str
    signature: str
    seen: list[int] | None = None  # every strand's count, read with this head (`_free_head`)


_HEAD_FIELDS = ("strand", "count", "last_id", "hash", "signature")


def _head_select(conn) -> str:
    quote = conn.ops.quote_name
    columns = ", ".join(quote(ChainHead._meta.get_field(name).column) for name in _HEAD_FIELDS)
    return f"SELECT {columns} FROM {quote(ChainHead._meta.db_table)} WHERE {quote('tenant_id')} = %s"  # noqa: S608


_free_head_statements: dict[str, str] = {}  # vendor → the statement (built once: it runs on every append)


def _free_head_statement(conn) -> str:
    found = _free_head_statements.get(conn.vendor)
    if found is not None:
        return found
    quote = conn.ops.quote_name
    table, tenant, strand, count = (quote(ChainHead._meta.db_table), quote("tenant_id"), quote("strand"),
                                    quote("count"))
    if conn.vendor == "postgresql":
        counts = (f"(SELECT array_agg(seen.{count} ORDER BY seen.{strand}) FROM {table} seen "  # noqa: S608
                  f"WHERE seen.{tenant} = %s)")
    else:  # group_concat's order is not defined there: each count goes with its strand
        counts = (f"(SELECT group_concat(seen.{strand} || ':' || seen.{count}) FROM {table} seen "  # noqa: S608
                  f"WHERE seen.{tenant} = %s)")
    lock = " FOR UPDATE SKIP LOCKED" if conn.features.has_select_for_update_skip_locked else ""
    columns = ", ".join(f"{table}.{quote(ChainHead._meta.get_field(name).column)}" for name in _HEAD_FIELDS)
    found = _free_head_statements[conn.vendor] = (
        f"SELECT {columns}, {counts} FROM {table} WHERE {table}.{tenant} = %s "  # noqa: S608
        f"ORDER BY {table}.{strand} LIMIT 1{lock}")
    return found


def _free_head(conn, tenant_id: int) -> Head | None:
    """A strand's head that no other transaction holds, now held (FOR UPDATE) until this one ends; the
    lowest such, read with every strand's count. A head this transaction already holds is never skipped, so
    a transaction that holds a strand finds one here, and only one that holds none ever waits
    (`_locked_head`): no two wait on each other. SQLite's single writer already serialises appends: there,
    strand 0."""
    sql = _free_head_statement(conn)
    with conn.cursor() as cursor:
        cursor.execute(sql, [tenant_id, tenant_id])
        row = cursor.fetchone()
    if row is None:
        return None
    *fields, counts_read = row
    if isinstance(counts_read, str):
        by_strand = dict(tuple(map(int, pair.split(":"))) for pair in counts_read.split(","))
        counts_read = [by_strand[number] for number in sorted(by_strand)]
    return Head(*fields, seen=list(counts_read or []))


def _all_heads(conn, tenant_id: int, *, lock: bool) -> list[Head]:
    quote = conn.ops.quote_name
    suffix = " FOR UPDATE" if lock and conn.features.has_select_for_update else ""
    with conn.cursor() as cursor:
        cursor.execute(f"{_head_select(conn)} ORDER BY {quote('strand')}{suffix}", [tenant_id])
        return [Head(*row) for row in cursor.fetchall()]


def _locked_head(tenant_id: int) -> Head:
    """A head of the tenant's chain to append to, held until the transaction ends."""
    conn = this_connection()
    head = _free_head(conn, tenant_id)
    if head is not None:
        return head
    # Every strand is held by another append, or the chain has no heads yet (its first append).
    heads = _all_heads(conn, tenant_id, lock=False)
    if not heads and conn.vendor == "postgresql":
        # First appends are serialised with an advisory lock, then look again (one may have made the heads).
        with conn.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [7001, tenant_id])
        heads = _all_heads(conn, tenant_id, lock=False)
    if not heads:
        _create_heads(tenant_id)
    head = _free_head(conn, tenant_id)
    if head is not None:
        return head
    # All strands busy: wait for one, chosen at random so that waiters spread over them.
    strand = random.choice(heads).strand  # noqa: S311 - spreading load, not a secret
    quote = conn.ops.quote_name
    with conn.cursor() as cursor:
        cursor.execute(f"{_head_select(conn)} AND {quote('strand')} = %s FOR UPDATE", [tenant_id, strand])
        head = Head(*cursor.fetchone())
    head.seen = [each.count for each in heads]  # read before the wait: lower bounds still, as counts only grow
    return head


def _create_heads(tenant_id: int) -> None:
    """Every strand's head, empty, at the chain's first append: signed when there is an audit key."""
    key = audit_key()
    for strand in range(STRANDS):
        signature = head_signature(key=key, tenant_id=tenant_id, strand=strand, count=0, last_id=None,
                                   hash="") if key else ""
        insert_row(ChainHead, tenant=tenant_id, strand=strand, count=0, last_id=None, hash="", signature=signature)


def _write_head(tenant_id: int, head: Head) -> None:
    conn = this_connection()
    quote = conn.ops.quote_name
    assignments = ", ".join(f"{quote(ChainHead._meta.get_field(name).column)} = %s"
                            for name in ("count", "last_id", "hash", "signature"))
    sql = (f"UPDATE {quote(ChainHead._meta.db_table)} SET {assignments} "  # noqa: S608
           f"WHERE {quote('tenant_id')} = %s AND {quote('strand')} = %s")
    with conn.cursor() as cursor:
        cursor.execute(sql, [head.count, head.last_id, head.hash, head.signature, tenant_id, head.strand])


def _signed(key: bytes, tenant_id: int, head: Head) -> bool:
    return head_signed_by(key, signature=head.signature, tenant_id=tenant_id, strand=head.strand,
                          count=head.count, last_id=head.last_id, hash=head.hash)


def _sign(key: bytes, tenant_id: int, head: Head) -> None:
    head.signature = head_signature(key=key, tenant_id=tenant_id, strand=head.strand, count=head.count,
                                    last_id=head.last_id, hash=head.hash)


def audit_record(*, tenant, verb: str, target: str = "", actor=None, data: dict | None = None) -> Event:
    """Append an event to one strand of the tenant's chain. Runs inside the caller's transaction if there is one.

    The new head is signed only when the head it extends is: an unsigned head (a chain begun before the key
    was set) stays unsigned until `verify_audit --sign` vouches for it, and a head whose signature does not
    match keeps that signature, so it stays broken.
    """
    label = _actor_label(actor)
    user = actor if getattr(actor, "_meta", None) is not None else None
    key = audit_key()
    algorithm = KEYED if key else PLAIN
    with transaction.atomic(savepoint=False):
        head = _locked_head(tenant.pk)
        signs = bool(key) and _signed(key, tenant.pk, head)
        seen = list(head.seen)
        seen[head.strand] = head.count  # its own strand as held: the entry's place in it
        # every column but the id (covered by the next entry, and by the head) and the hash itself
        columns = {"version": SCHEME, "tenant": tenant.pk, "strand": head.strand, "prev_hash": head.hash,
                   "actor": user.pk if user else None, "actor_label": label, "verb": verb, "target": target,
                   "data": data or {}, "at": timezone.now(), "seen": seen, "algorithm": algorithm}
        digest = entry_digest(entry_payload(columns, prev_id=head.last_id), algorithm=algorithm, key=key)
        event = Event(**{**columns, "tenant": tenant, "actor": user}, hash=digest)
        event.pk = insert_row(Event, **columns, hash=digest)
        head.count, head.last_id, head.hash = head.count + 1, event.pk, event.hash
        if signs:
            _sign(key, tenant.pk, head)
        _write_head(tenant.pk, head)
    return event


def audit_chain_sign(*, tenant) -> ChainCheck:
    """Vouch for a chain begun before the audit key was set: verify it and, if it is intact but unsigned,
    sign its heads (and record that it was signed). Any other chain is left as it is; returns its check."""
    key = audit_key()
    if not key:
        raise ServiceError("set TOOLKEEPER_AUDIT_KEY to sign audit chains")
    check = audit_check(tenant=tenant, key=key)
    if check.status != UNSIGNED:
        return check
    with transaction.atomic():
        heads = _all_heads(this_connection(), tenant.pk, lock=True)
        check = audit_check(tenant=tenant, key=key, resume=check)  # the entries appended since the walk
        if check.status != UNSIGNED:
            return check
        for head in heads:
            _sign(key, tenant.pk, head)
            _write_head(tenant.pk, head)
        audit_record(tenant=tenant, verb="audit.signed", target=f"tenant:{tenant.slug}",
                     data={"entries": check.entries})
    return audit_check(tenant=tenant, key=key, resume=check)
