"""Reads of the audit log, and its verification: walk a tenant's chain and compare it with its head."""
from dataclasses import dataclass, replace

from django.core.cache import cache
from django.utils import timezone

from .chain import KEYED, PLAIN, audit_key, entry_digest, entry_payload, head_signed_by
from .models import ChainHead, Event

INTACT, BROKEN, UNSIGNED, UNVERIFIABLE = "intact", "broken", "unsigned", "unverifiable"
WALK_CHUNK = 2000  # entries fetched at a time: a long chain is streamed, never loaded whole
RECENT_CHECK_S = 300  # how long a page may show a check's result before it checks again


def audit_events(*, tenant, target: str | None = None):
    queryset = Event.objects.for_tenant(tenant)
    if target:
        queryset = queryset.filter(target=target)
    return queryset


@dataclass(frozen=True)
class ChainCheck:
    """What a tenant's chain looks like: `status` is intact, broken (at `entry`, an event id, when one can
    be named), unsigned (the audit key is set but the head carries no signature) or unverifiable (keyed
    entries or a signed head, checked without the key)."""

    status: str
    entries: int  # entries walked
    entry: int | None = None
    reason: str = ""
    last_id: int | None = None  # the newest entry walked, and its hash: where a later walk resumes
    last_hash: str = ""
    keyed: bool = False  # has keyed entries
    head_count: int = 0
    head_hash: str = ""
    head_signed: bool = False

    @property
    def intact(self) -> bool:
        return self.status == INTACT

    def summary(self) -> str:
        if self.status == INTACT:
            keyed = ", keyed" if self.keyed or self.head_signed else ""
            return f"intact ({self.entries} entries{keyed})"
        if self.status == BROKEN:
            where = f" at entry #{self.entry}" if self.entry is not None else ""
            return f"broken{where}: {self.reason}"
        return self.reason


class _Broken(Exception):
    """The first bad entry found; ends the walk."""

    def __init__(self, entry: int | None, reason: str):
        super().__init__(reason)
        self.entry = entry
        self.reason = reason


@dataclass
class _Walk:
    entries: int = 0
    last_id: int | None = None
    last_hash: str = ""
    keyed: bool = False
    unverified: int = 0  # keyed entries that could not be checked (no key)
    beyond: int | None = None  # the first entry newer than the head the walk started from


def _walk(tenant_id: int, key: bytes, walk: _Walk, head: ChainHead | None) -> None:
    rows = Event.objects.for_tenant(tenant_id).order_by("id")
    if walk.last_id is not None:
        rows = rows.filter(id__gt=walk.last_id)
    fields = ("id", "prev_hash", "hash", "algorithm", "actor_label", "verb", "target", "data", "at")
    for pk, prev_hash, digest, algorithm, actor_label, verb, target, data, at in (
            rows.values_list(*fields).iterator(chunk_size=WALK_CHUNK)):
        if head is None or pk > head.last_id:
            walk.beyond = pk  # newer than the head read before the walk: judged after it (`_check_beyond`)
            return
        if prev_hash != walk.last_hash:
            raise _Broken(pk, "it does not follow the entry before it: an entry was removed, inserted or rewritten")
        if algorithm == PLAIN and walk.keyed:
            raise _Broken(pk, "it was written without the audit key after keyed entries")
        if algorithm not in (PLAIN, KEYED):
            raise _Broken(pk, f"its hash algorithm {algorithm!r} is unknown")
        if algorithm == KEYED:
            walk.keyed = True
        if algorithm == KEYED and not key:
            walk.unverified += 1
        else:
            payload = entry_payload(prev_hash=prev_hash, tenant_id=tenant_id, actor_label=actor_label, verb=verb,
                                    target=target, data=data, at=at)
            if entry_digest(payload, algorithm=algorithm, key=key) != digest:
                raise _Broken(pk, "its hash does not match its content: it was changed")
        walk.entries += 1
        walk.last_id = pk
        walk.last_hash = digest


