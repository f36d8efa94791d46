"""How the audit chain is hashed and how a chain head is signed.

An entry is written with a hash of its content alone and sealed into the chain after it commits; a sealed
entry's hash covers its content and the previous entry's hash. Without an audit key it is a plain
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


def audit_key() -> bytes:
    return settings.TOOLKEEPER_AUDIT_KEY.encode()


def entry_payload(*, prev_hash: str, tenant_id: int, actor_label: str, verb: str, target: str, data, at) -> bytes:
    return json.dumps(
        [prev_hash, tenant_id, actor_label, verb, target, data, at.isoformat()],
        sort_keys=True, separators=(",", ":"), default=str,
    ).encode()


def entry_digest(payload: bytes, *, algorithm: str, key: bytes) -> str:
    if algorithm == KEYED:
        return hmac.new(key, payload, hashlib.sha256).hexdigest()
    return hashlib.sha256(payload).hexdigest()


def head_signature(*, key: bytes, tenant_id: int, count: int, last_id: int | None, hash: str) -> str:  # noqa: A002
    message = json.dumps(["audit-head", tenant_id, count, last_id, hash], separators=(",", ":")).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def head_signed_by(key: bytes, *, signature: str, tenant_id: int, count: int, last_id: int | None,
                   hash: str) -> bool:  # noqa: A002
    expected = head_signature(key=key, tenant_id=tenant_id, count=count, last_id=last_id, hash=hash)
    return bool(signature) and hmac.compare_digest(signature, expected)


NOT_THROUGH_THE_LOG = "it is newer than the chain's head records: it was not written through the log"
PLAIN_AFTER_KEYED = "it was written without the audit key after keyed entries"


def unsealed_refusal(tenant_id: int, entry, key: bytes, *, head_signed: bool | None) -> str | None:
    """Why an unsealed entry must not be sealed (a reason), "" when it may be, None when it is keyed and there
    is no key to check it with. `head_signed`: whether the chain's head is signed (None: there is no head).

    Its `hash` must cover its content alone (no previous hash), as the log writes it. With the audit key, a
    plain entry extends only a chain that is not signed (begun before the key): anyone with database access
    can write a plain entry, and sealing one into a signed chain would vouch for it.
    """
    if entry.algorithm == KEYED and not key:
        return None
    if entry.algorithm not in (PLAIN, KEYED):
        return NOT_THROUGH_THE_LOG
    payload = entry_payload(prev_hash="", tenant_id=tenant_id, actor_label=entry.actor_label, verb=entry.verb,
                            target=entry.target, data=entry.data, at=entry.at)
    if not hmac.compare_digest(entry_digest(payload, algorithm=entry.algorithm, key=key), entry.hash):
        return NOT_THROUGH_THE_LOG
    if key and entry.algorithm == PLAIN and head_signed is not False:
        return PLAIN_AFTER_KEYED
    return ""
