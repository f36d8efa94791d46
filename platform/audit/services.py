"""Writes to the audit log: append-only and hash-chained per tenant, with a head per chain.

An entry is written on its own (no lock: a tenant's writers do not queue on each other) and sealed into the
chain just after it commits, by this process's sealer thread, or by the periodic sweep if the process stopped
first. Sealing takes the head's lock, in batches, off the request's path.
"""
import logging
import threading
import time
from dataclasses import dataclass
from functools import partial

from django.core.cache import cache
from django.db import connection, transaction
from django.utils import timezone

from tenancy.fastread import insert_row, this_connection
from toolkeeper.errors import ServiceError

from .chain import (
    KEYED,
    PLAIN,
    audit_key,
    entry_digest,
    entry_payload,
    head_signature,
    head_signed_by,
    unsealed_refusal,
)
from .models import ChainHead, Event
from .selectors import UNSIGNED, ChainCheck, audit_check

logger = logging.getLogger(__name__)

SEAL_BATCH = 500  # entries sealed in one transaction
SEAL_GATHER_S = 0.05  # how long the sealer gathers commits before it seals them together
RECENT_CHECK_S = 300  # how long a page may show a check's result before it checks again


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
    """Append an event to the tenant's log, in the caller's transaction if there is one.

    One INSERT that waits for no other writer: the entry is written unsealed, its hash over its own content
    (under the audit key when set, so a row written behind the log's back is refused by the sealer), and is
    sealed into the chain just after commit (`audit_seal`).
    """
    label = _actor_label(actor)
    user = actor if getattr(actor, "_meta", None) is not None else None
    key = audit_key()
    algorithm = KEYED if key else PLAIN
    at = timezone.now()
    data = data or {}
    digest = event_digest(prev_hash="", tenant_id=tenant.pk, actor_label=label, verb=verb, target=target,
                          data=data, at=at, algorithm=algorithm, key=key)
    event = Event(tenant=tenant, actor=user, actor_label=label, verb=verb, target=target, data=data, at=at,
                  prev_hash="", hash=digest, algorithm=algorithm)
    event.pk = insert_row(Event, tenant=tenant.pk, actor=user.pk if user else None, actor_label=label, verb=verb,
                          target=target, data=data, at=at, prev_hash="", hash=digest, algorithm=algorithm)
    event._state.adding = False
    transaction.on_commit(partial(sealer.seal_soon, tenant.pk))
    return event


@dataclass
class _Unsealed:
    id: int
    actor_label: str
    verb: str
    target: str
    data: object
    at: object
    algorithm: str
    hash: str


def _unsealed(tenant_id: int, *, after: int, limit: int) -> list[_Unsealed]:
    rows = (Event.objects.for_tenant(tenant_id).filter(position__isnull=True, id__gt=after).order_by("id")
            .values_list("id", "actor_label", "verb", "target", "data", "at", "algorithm", "hash")[:limit])
    return [_Unsealed(*row) for row in rows]


_refused_logged: set[int] = set()  # entries this process has already reported as refused


def _seal_rows(tenant_id: int, head: Head | None, rows: list[_Unsealed], key: bytes) -> tuple[Head | None, list]:
    """The chain extended by those of `rows` written through the log: (the new head, the rows' new values)."""
    algorithm = KEYED if key else PLAIN
    signs = _signs(key, tenant_id, head)
    head_signed = None if head is None else bool(head.signature)
    updates = []
    for entry in rows:
        refusal = unsealed_refusal(tenant_id, entry, key, head_signed=head_signed)
        if refusal != "":
            if entry.id not in _refused_logged:
                _refused_logged.add(entry.id)
                logger.error("audit entry #%s of tenant %s is not sealed: %s", entry.id, tenant_id,
                             refusal or "it is keyed and the audit key is not set")
            continue
        prev_hash = head.hash if head else ""
        digest = event_digest(prev_hash=prev_hash, tenant_id=tenant_id, actor_label=entry.actor_label,
                              verb=entry.verb, target=entry.target, data=entry.data, at=entry.at,
                              algorithm=algorithm, key=key)
        count = (head.count if head else 0) + 1
        head = Head(count=count, last_id=entry.id, hash=digest, signature=head.signature if head else "")
        updates.append((count, prev_hash, digest, algorithm, entry.id, tenant_id))
    if updates and signs:
        head.signature = head_signature(key=key, tenant_id=tenant_id, count=head.count, last_id=head.last_id,
                                        hash=head.hash)
    return head, updates