def _check_beyond(tenant_id: int, walk: _Walk, head: ChainHead | None) -> None:
    """An entry newer than the head read before the walk: an append may have committed since (entry and head
    together), and then the head has moved past it and it is checked next time; otherwise it was written
    behind the log's back."""
    if walk.beyond is None:
        return
    fresh = ChainHead.objects.for_tenant(tenant_id).first()
    moved = fresh is not None and (head is None or fresh.last_id != head.last_id)
    if moved and fresh.last_id >= walk.beyond:
        return
    if fresh is None:
        raise _Broken(walk.beyond, "the chain's head is missing")
    raise _Broken(walk.beyond, "it is newer than the chain's head records: it was not written through the log")


def _check_head(tenant_id: int, key: bytes, walk: _Walk, head: ChainHead | None) -> None:
    if head is None:
        return  # no head and (the walk saw to it) no entries: an empty chain
    if walk.last_id is None or walk.last_id < (head.last_id or 0):
        raise _Broken(head.last_id, f"it is missing: the chain's head records {head.count} entries ending with "
                                    f"#{head.last_id}, the log has {walk.entries} (the newest were removed)")
    if walk.entries != head.count or walk.last_hash != head.hash:
        raise _Broken(head.last_id, "it does not match the chain's head: entries were removed or rewritten")
    if head.signature and key and not head_signed_by(key, signature=head.signature, tenant_id=tenant_id,
                                                     count=head.count, last_id=head.last_id, hash=head.hash):
        raise _Broken(head.last_id, "the chain's head signature does not match: the head was rewound or rewritten")


def audit_check(*, tenant, key: bytes | None = None, resume: ChainCheck | None = None) -> ChainCheck:
    """Verify the tenant's chain, streaming it oldest first, and compare it with the chain's head.

    `key` defaults to the configured audit key. `resume` continues from an earlier intact walk (only the
    entries after it are read), for a caller that holds the chain's head lock.
    """
    key = audit_key() if key is None else key
    head = ChainHead.objects.for_tenant(tenant).first()
    walk = _Walk()
    if resume is not None:
        walk = _Walk(entries=resume.entries, last_id=resume.last_id, last_hash=resume.last_hash, keyed=resume.keyed)
    facts = {}
    if head is not None:
        facts = {"head_count": head.count, "head_hash": head.hash, "head_signed": bool(head.signature)}
    try:
        _walk(tenant.pk, key, walk, head)
        _check_head(tenant.pk, key, walk, head)
        _check_beyond(tenant.pk, walk, head)
    except _Broken as broken:
        return ChainCheck(BROKEN, walk.entries, broken.entry, broken.reason, walk.last_id, walk.last_hash,
                          keyed=walk.keyed, **facts)
    check = ChainCheck(INTACT, walk.entries, last_id=walk.last_id, last_hash=walk.last_hash, keyed=walk.keyed,
                       **facts)
    if walk.unverified or (check.head_signed and not key):
        return replace(check, status=UNVERIFIABLE,
                       reason="cannot be verified without the audit key (TOOLKEEPER_AUDIT_KEY): it was written with it")
    if key and check.entries and not check.head_signed:
        return replace(check, status=UNSIGNED,
                       reason="not signed with the audit key: its head was written before the key was set, or its "
                              "signature was removed; `manage.py verify_audit --sign` vouches for it as it stands")
    return check


def audit_check_recent(*, tenant) -> tuple[ChainCheck, object]:
    """A check of the tenant's chain no older than RECENT_CHECK_S, and when it was made: for pages that are
    viewed often (the dashboard), where walking a long chain on every view would cost too much."""
    cache_key = f"tk:audit-check:{tenant.pk}"
    found = cache.get(cache_key)
    if found is None:
        found = (audit_check(tenant=tenant), timezone.now())
        cache.set(cache_key, found, timeout=RECENT_CHECK_S)
    return found
