"""Reads of the audit log, and its verification: walk a tenant's chain and compare each strand with its head."""
from dataclasses import dataclass, field, replace

from django.core.cache import cache
from django.db.models import Q
from django.utils import timezone

from audit.chain import (
    HASHED_FIELDS,
    KEYED,
    PLAIN,
    STRANDS,
    audit_key,
    entry_digest,
    entry_payload,
    head_signed_by,
    heads_digest,
)
from audit.models import ChainHead, Event
from common import metrics
from tenancy.models import Tenant

INTACT, BROKEN, UNSIGNED, UNVERIFIABLE = "intact", "broken", "unsigned", "unverifiable"
WALK_CHUNK = 2000  # entries fetched at a time: a long chain is streamed, never loaded whole
RECENT_CHECK_S = 300  # how long a page may show a check's result before it checks again
# What the walk reads of each entry: every column (what any scheme's hash covers, and what places the entry).
ENTRY_FIELDS = tuple(field.name for field in Event._meta.concrete_fields)


def audit_events(*, tenant, target: str | None = None):
    queryset = Event.objects.for_tenant(tenant)
    if target:
        queryset = queryset.filter(target=target)
    return queryset


@dataclass(frozen=True)
class StrandState:
    """Where a walk left one strand: its entries walked, and the newest one's id and hash."""

    strand: int
    entries: int = 0
    last_id: int | None = None
    last_hash: str = ""


@dataclass(frozen=True)
class ChainCheck:
    """What a tenant's chain looks like: `status` is intact, broken (at `entry`, an event id, when one can
    be named), unsigned (the audit key is set but a head carries no signature) or unverifiable (keyed
    entries or signed heads, checked without the key)."""

    status: str
    entries: int  # entries walked
    entry: int | None = None
    reason: str = ""
    strands: tuple[StrandState, ...] = ()  # where the walk left each strand: where a later walk resumes
    keyed: bool = False  # has keyed entries
    head_count: int = 0
    head_hash: str = ""  # the heads' state in one hash (audit.chain.heads_digest)
    head_signed: bool = False  # every head is
    heads: tuple[tuple[int, int, int | None, str], ...] = ()  # each head's (strand, count, last_id, hash)

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
class _Strand:
    entries: int = 0
    last_id: int | None = None
    last_hash: str = ""
    beyond: int | None = None  # the first entry newer than the head the walk started from


@dataclass
class _Walk:
    strands: dict[int, _Strand] = field(default_factory=dict)
    keyed: bool = False
    unverified: int = 0  # keyed entries that could not be checked (no key)

    @property
    def entries(self) -> int:
        return sum(strand.entries for strand in self.strands.values())

    def strand(self, number: int) -> _Strand:
        return self.strands.setdefault(number, _Strand())


def _walk(tenant_id: int, key: bytes, walk: _Walk, heads: dict[int, ChainHead]) -> None:
    """Every entry oldest first, each against the one before it in its strand; ids order a strand, because a
    strand's appends take their ids one after another, each holding the strand's head."""
    rows = Event.objects.for_tenant(tenant_id).order_by("id")
    if walk.strands:
        # A resumed walk reads each strand after its newest entry walked: a later id in another strand may
        # have committed first, so no single id divides the walked from the new.
        walked = {n for n, s in walk.strands.items() if s.last_id}
        rows = rows.filter(~Q(strand__in=walked) | _or(Q(strand=n, id__gt=walk.strands[n].last_id) for n in walked))
    for entry in rows.values(*ENTRY_FIELDS).iterator(chunk_size=WALK_CHUNK):
        pk, number, prev_hash, digest, algorithm = (entry["id"], entry["strand"], entry["prev_hash"], entry["hash"],
                                                    entry["algorithm"])
        strand = walk.strand(number)
        if strand.beyond is not None:
            continue  # after an entry judged later (`_check_beyond`)
        head = heads.get(number)
        if head is None or head.last_id is None or pk > head.last_id:
            strand.beyond = pk  # newer than the head read before the walk: judged after it (`_check_beyond`)
            continue
        if prev_hash != strand.last_hash:
            raise _Broken(pk, "it does not follow the entry before it: an entry was removed, inserted or rewritten")
        if algorithm == PLAIN and walk.keyed:
            raise _Broken(pk, "it was written without the audit key after keyed entries")
        if algorithm not in (PLAIN, KEYED):
            raise _Broken(pk, f"its hash algorithm {algorithm!r} is unknown")
        if algorithm == KEYED:
            walk.keyed = True
        if entry["version"] not in HASHED_FIELDS:
            raise _Broken(pk, f"its hash scheme {entry['version']!r} is unknown")
        if algorithm == KEYED and not key:
            walk.unverified += 1
        else:
            payload = entry_payload(entry, prev_id=strand.last_id)
            if entry_digest(payload, algorithm=algorithm, key=key) != digest:
                raise _Broken(pk, "its hash does not match its content: it was changed")
        if entry["seen"] is not None:
            _seen_holds(walk, pk, number, entry["seen"])
        strand.entries += 1
        strand.last_id = pk
        strand.last_hash = digest


