"""The HTTP entry: requests that present an API key take a lean path through Django.

Django's ASGI handler gives every request a fresh thread for its synchronous parts (and so a
fresh database connection), and each cookie-era middleware crosses to that thread and back for
every hook. Requests carrying an `Authorization` header use no cookies, so they run a shorter
middleware list (`API_KEY_MIDDLEWARE`: no session, CSRF, auth or messages layer) and borrow a
long-lived thread — a *lane* — that keeps its database connection from one request to the next.
Console pages, the admin and the docs keep Django's full stack.
"""
from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.db import connections
from django.db.backends.signals import connection_created
from django.dispatch import receiver

from tenancy.entry.authentication import CHECKED_KEY_SCOPE, bearer_token
from tenancy.entry.bodies import INVALID_API_KEY, BodyGuard, declared_length, header_map
from tenancy.selectors import apikey_from_token
from tools.gateway.entry import McpEndpoint, is_mcp
from tools.gateway.oauth import OAuthEndpoints, is_oauth

# Over this size, a body is read only after its API key is found valid; a smaller body costs less to
# read than the extra trip to the lane that an early lookup takes.
EARLY_KEY_CHECK_BYTES = 64 * 1024

_lane_state = threading.local()


@receiver(connection_created)
def _keep_lane_connection(sender, connection, **kwargs):
    """A lane's connection lives on across requests; Django still closes it if it breaks."""
    if getattr(_lane_state, "keeps_connections", False):
        connection.close_at = None


def _enter_lane() -> None:
    _lane_state.keeps_connections = True


def _close_connections() -> None:
    connections.close_all()


class Lanes:
    """Single-thread executors that requests borrow, one per request in flight.

    Django runs a request's synchronous parts on one thread (its thread-sensitive rule); a lane is
    that thread, reused. Beyond `size` requests at once, a request gets a thread of its own for the
    duration, as Django would give it, and that thread closes its connections when it ends.
    """

    def __init__(self, size: int):
        self.size = size
        self._idle: deque[ThreadPoolExecutor] = deque()
        self._made = 0
        self._lock = threading.Lock()

    def acquire(self) -> tuple[ThreadPoolExecutor, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
            if self._made < self.size:
                self._made += 1
                return ThreadPoolExecutor(1, "toolkeeper-lane", initializer=_enter_lane), True
        return ThreadPoolExecutor(1, "toolkeeper-request"), False

    def release(self, executor: ThreadPoolExecutor, pooled: bool) -> None:
        if pooled:
            with self._lock:
                self._idle.append(executor)
            return
        executor.submit(_close_connections)
        executor.shutdown(wait=False)


class ApiKeyHandler(ASGIHandler):
    """Django's ASGI handler with the API-key middleware list, on a borrowed lane."""

    def __init__(self, lanes: Lanes):
        self.lanes = lanes
        super().__init__()

    def load_middleware(self, is_async=False):
        # Django's loader reads settings.MIDDLEWARE; the lean list stands there while it loads.
        full = settings.MIDDLEWARE
        try:
            settings.MIDDLEWARE = settings.API_KEY_MIDDLEWARE
            super().load_middleware(is_async)
        finally:
            settings.MIDDLEWARE = full

    async def __call__(self, scope, receive, send):
        executor, pooled = self.lanes.acquire()
        try:
            async with ThreadSensitiveContext(executor=executor):
                headers = header_map(scope["headers"])
                if (declared_length(headers) or 0) > EARLY_KEY_CHECK_BYTES:
                    # A large body is read only for a valid key. DRF's authentication takes the key found here.
                    token = bearer_token(headers.get(b"authorization", b"").decode("latin-1")) or ""
                    api_key = await sync_to_async(apikey_from_token)(token)
                    if api_key is None:
                        await INVALID_API_KEY.send(send, scope["path"])
                        return
                    scope = {**scope, CHECKED_KEY_SCOPE: (token, api_key)}
                await self.handle(scope, receive, send)
        finally:
            self.lanes.release(executor, pooled)


def carries_api_key(scope) -> bool:
    if not scope["path"].startswith("/api/"):
        return False
    return any(name == b"authorization" for name, _ in scope.get("headers", ()))


class HttpRouter:
    """`/mcp/` to the MCP endpoint, its authorization server's endpoints to theirs, API-key requests to the lean
    handler, the rest to Django's full stack."""

    def __init__(self, full, api_key, mcp, oauth):
        self.full = full
        self.api_key = api_key
        self.mcp = mcp
        self.oauth = oauth

    async def __call__(self, scope, receive, send):
        if is_mcp(scope):
            return await self.mcp(scope, receive, send)
        if is_oauth(scope):
            return await self.oauth(scope, receive, send)
        handler = self.api_key if carries_api_key(scope) else self.full
        return await handler(scope, receive, send)


def http_application(full):
    """The HTTP side of the ASGI application: `full` is Django's handler (maybe wrapped)."""
    return BodyGuard(HttpRouter(full, ApiKeyHandler(Lanes(settings.TOOLKEEPER_API_THREADS)), McpEndpoint(),
                                OAuthEndpoints()))
