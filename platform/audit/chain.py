"""How the audit chain is hashed and how a chain head is signed.

An entry's hash covers its content and the previous entry's hash. Without an audit key it is a plain
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
