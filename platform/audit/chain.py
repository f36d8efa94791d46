"""How the audit chain is hashed and how a chain head is signed.

A tenant's chain is braided of STRANDS strands, each a hash chain with a head of its own, so that appends
made at the same time need not wait for each other (each takes a strand no other append holds). An entry's
hash covers its content and the previous entry's hash in its strand. Without an audit key it is a plain
SHA-256 (anyone with database access can recompute a rewritten chain); with `TOOLKEEPER_AUDIT_KEY` it is
an HMAC-SHA256 under that key. Each entry records which of the two made its hash, so entries written
before the key was set stay verifiable; and which scheme chose what the hash covers (`HASHED_FIELDS`).
"""
import hashlib
import hmac
import json

from django.conf import settings

PLAIN = "sha256"
KEYED = "hmac-sha256"

# A tenant's strands, all made with its first append; never fewer, so that a strand removed whole (its
# entries and its head) is missed by the check. As many as a server process serves requests at once.
STRANDS = 16


def audit_key() -> bytes:
    return settings.TOOLKEEPER_AUDIT_KEY.encode()


# What an entry's hash covers, by scheme; each entry records the scheme that made its hash (`Event.version`),
# so entries hashed before a change of scheme stay verifiable, and a changed `version` changes what is hashed.
# Scheme 1 left out the user (`actor`, the id: only its label was hashed), the strand and the algorithm.
# Scheme 2 covers every column of the entry but two, covered otherwise (COVERED_OTHERWISE): its `hash`, and its
# `id`, which the next entry of its strand covers (its payload holds the id of the entry before it) and, for
# the newest, the strand's head (`last_id`). A new column of Event needs a new scheme (tests/tenancy/
# test_audit_columns.py fails until it has one): adding it to scheme 2 would break every entry hashed so far.
SCHEME = 2  # what new entries are hashed with
HASHED_FIELDS = {
    1: ("prev_hash", "tenant", "actor_label", "verb", "target", "data", "at", "seen"),
    2: ("version", "tenant", "strand", "prev_hash", "actor", "actor_label", "verb", "target", "data", "at", "seen",
        "algorithm"),
}
COVERED_OTHERWISE = ("id", "hash")


class UnknownScheme(ValueError):
    """An entry names a hash scheme this version does not know."""


def entry_columns(event) -> dict:
    """An Event's values by field name, as stored (`tenant` and `actor` as ids): what `entry_payload` takes."""
    return {field.name: getattr(event, field.attname) for field in event._meta.concrete_fields}


def entry_payload(entry: dict, *, prev_id: int | None) -> bytes:
    """What an entry's hash covers, by the scheme it records (`entry["version"]`). `entry` maps Event's field
    names to their values as stored (`tenant` and `actor` as ids); `prev_id` is the id of the entry before it
    in its strand (None for a strand's first)."""
    version = entry["version"]
    if version == 1:
        fields = [entry["prev_hash"], entry["tenant"], entry["actor_label"], entry["verb"], entry["target"],
                  entry["data"], entry["at"].isoformat()]
        if entry["seen"] is not None:  # entries from before there were strands have none
            fields.append(entry["seen"])
        return json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str).encode()
    if version == 2:
        covered = {name: entry[name] for name in HASHED_FIELDS[2]}
        covered["at"] = covered["at"].isoformat()
        covered["prev_id"] = prev_id
        return json.dumps(covered, sort_keys=True, separators=(",", ":"), default=str).encode()
    raise UnknownScheme(f"hash scheme {version!r} is unknown")


def entry_digest(payload: bytes, *, algorithm: str, key: bytes) -> str:
    if algorithm == KEYED:
        return hmac.new(key, payload, hashlib.sha256).hexdigest()
    return hashlib.sha256(payload).hexdigest()


def head_signature(*, key: bytes, tenant_id: int, strand: int, count: int, last_id: int | None,
                   hash: str) -> str:  # noqa: A002
    # Strand 0 signs what the chain's single head signed before there were strands: those signatures hold.
    fields = ["audit-head", tenant_id, count, last_id, hash] + ([strand] if strand else [])
    message = json.dumps(fields, separators=(",", ":")).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def head_signed_by(key: bytes, *, signature: str, tenant_id: int, strand: int, count: int, last_id: int | None,
                   hash: str) -> bool:  # noqa: A002
    expected = head_signature(key=key, tenant_id=tenant_id, strand=strand, count=count, last_id=last_id, hash=hash)
    return bool(signature) and hmac.compare_digest(signature, expected)


def heads_digest(heads) -> str:
    """One hash for the state of all of a tenant's heads (`strand`, `count`, `last_id`, `hash` each, in strand
    order): what to note elsewhere to pin the log as it stands."""
    state = [[head.strand, head.count, head.last_id, head.hash] for head in heads]
    return hashlib.sha256(json.dumps(state, separators=(",", ":")).encode()).hexdigest()
