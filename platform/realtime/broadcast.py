"""Broadcast after commit: a watcher never hears of a row it cannot read yet.

Sync code (views, executor threads, Celery workers) publishes through one long-lived event loop
per process, so a networked channel layer keeps its connections instead of opening new ones for
every event.
"""
import asyncio
import logging
import threading

from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger("toolkeeper.realtime")


class _Publisher:
    """One event loop thread per process that sends messages in the order they were handed over,
    without making the caller wait for the network."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.queue: asyncio.Queue | None = None
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
            # Each group gets its messages in order; different groups are served at the same time.
            per_group: dict[tuple, list[dict]] = {}
            for layer, groups, message in batch:
                for group in groups:
                    per_group.setdefault((id(layer), group), [layer]).append(message)
            await asyncio.gather(*(self._send_in_order(entries[0], group, entries[1:])
                                   for (_, group), entries in per_group.items()))

    @staticmethod
    async def _send_in_order(layer, group: str, messages: list[dict]) -> None:
        for message in messages:
            try:
                await layer.group_send(group, message)
            except Exception:
                logger.warning("broadcast to %s failed", group, exc_info=True)

    def send(self, layer, groups: list[str], message: dict) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (layer, groups, message))


_publisher: _Publisher | None = None
_publisher_lock = threading.Lock()


def _get_publisher() -> _Publisher:
    global _publisher
    with _publisher_lock:
        if _publisher is None:
            _publisher = _Publisher()
        return _publisher


def publish(groups: list[str], message: dict) -> None:
    """Send from sync code on any thread. A broadcast failure never fails the write it reports."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        if hasattr(layer, "group_send_sync"):
            for group in groups:
                layer.group_send_sync(group, message)
        else:
            _get_publisher().send(layer, groups, message)
    except Exception:
        logger.warning("broadcast to %s failed", ", ".join(groups), exc_info=True)


def publish_on_commit(groups: list[str], message: dict) -> None:
    transaction.on_commit(lambda: publish(groups, message))
