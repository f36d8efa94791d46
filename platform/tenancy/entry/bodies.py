"""Request bodies: how large each may be, and what is answered before any of a body is read.

A body may be at most TOOLKEEPER_MAX_BODY_BYTES, except a multipart upload to a console page (the
knowledge upload takes many files at once): TOOLKEEPER_MAX_UPLOAD_BYTES. Before reading a body:

- a request to the API that carries no credentials (neither an Authorization header nor a session
  cookie), or an Authorization header that names no well-formed API key, is answered 401;
- a declared Content-Length over the limit is answered 413.

A body without a declared length (chunked) is answered 413 as soon as it grows past the limit. A path or query
with a NUL is answered 400 (`tenancy.entry.admission.url_problem`), whatever the method.

Daphne receives a whole body before it starts the application, so these checks run where the bytes
arrive, in daphne's request (`toolkeeper.daphne_request`), and again at the ASGI entry (`BodyGuard`),
which also gives Django a chunked body with its length: Django and DRF read a body without a
Content-Length as empty.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass

from django.conf import settings
from django.http.cookie import parse_cookie

from common.api import error_body
from common.middleware import API_PREFIXES
from tenancy.entry.admission import url_problem
from tenancy.entry.authentication import INVALID_KEY, MALFORMED_AUTHORIZATION, bearer_token
from tenancy.models import split_key

KEYED_API_PREFIX = "/api/v1/"  # every endpoint under it needs credentials
REPLAY_CHUNK = 64 * 1024


def is_api(path: str) -> bool:
    return path.startswith(API_PREFIXES)


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str
    code: str
    message: str
    challenge: bytes = b"Bearer"  # the `WWW-Authenticate` of a 401

    def answer(self, path: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
        """Headers and body: the JSON error envelope on API paths, plain text elsewhere."""
        if is_api(path):
            body, content_type = json.dumps(error_body(self.code, self.message)).encode(), b"application/json"
        else:
            body, content_type = f"{self.status} {self.message}".encode(), b"text/plain; charset=utf-8"
        headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
        if self.status == 401:
            headers.append((b"www-authenticate", self.challenge))
        return headers, body

    async def send(self, send, path: str) -> None:
        headers, body = self.answer(path)
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


TOO_LARGE = Refusal(413, "Content Too Large", "too_large", "The request body is larger than the limit.")
NOT_AUTHENTICATED = Refusal(401, "Unauthorized", "not_authenticated",
                            "Authentication credentials were not provided.")
MALFORMED_KEY = Refusal(401, "Unauthorized", "authentication_failed", MALFORMED_AUTHORIZATION)
INVALID_API_KEY = Refusal(401, "Unauthorized", "authentication_failed", INVALID_KEY)


def header_map(pairs) -> dict[bytes, bytes]:
    """Header names (lower case) to their first value."""
    headers: dict[bytes, bytes] = {}
    for name, value in pairs:
        headers.setdefault(name.lower(), value)
    return headers


def declared_length(headers: dict[bytes, bytes]) -> int | None:
    value = headers.get(b"content-length", b"")
    return int(value) if value.isdigit() else None


def carries_body(headers: dict[bytes, bytes]) -> bool:
    declared = declared_length(headers)
    return declared > 0 if declared is not None else b"transfer-encoding" in headers


def body_limit(path: str, headers: dict[bytes, bytes]) -> int:
    content_type = headers.get(b"content-type", b"").lower()
    if not is_api(path) and content_type.startswith(b"multipart/form-data"):
        return settings.TOOLKEEPER_MAX_UPLOAD_BYTES
    return settings.TOOLKEEPER_MAX_BODY_BYTES


def _credentials_refusal(headers: dict[bytes, bytes]) -> Refusal | None:
    authorization = headers.get(b"authorization")
    if authorization is None:
        cookies = parse_cookie(headers.get(b"cookie", b"").decode("latin-1"))
        return None if settings.SESSION_COOKIE_NAME in cookies else NOT_AUTHENTICATED
    token = bearer_token(authorization.decode("latin-1"))
    if token is None:
        return MALFORMED_KEY
    return None if split_key(token) else INVALID_API_KEY


def refusal_before_body(path: str, headers: dict[bytes, bytes]) -> Refusal | None:
    """What to answer without reading the request's body, or None to go on."""
    if not carries_body(headers):
        return None
    if path.startswith(KEYED_API_PREFIX) and (refusal := _credentials_refusal(headers)):
        return refusal
    declared = declared_length(headers)
    if declared is not None and declared > body_limit(path, headers):
        return TOO_LARGE
    return None


async def _spool(receive, limit: int):
    """A body without a declared length, read into a spooled file: (file, size); TOO_LARGE as soon as it
    grows past `limit`; None when the client left."""
    body = tempfile.SpooledTemporaryFile(max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE, mode="w+b")  # noqa: SIM115
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            body.close()
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            body.close()
            return TOO_LARGE
        body.write(chunk)
        if not message.get("more_body", False):
            body.seek(0)
            return body, size


def _replaying(body, receive):
    """A `receive` that hands over the spooled body, then whatever the client sends (a disconnect)."""
    finished = False

    async def replayed():
        nonlocal finished
        if finished:
            return await receive()
        chunk = body.read(REPLAY_CHUNK)
        finished = len(chunk) < REPLAY_CHUNK
        if finished:
            body.close()
        return {"type": "http.request", "body": chunk, "more_body": not finished}

    return replayed


class BodyGuard:
    """The body checks at the ASGI entry, before Django's handler reads a body into its spooled file."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope["path"]
        headers = header_map(scope.get("headers", ()))
        refusal = refusal_before_body(path, headers)
        if problem := url_problem(path, scope.get("query_string", b"")):
            refusal = Refusal(400, "Bad Request", "invalid", problem)
        if refusal is None and declared_length(headers) is None and carries_body(headers):
            spooled = await _spool(receive, body_limit(path, headers))
            if spooled is None:
                return
            if isinstance(spooled, Refusal):
                refusal = spooled
            else:
                body, size = spooled
                scope = {**scope, "headers": [*((name, value) for name, value in scope["headers"]
                                                 if name.lower() != b"transfer-encoding"),
                                               (b"content-length", str(size).encode())]}
                receive = _replaying(body, receive)
        if refusal is not None:
            await refusal.send(send, path)
            return
        await self.app(scope, receive, send)
