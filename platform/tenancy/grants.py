"""Who a long-lived connection acts for, and noticing when that access ends.

A socket or a waiting request holds the grant it was let in with: an API key, or a console user's
membership of a tenant. One thread per process re-reads the grants held in that process every
RECHECK_S seconds (one query per kind, however many holders) and tells the holders of those that
ended: a key revoked or deleted, a membership removed. Reading the database, rather than listening for
a message, reaches every server process whatever ended the access (the console, the Django admin, a
shell, a cascade) and cannot miss a revocation made while a holder was being set up.
"""
import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module

from django.conf import settings
from django.db import close_old_connections
from rest_framework import exceptions

from tenancy.models import ApiKey, Membership

logger = logging.getLogger("toolkeeper.access")

RECHECK_S = 1.0


@dataclass(frozen=True)
class Grant:
    api_key_id: int | None = None
    tenant_id: int | None = None
    user_id: int | None = None
    session_key: str | None = None  # a console login's session: it ends when the person is signed out

    def refusal(self) -> exceptions.APIException:
        """What a request answers when its grant ended while it waited."""
        if self.api_key_id is not None:
            refused = exceptions.AuthenticationFailed("Invalid or revoked API key.")
            refused.auth_header = "Bearer"
            return refused
        return exceptions.PermissionDenied("Your membership of this tenant was removed.")


def grant_of_key(api_key: ApiKey) -> Grant:
    return Grant(api_key_id=api_key.pk)


def grant_of_member(tenant_id: int, user_id: int, session_key: str | None = None) -> Grant:
    return Grant(tenant_id=tenant_id, user_id=user_id, session_key=session_key)


def grant_of(request) -> Grant | None:
    """The grant of an API request: its key, or its console user's membership."""
    if isinstance(request.auth, ApiKey):
        return grant_of_key(request.auth)
    membership = getattr(request, "membership", None)
    if membership is not None:
        session = getattr(request, "session", None)
        return grant_of_member(membership.tenant_id, membership.user_id, getattr(session, "session_key", None))
    return None


def grants_active(grants: set[Grant]) -> set[Grant]:
    """Those of `grants` that still let their holder in."""
    key_ids = {g.api_key_id for g in grants if g.api_key_id is not None}
    members = {g for g in grants if g.api_key_id is None}
    active_keys = set(ApiKey.all_tenants.filter(pk__in=key_ids, revoked_at__isnull=True)
                      .values_list("pk", flat=True)) if key_ids else set()
    active_members = set()
    if members:
        rows = Membership.objects.filter(tenant_id__in={g.tenant_id for g in members},
                                         user_id__in={g.user_id for g in members}).values_list("tenant_id", "user_id")
        pairs = set(rows)
        sessions = {g.session_key for g in members if g.session_key}
        live = _live_sessions(sessions) if sessions else set()
        active_members = {g for g in members if (g.tenant_id, g.user_id) in pairs
                          and (g.session_key is None or g.session_key in live)}
    return {g for g in grants if g.api_key_id in active_keys or g in active_members}


def _live_sessions(keys: set[str]) -> set[str]:
    """Those console sessions that still stand (a person signed out by their provider has none left)."""
    store = import_module(settings.SESSION_ENGINE).SessionStore
    return {key for key in keys if store().exists(key)}


@dataclass(frozen=True)
class _Holder:
    grant: Grant
    loop: asyncio.AbstractEventLoop
    on_end: Callable[[], None]


class GrantWatch:
    """The holders of grants in this process, and the thread that re-checks their grants."""

    def __init__(self, recheck_s: float = RECHECK_S):
        self.recheck_s = recheck_s
        self._holders: dict[int, _Holder] = {}
        self._numbers = itertools.count()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, grant: Grant, on_end: Callable[[], None]) -> int:
        """Call `on_end` (on the caller's event loop) once `grant` ends; returns a handle for release()."""
        holder = _Holder(grant, asyncio.get_running_loop(), on_end)
        with self._lock:
            number = next(self._numbers)
            self._holders[number] = holder
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="toolkeeper-grants", daemon=True)
                self._thread.start()
        return number

    def release(self, handle: int) -> None:
        with self._lock:
            self._holders.pop(handle, None)

    @contextlib.contextmanager
    def holding(self, grant: Grant | None, on_end: Callable[[], None] | None = None):
        """Within this block, an asyncio.Event that is set (and then `on_end` called) once `grant` ends;
        never, for no grant."""
        ended = asyncio.Event()

        def end() -> None:
            ended.set()
            if on_end is not None:
                on_end()

        handle = self.hold(grant, end) if grant is not None else None
        try:
            yield ended
        finally:
            if handle is not None:
                self.release(handle)

    def check(self) -> None:
        """One pass: tell the holders of grants that ended."""
        with self._lock:
            holders = dict(self._holders)
        if not holders:
            return
        active = grants_active({h.grant for h in holders.values()})
        ended = {n: h for n, h in holders.items() if h.grant not in active}
        with self._lock:
            for number in ended:
                self._holders.pop(number, None)
        for holder in ended.values():
            with contextlib.suppress(RuntimeError):  # its loop has closed: nobody is left to tell
                holder.loop.call_soon_threadsafe(holder.on_end)

    def _run(self) -> None:
        while True:
            time.sleep(self.recheck_s)
            try:
                self.check()
            except Exception:
                logger.warning("re-checking held grants failed", exc_info=True)
            finally:
                close_old_connections()


grant_watch = GrantWatch()