def _seen_holds(walk: _Walk, pk: int, number: int, seen) -> None:
    """An entry's record of every strand's count when it was appended. Its own is its place in its strand. The
    entries another strand had then were committed before this entry's statement read the counts, so they
    have smaller ids and the walk has passed them: a strand with fewer before this entry lost some. Checked
    here, as the walk goes, a strand set back and grown again since is found as well."""
    if not isinstance(seen, list) or len(seen) != STRANDS or not all(isinstance(n, int) for n in seen):
        raise _Broken(pk, "its record of the strands is malformed")
    if seen[number] != walk.strand(number).entries:
        raise _Broken(pk, "it is not where it says it was appended in its strand: entries were removed or moved")
    for other, count in enumerate(seen):
        if walk.strand(other).entries < count:
            raise _Broken(pk, f"it saw {count} entries in strand {other}, which has {walk.strand(other).entries} "
                              "before it: entries of that strand were removed")


def _or(conditions) -> Q:
    combined = Q(pk__in=[])
    for condition in conditions:
        combined |= condition
    return combined


def _check_beyond(tenant_id: int, walk: _Walk, heads: dict[int, ChainHead]) -> None:
    """An entry newer than its strand's head read before the walk: an append may have committed since (entry
    and head together), and then the head has moved past it and it is checked next time; otherwise it was
    written behind the log's back."""
    beyond = sorted((strand.beyond, number) for number, strand in walk.strands.items() if strand.beyond is not None)
    if not beyond:
        return
    fresh = _heads(tenant_id)
    for entry, number in beyond:
        then, now = heads.get(number), fresh.get(number)
        moved = now is not None and (then is None or now.last_id != then.last_id)
        if moved and now.last_id >= entry:
            continue
        if now is None:
            raise _Broken(entry, "the chain's head is missing")
        raise _Broken(entry, "it is newer than the chain's head records: it was not written through the log")


def _check_strands(heads: dict[int, ChainHead]) -> None:
    """A chain has every strand's head or (never appended to) none: a strand removed whole is missed here."""
    if not heads:
        return
    if missing := sorted(set(range(STRANDS)) - set(heads)):
        raise _Broken(None, f"the heads of strands {missing} are missing: a strand was removed")
    if unknown := sorted(set(heads) - set(range(STRANDS))):
        raise _Broken(None, f"the chain has heads of unknown strands {unknown}")


def _check_head(tenant_id: int, key: bytes, strand: _Strand, head: ChainHead) -> None:
    if (strand.last_id or 0) < (head.last_id or 0):
        raise _Broken(head.last_id, f"it is missing: the chain's head records {head.count} entries ending with "
                                    f"#{head.last_id}, the log has {strand.entries} (the newest were removed)")
    if strand.entries != head.count or strand.last_hash != head.hash:
        raise _Broken(head.last_id, "it does not match the chain's head: entries were removed or rewritten")
    if head.signature and key and not head_signed_by(key, signature=head.signature, tenant_id=tenant_id,
                                                     strand=head.strand, count=head.count, last_id=head.last_id,
                                                     hash=head.hash):
        raise _Broken(head.last_id, "the chain's head signature does not match: the head was rewound or rewritten")


