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
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import DatabaseError, connections

from realtime.groups import session_group

from .models import ToolCall

QUICK_SETTLE_S = 0.05

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


async def _poll_until(tenant_id: int, call_ids, until: frozenset, deadline: float) -> None:
    """The fallback when the channel layer is unreachable: read the statuses a few times a second."""
    while time.monotonic() < deadline:
        statuses = await run_db(call_statuses, tenant_id, call_ids)
        if all(statuses.get(str(cid)) in until for cid in call_ids):
            return
        await asyncio.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))


async def wait_for_calls(*, tenant_id: int, session_ids: Iterable, call_ids: Iterable[str], until: frozenset,
                         timeout: float) -> None:
    """Return when every call's status is in `until`, or after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    layer = get_channel_layer()
    groups = {session_group(tenant_id, sid) for sid in session_ids}
    try:
        channel = await layer.new_channel(prefix="wait")
        for group in groups:
            await layer.group_add(group, channel)
    except Exception:
        logger.warning("cannot wait on the channel layer; polling the database instead", exc_info=True)
        await _poll_until(tenant_id, call_ids, until, deadline)
        return
    try:
        # Subscribe first, then read: an event between the two is not missed.
        statuses = await run_db(call_statuses, tenant_id, call_ids)
        pending = {cid for cid in map(str, call_ids) if statuses.get(cid) not in until}
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                message = await asyncio.wait_for(layer.receive(channel), timeout=remaining)
            except TimeoutError:
                return
            except Exception:
                logger.warning("waiting on the channel layer failed; polling the database instead", exc_info=True)
                await _poll_until(tenant_id, pending, until, deadline)
                return
            if message.get("kind") == "status" and message.get("data", {}).get("status") in until:
                pending.discard(message.get("call"))
    finally:
        for group in groups:
            with contextlib.suppress(Exception):
                await layer.group_discard(group, channel)


class _SettleWatch:
    def __init__(self):
        self.settled: dict[str, object] = {}  # call id → the settled call as its settler left it
        self.condition = threading.Condition()

    def wait_for(self, call_ids: set[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.condition:
            while not call_ids <= self.settled.keys():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.condition.wait(remaining)
        return True


_watches: dict[str, set[_SettleWatch]] = {}
_watches_lock = threading.Lock()


@contextlib.contextmanager
def settle_watch(session_id):
    """Within this block, learn of this process's calls of the session reaching a settled status.

    The local executor settles trivial calls within milliseconds; a request that submitted them and
    means to wait briefly blocks here (bounded by QUICK_SETTLE_S) instead of taking the full trip
    through the channel layer. Longer waits still go the async way.
    """
    watch = _SettleWatch()
    key = str(session_id)
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


def settle_notify(session_id, call) -> None:
    watchers = _watches.get(str(session_id))
    if not watchers:
        return
    for watch in list(watchers):
        with watch.condition:
            watch.settled[str(call.pk)] = call
            watch.condition.notify_all()
