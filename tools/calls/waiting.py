"""Waiting for calls without holding a thread or a database connection (docs/calls.md).

A request that waits declares what for (`WaitPlan`: which calls, until which statuses, how long, under
which grant, how to render the answer); the runtime's waiter (`tools.calls.runtime`) does the rest through one
entry point, `Waiter.answer`:

- `InProcessWaiter` (embedded mode): every status change happens in this process, so a watch armed
  before the view runs (`call_watch`) hears each call settle after its commit (`settle_notify`, from
  `tools.calls.events`) and the answer is built from the calls as their settlers left them, with a re-read of
  the statuses once a second for a call moved by another process (a management command).
- `ChannelLayerWaiter` (distributed mode): the same watch hears the calls settle from the process's one
  listener on the channel layer (`TenantCallsListener`; the database is polled if the layer is
  unreachable), then the calls are read back.

Either way the wait ends early, refused, when the request's grant (its key or membership) ends.
Database work of waiting requests runs on a small, fixed pool of threads (`run_db`), so however many
apps wait, the server holds at most that many connections for them.
"""
import asyncio
import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import DatabaseError, connections

from realtime.groups import settled_group
from tenancy.fastread import fetch_one
from tenancy.grants import Grant, grant_watch
from tools.calls.statements import call_statuses
from tools.models import SETTLED_STATUSES, ToolCall

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
    """Run sync ORM work on the bounded database pool, in a copy of the caller's context. (The pool's
    threads are plain threads: Django keeps their connections per thread, and nothing there goes back to
    the event loop, so asgiref's sync_to_async adds only its cost, about half again a hop's.)"""
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(
        _db_pool, context.run, partial(_guarded, fn, *args, **kwargs))


POLL_S = 0.25
WATCH_RECHECK_S = 1.0


@dataclass(frozen=True)
class SettledElsewhere:
    """A call settled in another process, as its status event told: enough to end a wait, not to answer it."""
    pk: str
    session_id: str
    status: str


class TenantCallsListener:
    """One listener per server process in the distributed mode: the first wait for a tenant's calls joins
    the tenant's settles group (`realtime.groups.settled_group`, where the status event that settles each call
    is published, and no other event: a call wakes the listener once) with one channel of this process, and a
    task on the event loop hands each of those events to the waits of this process (`settle_notify`), as the
    executor does in the embedded mode. A wait then costs the channel layer nothing; a channel per wait cost a
    group join, a receive and a group leave each.
    Membership is renewed at a quarter of the layer's group expiry; a listener that stopped leaves its
    groups before a new one joins them."""

    RENEW_PART = 0.25

    def __init__(self):
        self._channel: str | None = None
        self._joined: dict[int, float] = {}  # tenant id → when joined (or its membership last renewed)
        self._since: dict[int, float] = {}  # tenant id → when the channel first joined its group
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None

    async def listening(self, tenant_id: int) -> bool:
        """Whether the tenant's status events reach this process's waits (False: the layer is unreachable)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (tests run several): start over on it
            self._loop, self._lock, self._channel, self._joined, self._task = loop, asyncio.Lock(), None, {}, None
            self._since = {}
        layer = get_channel_layer()
        renew_s = getattr(layer, "group_expiry", 86400) * self.RENEW_PART
        joined = self._joined.get(tenant_id)
        if joined is not None and time.monotonic() - joined < renew_s and self._task and not self._task.done():
            return True
        async with self._lock:
            try:
                if self._channel is None or self._task is None or self._task.done():
                    if self._channel is not None:  # a listener that stopped: its channel leaves its groups
                        for joined_tenant in self._joined:
                            with contextlib.suppress(Exception):
                                await layer.group_discard(settled_group(joined_tenant), self._channel)
                    # the default prefix: a process has one real channel, read by one receive loop (another
                    # prefix would be a second real channel whose blocking reads hold the first one up)
                    self._channel = await layer.new_channel()
                    self._joined, self._since = {}, {}
                    self._task = loop.create_task(self._receive(layer, self._channel))
                if tenant_id not in self._joined or time.monotonic() - self._joined[tenant_id] >= renew_s:
                    await layer.group_add(settled_group(tenant_id), self._channel)
                    self._joined[tenant_id] = time.monotonic()
                    self._since.setdefault(tenant_id, self._joined[tenant_id])  # a renewal leaves no gap
            except Exception:
                logger.warning("cannot listen on the channel layer; waits read the database instead", exc_info=True)
                return False
        return True

    def heard_since(self, tenant_id: int) -> float | None:
        """Since when (`time.monotonic()`) every status event of the tenant's calls reaches this process's waits,
        as long as the listener runs: when its channel joined the tenant's group. None: not listening."""
        if self._task is None or self._task.done():
            return None
        return self._since.get(tenant_id)

    async def _receive(self, layer, channel: str) -> None:
        while True:
            try:
                message = await layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("listening on the channel layer failed; the next wait joins again", exc_info=True)
                return
            status = (message.get("data") or {}).get("status") if message.get("kind") == "status" else None
            if status in SETTLED_STATUSES and message.get("call"):
                try:
                    settle_notify(SettledElsewhere(pk=message["call"], session_id=message.get("session", ""),
                                                   status=status))
                except Exception:  # one bad message must not end the listening
                    logger.exception("could not pass on a settled call's event")