def _heads(tenant_id: int) -> dict[int, ChainHead]:
    return {head.strand: head for head in ChainHead.objects.for_tenant(tenant_id)}


def audit_check(*, tenant, key: bytes | None = None, resume: ChainCheck | None = None) -> ChainCheck:
    """Verify the tenant's chain, streaming it oldest first, and compare each strand with its head.

    `key` defaults to the configured audit key. `resume` continues from an earlier intact walk (only the
    entries after it are read), for a caller that holds the chain's heads.
    """
    key = audit_key() if key is None else key
    heads = _heads(tenant.pk)
    walk = _Walk()
    if resume is not None:
        walk = _Walk(strands={state.strand: _Strand(state.entries, state.last_id, state.last_hash)
                              for state in resume.strands}, keyed=resume.keyed)
    facts = {}
    if heads:
        ordered = [heads[number] for number in sorted(heads)]
        facts = {"head_count": sum(head.count for head in ordered), "head_hash": heads_digest(ordered),
                 "head_signed": all(head.signature for head in ordered),
                 "heads": tuple((head.strand, head.count, head.last_id, head.hash) for head in ordered)}
    try:
        _walk(tenant.pk, key, walk, heads)
        _check_strands(heads)
        for number in sorted(heads):
            _check_head(tenant.pk, key, walk.strand(number), heads[number])
        _check_beyond(tenant.pk, walk, heads)
    except _Broken as broken:
        return ChainCheck(BROKEN, walk.entries, broken.entry, broken.reason, _states(walk), keyed=walk.keyed,
                          **facts)
    check = ChainCheck(INTACT, walk.entries, strands=_states(walk), keyed=walk.keyed, **facts)
    if walk.unverified or (check.head_signed and not key):
        return replace(check, status=UNVERIFIABLE,
                       reason="cannot be verified without the audit key (TOOLKEEPER_AUDIT_KEY): it was written with it")
    if key and check.entries and not check.head_signed:
        return replace(check, status=UNSIGNED,
                       reason="not signed with the audit key: its head was written before the key was set, or its "
                              "signature was removed; `manage.py verify_audit --sign` vouches for it as it stands")
    return check


def _states(walk: _Walk) -> tuple[StrandState, ...]:
    return tuple(StrandState(number, strand.entries, strand.last_id, strand.last_hash)
                 for number, strand in sorted(walk.strands.items()))


def audit_check_recent(*, tenant) -> tuple[ChainCheck, object]:
    """A check of the tenant's chain no older than RECENT_CHECK_S, and when it was made: for pages that are
    viewed often (the dashboard), where walking a long chain on every view would cost too much."""
    cache_key = f"tk:audit-check:{tenant.pk}"
    found = cache.get(cache_key)
    if found is None:
        found = (audit_check(tenant=tenant), timezone.now())
        cache.set(cache_key, found, timeout=RECENT_CHECK_S)
    return found


CHAIN_WATCH_S = 60  # how often the periodic job verifies every tenant's chain (what it walked before is not read again)
CHAIN_WATCH_FULL_S = 3600  # …and how often it walks each chain from its start again


def audit_chains_watch(*, now=None) -> dict[str, str]:
    """The periodic verification behind `toolkeeper_audit_chain_broken`: each tenant's chain, resumed from this
    job's last intact walk of it (kept in the cache, shared by the processes that run the job) and walked whole
    again every CHAIN_WATCH_FULL_S. Returns each tenant's status by slug."""
    now = now or timezone.now()
    statuses = {}
    for tenant in Tenant.objects.only("pk", "slug").order_by("pk"):
        cache_key = f"tk:audit-watch:{tenant.pk}"
        kept = cache.get(cache_key)
        resume = None
        if kept is not None and kept[0].status == INTACT and (now - kept[1]).total_seconds() < CHAIN_WATCH_FULL_S:
            resume = kept[0]
        check = audit_check(tenant=tenant, resume=resume)
        cache.set(cache_key, (check, kept[1] if resume is not None else now), timeout=2 * CHAIN_WATCH_FULL_S)
        metrics.audit_chain(tenant=tenant.slug, broken=check.status == BROKEN)
        statuses[tenant.slug] = check.status
    return statuses
