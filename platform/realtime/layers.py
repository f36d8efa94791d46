"""An in-process channel layer that worker threads can publish to safely.

Channels' in-memory layer assumes one event loop; the embedded mode's executor threads publish
from outside it. Each receiver's queue remembers its loop, and a send from any other thread is
handed to that loop with call_soon_threadsafe.
"""
import asyncio
import contextlib
import random
import string
import threading
import time
from collections import defaultdict

from channels.exceptions import ChannelFull
from channels.layers import BaseChannelLayer


class _Inbox:
    __slots__ = ("loop", "queue")

    def __init__(self, loop: asyncio.AbstractEventLoop, capacity: int):
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=capacity)


class InProcessChannelLayer(BaseChannelLayer):
    extensions = ["groups", "flush"]

    def __init__(self, expiry=60, group_expiry=86400, capacity=1000, channel_capacity=None, **kwargs):
        super().__init__(expiry=expiry, capacity=capacity, channel_capacity=channel_capacity, **kwargs)
        self.group_expiry = group_expiry
        self._lock = threading.Lock()
        self._inboxes: dict[str, _Inbox] = {}
        self._pending: dict[str, list] = defaultdict(list)  # sent before anyone received
        self._groups: dict[str, dict[str, float]] = defaultdict(dict)

    async def new_channel(self, prefix="specific"):
        suffix = "".join(random.choices(string.ascii_letters, k=12))
        name = f"{prefix}.inprocess!{suffix}"
        self._inbox(name, asyncio.get_running_loop())
        return name

    def _inbox(self, channel: str, loop: asyncio.AbstractEventLoop) -> _Inbox:
        with self._lock:
            inbox = self._inboxes.get(channel)
            if inbox is None or inbox.loop is not loop:
                inbox = _Inbox(loop, self.get_capacity(channel))
                self._inboxes[channel] = inbox
                for message in self._pending.pop(channel, []):
                    inbox.queue.put_nowait(message)
            return inbox

    def _deliver(self, channel: str, message: dict) -> None:
        with self._lock:
            inbox = self._inboxes.get(channel)
            if inbox is None:
                pending = self._pending[channel]
                if len(pending) >= self.get_capacity(channel):
                    raise ChannelFull(channel)
                pending.append(message)
                return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is inbox.loop:
            if inbox.queue.full():
                raise ChannelFull(channel)
            inbox.queue.put_nowait(message)
        elif not inbox.loop.is_closed():
            inbox.loop.call_soon_threadsafe(self._put_dropping_when_full, inbox.queue, message)

    @staticmethod
    def _put_dropping_when_full(queue: asyncio.Queue, message: dict) -> None:
        if not queue.full():
            queue.put_nowait(message)

    async def send(self, channel, message):
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_channel_name(channel)
        self._deliver(channel, dict(message))

    async def receive(self, channel):
        self.require_valid_channel_name(channel)
        inbox = self._inbox(channel, asyncio.get_running_loop())
        return await inbox.queue.get()

    async def group_add(self, group, channel):
        self.require_valid_group_name(group)
        self.require_valid_channel_name(channel)
        with self._lock:
            self._groups[group][channel] = time.monotonic()

    async def group_discard(self, group, channel):
        with self._lock:
            members = self._groups.get(group)
            if members is not None:
                members.pop(channel, None)
                if not members:
                    del self._groups[group]
            if not any(channel in members for members in self._groups.values()):
                self._inboxes.pop(channel, None)
                self._pending.pop(channel, None)

    async def group_send(self, group, message):
        self.group_send_sync(group, message)

    def group_send_sync(self, group, message):
        """group_send for sync code on any thread, without an event loop of its own."""
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_group_name(group)
        with self._lock:
            now = time.monotonic()
            members = self._groups.get(group, {})
            stale = [c for c, added in members.items() if now - added > self.group_expiry]
            for channel in stale:
                members.pop(channel, None)
            channels = list(members)
        for channel in channels:
            with contextlib.suppress(ChannelFull):  # a full listener misses a broadcast; others still get it
                self._deliver(channel, dict(message))

    async def flush(self):
        with self._lock:
            self._inboxes.clear()
            self._pending.clear()
            self._groups.clear()

    async def close(self):
        pass