tenant_calls_listener = TenantCallsListener()


class CallWatch:
    """What this process learns of calls settling while a request waits for them.

    The executor (and every other settler in this process) reports each settled call here after
    its commit; the waiting coroutine wakes on the event loop. In the embedded mode every status
    change happens in this process, so a wait needs neither the channel layer nor a read-back.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.armed_at = time.monotonic()  # from now on, a settle in this process (or heard from another) is told
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


# --- what a request waits for, and the waiters of the two modes ---------------------------------

@dataclass
class WaitPlan:
    """What a waiting request waits for: `calls` as the view left them, until each is in `until`, for at
    most `timeout` seconds, as long as its `grant` (the key or membership it came in with) lasts. `render`
    builds the answer from the calls as they ended up (run on the database pool)."""
    tenant_id: int
    session_ids: set
    calls: list[ToolCall]
    timeout: float
    until: frozenset
    grant: Grant | None
    render: Callable[[list[ToolCall]], object]
    # Whether `render` reads nothing from the database for these calls: then it runs on the event loop.
    offline: Callable[[list[ToolCall]], bool] = lambda calls: False  # noqa: E731

    @property
    def call_ids(self) -> list[str]:
        return [str(c.pk) for c in self.calls]

    def pending(self) -> set[str]:
        return {str(c.pk) for c in self.calls if c.status not in self.until}

    def waits(self) -> bool:
        return self.timeout > 0 and bool(self.pending())


@dataclass(frozen=True)
class WaitAnswer:
    payload: object = None
    refused: bool = False  # the grant ended while the request waited: answer `grant.refusal()`


def _read_back(plan: WaitPlan):
    if len(plan.call_ids) == 1:  # the usual wait: one plain statement, not a queryset to build
        call = fetch_one(ToolCall, pk=plan.call_ids[0], tenant=plan.tenant_id)
        by_id = {plan.call_ids[0]: call} if call is not None else {}
    else:
        by_id = {str(c.pk): c for c in ToolCall.objects.for_tenant(plan.tenant_id).filter(pk__in=plan.call_ids)}
    return plan.render([by_id[cid] for cid in plan.call_ids])


class Waiter:
    """How a request waits for its calls. `watching` is armed before the request's view runs;
    `answer` waits as the plan says and renders what it found."""

    def watching(self, key):
        return call_watch(key)

    async def settled(self, plan: WaitPlan, watch: CallWatch, stop: asyncio.Event) -> list[ToolCall] | None:
        """Wait; the plan's calls as their settlers left them, or None when they must be read back."""
        raise NotImplementedError

    async def answer(self, plan: WaitPlan, watch: CallWatch) -> WaitAnswer:
        with grant_watch.holding(plan.grant, on_end=watch.wake) as access_ended:
            settled = await self.settled(plan, watch, access_ended)
            if access_ended.is_set():
                return WaitAnswer(refused=True)
            if settled is not None:
                if plan.offline(settled):
                    return WaitAnswer(payload=plan.render(settled))
                return WaitAnswer(payload=await run_db(plan.render, settled))
        return WaitAnswer(payload=await run_db(_read_back, plan))


class InProcessWaiter(Waiter):
    """The embedded mode: calls settle in this process, and their settlers tell the watch."""

    async def settled(self, plan, watch, stop):
        async def recheck(pending: set[str]) -> set[str]:
            statuses = await run_db(call_statuses, plan.tenant_id, pending)
            return {cid for cid in pending if statuses.get(cid) not in plan.until}

        pending = plan.pending()
        await watch.wait(pending, plan.until, plan.timeout, recheck_s=WATCH_RECHECK_S, recheck=recheck, stop=stop)
        settled_here = {cid: watch.settled.get(cid) for cid in pending}
        if stop.is_set() or not all(call is not None and call.status in plan.until
                                    for call in settled_here.values()):
            return None
        return [settled_here.get(str(c.pk), c) for c in plan.calls]


class ChannelLayerWaiter(Waiter):
    """The distributed mode: calls settle in workers; their status events reach this process's waits through
    its one listener (`TenantCallsListener`), then the calls are read back.

    The statuses are read before waiting only when the listener joined the tenant's group after the watch was
    armed (the first wait of a tenant in this process, a listener started again): a call that settled between
    the view's look and that join sent its event to no one of this process. When the listener was already in
    the group, every settle after the view's look reaches the watch, armed before the view ran: the read bought
    nothing, and cost a hop to the database pool and a statement per wait."""

    async def settled(self, plan, watch, stop):
        listening = await tenant_calls_listener.listening(plan.tenant_id)

        async def recheck(pending: set[str]) -> set[str]:
            statuses = await run_db(call_statuses, plan.tenant_id, pending)
            return {cid for cid in pending if statuses.get(cid) not in plan.until}

        pending = plan.pending()
        since = tenant_calls_listener.heard_since(plan.tenant_id) if listening else None
        if since is None or since >= watch.armed_at or not plan.until <= SETTLED_STATUSES:
            # joined late: the watch and the listener are in place before this read, so a settle after it is heard
            pending = await recheck(pending)
        if pending:
            await watch.wait(pending, plan.until, plan.timeout, recheck_s=WATCH_RECHECK_S if listening else POLL_S,
                             recheck=recheck, stop=stop)
        return None