def _write_sealed(updates: list) -> None:
    conn = this_connection()
    quote = conn.ops.quote_name
    meta = Event._meta
    column = {name: quote(meta.get_field(name).column) for name in ("position", "prev_hash", "hash", "algorithm",
                                                                     "tenant")}
    sql = (f"UPDATE {quote(meta.db_table)} SET {column['position']} = %s, {column['prev_hash']} = %s, "  # noqa: S608
           f"{column['hash']} = %s, {column['algorithm']} = %s WHERE {quote(meta.pk.column)} = %s "
           f"AND {column['tenant']} = %s AND {column['position']} IS NULL")
    with conn.cursor() as cursor:
        cursor.executemany(sql, updates)


def audit_seal(tenant_id: int) -> int:
    """Seal the tenant's committed entries that are not in its chain yet, oldest first; returns how many.

    Sealers queue on the chain's head (its row lock), so each entry gets exactly one position and the head
    always describes the sealed chain. An entry whose hash does not match its content was not written
    through the log: it is left unsealed (and verification names it), the rest are sealed.
    """
    sealed, after = 0, 0
    key = audit_key()
    while True:
        with transaction.atomic():
            head = _locked_head(tenant_id)
            rows = _unsealed(tenant_id, after=after, limit=SEAL_BATCH)
            new_head, updates = _seal_rows(tenant_id, head, rows, key)
            if updates:
                _write_sealed(updates)
                _write_head(tenant_id, new_head, new=head is None)
        sealed += len(updates)
        if len(rows) < SEAL_BATCH:
            return sealed
        after = rows[-1].id


def audit_seal_pending() -> int:
    """Seal every tenant's entries left unsealed (a process that stopped between a commit and its seal):
    a periodic job. Returns how many were sealed."""
    tenants = Event.all_tenants.filter(position__isnull=True).order_by().values_list("tenant_id", flat=True)
    return sum(audit_seal(tenant_id) for tenant_id in set(tenants))


class Sealer:
    """Seals in the background, just after commit: one thread per process gathers the tenants whose entries
    committed in the last SEAL_GATHER_S and seals each once, so a busy tenant's entries are sealed in batches.
    The thread keeps its database connection (a new one per batch would cost PostgreSQL a backend each
    time) unless a seal fails; what failed is left to the periodic `audit_seal_pending`."""

    def __init__(self):
        self._lock = threading.Lock()
        self._due: set[int] = set()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._busy = False

    def seal_soon(self, tenant_id: int) -> None:
        with self._lock:
            self._due.add(tenant_id)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="toolkeeper-audit-seal", daemon=True)
                self._thread.start()
        self._wake.set()

    def _serve(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(SEAL_GATHER_S)
            with self._lock:
                due, self._due = self._due, set()
                self._wake.clear()
                self._busy = True
            try:
                for tenant_id in sorted(due):
                    try:
                        audit_seal(tenant_id)
                    except Exception:
                        logger.exception("sealing the audit entries of tenant %s failed", tenant_id)
                        connection.close()  # opened again for the next seal; kept otherwise, as it is busy
            finally:
                with self._lock:
                    self._busy = False

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait (bounded) until nothing is due or being sealed: before a process's tables are emptied."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if not self._due and not self._busy:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


sealer = Sealer()


def audit_verify(*, tenant, key: bytes | None = None) -> ChainCheck:
    """Seal what has committed, then check the tenant's chain (`audit.selectors.audit_check`)."""
    audit_seal(tenant.pk)
    return audit_check(tenant=tenant, key=key)


def audit_verify_recent(*, tenant) -> tuple[ChainCheck, object]:
    """A check of the tenant's chain no older than RECENT_CHECK_S, and when it was made: for pages that are
    viewed often (the dashboard), where walking a long chain on every view would cost too much."""
    cache_key = f"tk:audit-check:{tenant.pk}"
    found = cache.get(cache_key)
    if found is None:
        found = (audit_verify(tenant=tenant), timezone.now())
        cache.set(cache_key, found, timeout=RECENT_CHECK_S)
    return found


def audit_chain_sign(*, tenant) -> ChainCheck:
    """Vouch for a chain begun before the audit key was set: verify it and, if it is intact but unsigned,
    sign its head (and record that it was signed). Any other chain is left as it is; returns its check."""
    key = audit_key()
    if not key:
        raise ServiceError("set TOOLKEEPER_AUDIT_KEY to sign audit chains")
    check = audit_verify(tenant=tenant, key=key)
    if check.status != UNSIGNED:
        return check
    with transaction.atomic():
        head = _locked_head(tenant.pk)
        check = audit_check(tenant=tenant, key=key, resume=check)  # the entries sealed since the walk
        if check.status != UNSIGNED:
            return check
        head.signature = head_signature(key=key, tenant_id=tenant.pk, count=head.count, last_id=head.last_id,
                                        hash=head.hash)
        _write_head(tenant.pk, head, new=False)
        audit_record(tenant=tenant, verb="audit.signed", target=f"tenant:{tenant.slug}",
                     data={"entries": check.entries})
    audit_seal(tenant.pk)
    return audit_check(tenant=tenant, key=key, resume=check)
