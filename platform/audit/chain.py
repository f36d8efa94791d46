"""How the audit chain is hashed and how a chain head is signed.

A tenant's chain is braided of STRANDS strands, each a hash chain with a head of its own, so that appends
made at the same time need not wait for each other (each takes a strand no other append holds). An entry's
hash covers its content and the previous entry's hash in its strand. Without an audit key it is a plain
SHA-256 (anyone with database access can recompute a rewritten chain); with `TOOLKEEPER_AUDIT_KEY` it is
an HMAC-SHA256 under that key. Each entry records which of the two made its hash, so entries written
before the key was set stay verifiable.
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


def entry_payload(*, prev_hash: str, tenant_id: int, actor_label: str, verb: str, target: str, data, at,
                  seen: list[int] | None = None) -> bytes:
    """What an entry's hash covers. `seen`: how many entries each strand had when it was appended (entries from
    before there were strands have none, and keep the payload they were hashed with)."""
    fields = [prev_hash, tenant_id, actor_label, verb, target, data, at.isoformat()]
    if seen is not None:
        fields.append(seen)
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str).encode()


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
