"""Broadcast after commit: a watcher never hears of a row it cannot read yet.

Sync code (views, executor threads, Celery workers) publishes through one long-lived event loop
per process, so a networked channel layer keeps its connections instead of opening new ones for
every event. What piles up while a send is under way goes out together: on Redis, a batch costs
two round trips (`realtime.layers.RedisGroupSender`), so a burst of events does not queue behind
four round trips per event and group.

A process that runs one call at a time (a Celery pool process) sends a call's status events on the
thread that committed them instead (`publish_status_inline`), while nothing it published before is still
queued: the settle reaches the waiting server without a hand-off to another thread, and a process whose
only other work is that one call spends less on the event loop than the send itself costs. Anything still
queued goes first, so each process's events stay in the order they were published.
"""
import asyncio
import logging
import threading

from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.db import transaction

from realtime.layers import RedisGroupSender

logger = logging.getLogger("toolkeeper.realtime")


class _Publisher:
    """One event loop thread per process that sends messages in the order they were handed over,
    without making the caller wait for the network."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.queue: asyncio.Queue | None = None
        self.senders: dict[int, RedisGroupSender] = {}
        self._unsent = 0  # handed over and not yet sent (or given up on)
        self._unsent_lock = threading.Lock()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), name="toolkeeper-publisher", daemon=True).start()
        ready.wait()

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.queue = asyncio.Queue()
        self.loop.call_soon(ready.set)
        self.loop.run_until_complete(self._drain())

    async def _drain(self) -> None:
        while True:
            batch = [await self.queue.get()]
            while not self.queue.empty() and len(batch) < 200:
                batch.append(self.queue.get_nowait())
            per_layer: dict[int, list] = {}
            for layer, groups, message in batch:
                per_layer.setdefault(id(layer), [layer]).append((groups, message))
            try:
                await asyncio.gather(*(self._send_batch(entries[0], entries[1:]) for entries in per_layer.values()))
            finally:
                with self._unsent_lock:
                    self._unsent -= len(batch)

    async def _send_batch(self, layer, sends: list[tuple[list[str], dict]]) -> None:
        if isinstance(layer, RedisChannelLayer):
            await self._send_through_redis(layer, sends)
            return
        # Each group gets its messages in order; different groups are served at the same time.
        per_group: dict[str, list[dict]] = {}
        for groups, message in sends:
            for group in groups:
                per_group.setdefault(group, []).append(message)
        await asyncio.gather(*(self._send_in_order(layer, group, messages) for group, messages in per_group.items()))

    async def _send_through_redis(self, layer: RedisChannelLayer, sends: list[tuple[list[str], dict]]) -> None:
        # The whole batch in two round trips: a burst of events drains as fast as it is written.
        sender = self.sender(layer)
        try:
            dropped = await sender.send(sends)
        except Exception:
            logger.warning("broadcast of %d messages failed", len(sends), exc_info=True)
            return
        if dropped:
            logger.info("%d deliveries dropped: a listener's channel was full", dropped)

    @staticmethod
    async def _send_in_order(layer, group: str, messages: list[dict]) -> None:
        for message in messages:
            try:
                await layer.group_send(group, message)
            except Exception:
                logger.warning("broadcast to %s failed", group, exc_info=True)

    def sender(self, layer: RedisChannelLayer) -> RedisGroupSender:
        sender = self.senders.get(id(layer))
        if sender is None or sender.layer is not layer:
            sender = self.senders[id(layer)] = RedisGroupSender(layer)
        return sender

    def send(self, layer, groups: list[str], message: dict) -> None:
        with self._unsent_lock:
            self._unsent += 1
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (layer, groups, message))

    def send_now_if_idle(self, layer: RedisChannelLayer, groups: list[str], message: dict) -> bool:
        """Send on this thread if nothing handed over before is still unsent (else False: queue it)."""
        with self._unsent_lock:
            if self._unsent:
                return False
        dropped = self.sender(layer).send_blocking([(groups, message)])
        if dropped:
            logger.info("%d deliveries dropped: a listener's channel was full", dropped)
        return True


_publisher: _Publisher | None = None
_publisher_lock = threading.Lock()
_status_inline = False


def publish_status_inline() -> None:
    """From now on this process sends status events on the publishing thread when it can (see above)."""
    global _status_inline
    _status_inline = True


def _get_publisher() -> _Publisher:
    global _publisher
    with _publisher_lock:
        if _publisher is None:
            _publisher = _Publisher()
        return _publisher


def publish(groups: list[str], message: dict, *, status: bool = False) -> None:
    """Send from sync code on any thread. A broadcast failure never fails the write it reports. `status`: a
    call's status event, which a process that publishes status inline sends right away."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        if hasattr(layer, "group_send_sync"):
            for group in groups:
                layer.group_send_sync(group, message)
            return
        publisher = _get_publisher()
        if status and _status_inline and isinstance(layer, RedisChannelLayer) and \
                publisher.send_now_if_idle(layer, groups, message):
            return
        publisher.send(layer, groups, message)
    except Exception:
        logger.warning("broadcast to %s failed", ", ".join(groups), exc_info=True)


def publish_on_commit(groups: list[str], message: dict, *, status: bool = False) -> None:
    transaction.on_commit(lambda: publish(groups, message, status=status))
