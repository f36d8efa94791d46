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

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()
PUBLISH_TIMEOUT_S = 5


def _publisher_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="toolkeeper-publisher", daemon=True).start()
        return _loop


async def _send_all(layer, groups: list[str], message: dict) -> None:
    for group in groups:
        await layer.group_send(group, message)


def publish(groups: list[str], message: dict) -> None:
    """Send now, from sync code on any thread. A broadcast failure never fails the write it reports."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        if hasattr(layer, "group_send_sync"):
            for group in groups:
                layer.group_send_sync(group, message)
        else:
            future = asyncio.run_coroutine_threadsafe(_send_all(layer, groups, message), _publisher_loop())
            future.result(timeout=PUBLISH_TIMEOUT_S)
    except Exception:
        logger.warning("broadcast to %s failed", ", ".join(groups), exc_info=True)


def publish_on_commit(groups: list[str], message: dict) -> None:
    transaction.on_commit(lambda: publish(groups, message))
