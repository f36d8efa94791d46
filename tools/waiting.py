"""Waiting for calls without holding a thread or a database connection (DESIGN §4).

Database work of waiting requests runs on a small, fixed pool of threads, so however many apps
wait, the server holds at most that many connections for them. The wait itself is a coroutine
listening on the channel layer for the calls' status events.
"""
import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import DatabaseError, connections

from realtime.groups import session_group

from .models import ToolCall

logger = logging.getLogger("toolkeeper.calls")

_db_pool = ThreadPoolExecutor(max_workers=getattr(settings, "TOOLKEEPER_WAIT_DB_THREADS", 8),
                              thread_name_prefix="toolkeeper-db")


def _guarded(fn: Callable, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except DatabaseError:
        for conn in connections.all(initialized_only=True):
            conn.close()  # a broken connection is not handed to the next request
        raise


async def run_db(fn: Callable, *args, **kwargs):
    """Run sync ORM work on the bounded database pool."""
    return await sync_to_async(partial(_guarded, fn, *args, **kwargs), thread_sensitive=False,
                               executor=_db_pool)()


def call_statuses(tenant_id: int, call_ids: Iterable[str]) -> dict[str, str]:
    rows = ToolCall.objects.for_tenant(tenant_id).filter(pk__in=list(call_ids)).values_list("pk", "status")
    return {str(pk): status for pk, status in rows}


POLL_S = 0.25
WATCH_RECHECK_S = 1.0


async def _poll_until(tenant_id: int, call_ids, until: frozenset, deadline: float, stop: asyncio.Event) -> None:
    """The fallback when the channel layer is unreachable: read the statuses a few times a second."""
    while time.monotonic() < deadline and not stop.is_set():
        statuses = await run_db(call_statuses, tenant_id, call_ids)
        if all(statuses.get(str(cid)) in until for cid in call_ids):
            return
        await asyncio.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))


async def _receive_unless_stopped(layer, channel: str, stop: asyncio.Event, timeout: float) -> dict | None:
    """The channel's next message; None when `stop` is set or `timeout` passes first."""
    receive = asyncio.ensure_future(layer.receive(channel))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({receive, stopped}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (receive, stopped):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    return receive.result() if receive.done() and not receive.cancelled() else None


async def wait_for_calls(*, tenant_id: int, session_ids: Iterable, call_ids: Iterable[str], until: frozenset,
                         timeout: float, stop: asyncio.Event | None = None) -> None:
    """Return when every call's status is in `until`, when `stop` is set, or after `timeout` seconds."""
    stop = stop or asyncio.Event()
    deadline = time.monotonic() + timeout
    layer = get_channel_layer()
    groups = {session_group(tenant_id, sid) for sid in session_ids}
    try:
        channel = await layer.new_channel(prefix="wait")
        for group in groups:
            await layer.group_add(group, channel)
    except Exception:
        logger.warning("cannot wait on the channel layer; polling the database instead", exc_info=True)
        await _poll_until(tenant_id, call_ids, until, deadline, stop)
        return
    try:
        # Subscribe first, then read: an event between the two is not missed.
        statuses = await run_db(call_statuses, tenant_id, call_ids)
        pending = {cid for cid in map(str, call_ids) if statuses.get(cid) not in until}
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or stop.is_set():
                return
            try:
                message = await _receive_unless_stopped(layer, channel, stop, remaining)
            except Exception:
                logger.warning("waiting on the channel layer failed; polling the database instead", exc_info=True)
                await _poll_until(tenant_id, pending, until, deadline, stop)
                return
            if message is None:
                return
            if message.get("kind") == "status" and message.get("data", {}).get("status") in until:
                pending.discard(message.get("call"))
    finally:
        for group in groups:
            with contextlib.suppress(Exception):
                await layer.group_discard(group, channel)


class CallWatch:
    """What this process learns of calls settling while a request waits for them.

    The executor (and every other settler in this process) reports each settled call here after
    its commit; the waiting coroutine wakes on the event loop. In the embedded mode every status
    change happens in this process, so a wait needs neither the channel layer nor a read-back.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.settled: dict[str, object] = {}  # call id → the settled call as its settler left it
        self._changed = asyncio.Event()

    def notify(self, call) -> None:
        self.settled[str(call.pk)] = call  # one dict store: safe from any thread
        self.loop.call_soon_threadsafe(self._changed.set)

    def wake(self) -> None:
        """Have the waiting coroutine look again (call on its loop)."""
        self._changed.set()

    async def wait(self, pending: set[str], until: frozenset, timeout: float, *, recheck_s: float,
                   recheck: Callable[[set[str]], Awaitable[set[str]]], stop: asyncio.Event | None = None) -> bool:
        """Wait until no call in `pending` is outside `until`; False on timeout, or once `stop` is set
        (call wake() after setting it).

        Every `recheck_s` it asks `recheck` which calls are still pending, for a call that moved in
        another process (a management command, say).
        """
        deadline = time.monotonic() + timeout
        next_check = time.monotonic() + recheck_s
        pending = set(pending)
        while True:
            self._changed.clear()
            if stop is not None and stop.is_set():
                return False
            for call_id in list(pending):
                call = self.settled.get(call_id)
                if call is not None and call.status in until:
                    pending.discard(call_id)
            if not pending:
                return True
            now = time.monotonic()
            if now >= deadline:
                return False
            if now >= next_check:
                pending = await recheck(pending)
                next_check = time.monotonic() + recheck_s
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(deadline, next_check) - now)


_watches: dict[str, set[CallWatch]] = {}
_watches_lock = threading.Lock()


@contextlib.contextmanager
def call_watch(key):
    """Within this block, learn of this process's calls settling whose session or own id is `key`."""
    watch = CallWatch(asyncio.get_running_loop())
    key = str(key).lower()  # as str(uuid) spells it, whatever case the URL used
    with _watches_lock:
        _watches.setdefault(key, set()).add(watch)
    try:
        yield watch
    finally:
        with _watches_lock:
            watchers = _watches.get(key)
            if watchers is not None:
                watchers.discard(watch)
                if not watchers:
                    del _watches[key]


def settle_notify(call) -> None:
    for key in (str(call.session_id), str(call.pk)):
        for watch in list(_watches.get(key, ())):
            watch.notify(call)
