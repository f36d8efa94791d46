"""Channel layers: an in-process one that worker threads can publish to safely, and Redis reads and
group sends in batches.

Channels' in-memory layer assumes one event loop; the embedded mode's executor threads publish
from outside it. Each receiver's queue remembers its loop, and a send from any other thread is
handed to that loop with call_soon_threadsafe.
"""
import asyncio
import contextlib
import logging
import random
import string
import threading
import time
from collections import defaultdict, deque

import redis
from channels.exceptions import ChannelFull
from channels.layers import BaseChannelLayer
from channels_redis.core import RedisChannelLayer
from redis.exceptions import ResponseError
from redis.sentinel import Sentinel, SentinelConnectionPool

logger = logging.getLogger("toolkeeper.realtime")


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


# Pushes a batch of messages onto channel keys in one round trip, with channels_redis's own rules:
# expired messages are dropped first, and a key at its capacity drops what comes to it (the
# listener misses those broadcasts; the others still get them).
# KEYS: channel keys. ARGV: each key's capacity, then now, expiry, and (key number, score, message)
# per message, in order. Returns how many messages were dropped for capacity.
_PUSH_BATCH_LUA = """
local keys = #KEYS
local now = tonumber(ARGV[keys + 1])
local expiry = tonumber(ARGV[keys + 2])
local counts = {}
for i = 1, keys do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, math.floor(now) - expiry)
    counts[i] = redis.call('ZCOUNT', KEYS[i], '-inf', '+inf')
end
local dropped = 0
for j = keys + 3, #ARGV, 3 do
    local i = tonumber(ARGV[j])
    if counts[i] < tonumber(ARGV[i]) then
        redis.call('ZADD', KEYS[i], ARGV[j + 1], ARGV[j + 2])
        counts[i] = counts[i] + 1
    else
        dropped = dropped + 1
    end
end
for i = 1, keys do
    redis.call('EXPIRE', KEYS[i], expiry)
end
return dropped
"""
# Receivers pop the lowest score first, and equal scores come out in byte order: each message of a
# sender gets a score above the one before, whatever the clock says.
_SCORE_STEP = 1e-6


class RedisGroupSender:
    """group_send for many messages at once on channels_redis's layer: what its group_send does per message
    (two group reads, a cleanup and a push: four round trips per group) takes two round trips per batch.

    The messages are those channels_redis's group_send would store (it builds and serializes them), so any
    receiver of that layer reads them. Each group's messages are stored in the order given. `send` runs on an
    event loop; `send_blocking` does the same round trips on the calling thread, with a client of its own.
    """

    # A blocking send must not hold its thread long when Redis is slow or gone: the write it reports is done.
    BLOCKING_TIMEOUT_S = 1.0

    def __init__(self, layer: RedisChannelLayer):
        self.layer = layer
        self.last_score = 0.0
        self._blocking_clients: dict[int, redis.Redis] = {}
        self._blocking_lock = threading.Lock()

    async def send(self, sends: list[tuple[list[str], dict]]) -> int:
        """Send each message to its groups: `sends` holds (groups, message) in order. Returns how many
        deliveries were dropped because a listener's channel was full."""
        members: dict[str, list[str]] = {}
        for index, names in self._groups_by_connection(sends).items():
            pipe = self.layer.connection(index).pipeline(transaction=False)
            members.update(self._read_members(names, await self._queue_member_reads(pipe, names).execute()))
        dropped = 0
        for index, keys, args in self._pushes(sends, members):
            dropped += await self.layer.connection(index).eval(_PUSH_BATCH_LUA, len(keys), *keys, *args)
        return dropped

    def send_blocking(self, sends: list[tuple[list[str], dict]]) -> int:
        """`send` on the calling thread (any thread: the clients' pools are thread-safe)."""
        members: dict[str, list[str]] = {}
        for index, names in self._groups_by_connection(sends).items():
            pipe = self._blocking_client(index).pipeline(transaction=False)
            members.update(self._read_members(names, self._queue_member_reads(pipe, names).execute()))
        dropped = 0
        for index, keys, args in self._pushes(sends, members):
            dropped += self._blocking_client(index).eval(_PUSH_BATCH_LUA, len(keys), *keys, *args)
        return dropped

    def _blocking_client(self, index: int) -> redis.Redis:
        client = self._blocking_clients.get(index)
        if client is None:
            with self._blocking_lock:
                client = self._blocking_clients.get(index)
                if client is None:
                    client = self._blocking_clients[index] = redis.Redis(
                        connection_pool=blocking_pool(self.layer.hosts[index], timeout_s=self.BLOCKING_TIMEOUT_S))
        return client

    def _groups_by_connection(self, sends) -> dict[int, list[str]]:
        by_connection: dict[int, list[str]] = defaultdict(list)
        for group in {group for groups, _ in sends for group in groups}:
            by_connection[self.layer.consistent_hash(group)].append(group)
        return by_connection

    def _queue_member_reads(self, pipe, groups: list[str]):
        """The channels of each group, after dropping those older than the group expiry: two commands a group."""
        oldest = int(time.time()) - self.layer.group_expiry
        for group in groups:
            key = self.layer._group_key(group)
            pipe.zremrangebyscore(key, min=0, max=oldest)
            pipe.zrange(key, 0, -1)
        return pipe

    @staticmethod
    def _read_members(groups: list[str], replies: list) -> dict[str, list[str]]:
        return {group: [channel.decode() for channel in channels]
                for group, channels in zip(groups, replies[1::2], strict=True)}

    def _pushes(self, sends, members: dict[str, list[str]]) -> list[tuple[int, list[bytes], list]]:
        """Per connection: the channel keys in first-use order, and the script's arguments (each key's capacity,
        then now and the expiry, then (key number, score, message) per delivery, in send order)."""
        layer = self.layer
        keys: dict[int, dict[bytes, int]] = defaultdict(dict)
        capacities: dict[int, list[int]] = defaultdict(list)
        pushes: dict[int, list] = defaultdict(list)
        for groups, message in sends:
            for group in groups:
                channels = members.get(group)
                if not channels:
                    continue
                by_connection, serialized, capacity = layer._map_channel_keys_to_connection(channels, message)
                for index, channel_keys in by_connection.items():
                    numbers = keys[index]
                    for key in channel_keys:
                        if key not in numbers:
                            numbers[key] = len(numbers) + 1
                            capacities[index].append(capacity[key])
                        pushes[index].append((numbers[key], serialized[key]))
        batches = []
        for index, numbers in keys.items():
            now = time.time()
            args: list = [*capacities[index], now, int(layer.expiry)]
            for number, payload in pushes[index]:
                self.last_score = max(now, self.last_score + _SCORE_STEP)
                args += [number, repr(self.last_score), payload]
            batches.append((index, list(numbers), args))
        return batches


def blocking_pool(host: dict, *, timeout_s: float) -> redis.ConnectionPool:
    """A blocking client's pool for one of the layer's hosts (as channels_redis builds its own for asyncio), with
    short timeouts: the layer's hosts leave reads without one, for receives that block by design."""
    host = {**host, "socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    if "address" in host:
        return redis.ConnectionPool.from_url(host.pop("address"), **host)
    master_name = host.pop("master_name", None)
    if master_name is not None:
        sentinels, sentinel_kwargs = host.pop("sentinels"), host.pop("sentinel_kwargs", None)
        return SentinelConnectionPool(master_name, Sentinel(sentinels, sentinel_kwargs=sentinel_kwargs), **host)
    return redis.ConnectionPool(**host)


# Puts back what an interrupted receive left in the backup, then takes up to ARGV[1] messages off the
# channel into the backup (where the next receive puts them back, should this one be cancelled before it
# holds them): channels_redis's cleanup, pop and backup in one round trip for a whole batch.
_POP_BATCH_LUA = """
local backed_up = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = #backed_up, 1, -2 do
    redis.call('ZADD', KEYS[1], backed_up[i], backed_up[i - 1])
end
redis.call('DEL', KEYS[2])
local popped = redis.call('ZPOPMIN', KEYS[1], ARGV[1])
for i = 1, #popped, 2 do
    redis.call('ZADD', KEYS[2], popped[i + 1], popped[i])
end
return popped
"""


class BatchedRedisChannelLayer(RedisChannelLayer):
    """channels_redis's layer, with a server process's messages read in batches, in one round trip each.

    Every consumer of a process reads one Redis key (its "specific" channel). channels_redis takes one
    message off it per four round trips (restore the backup, a blocking pop, back it up, clear the backup), so
    a burst of events queues in Redis behind the process's own reads, and past the channel's capacity events
    are dropped. Here one blocking `BZMPOP` takes what is waiting (up to `receive_batch`) or waits for the
    next message, and nothing else is sent: messages come out one by one, in order, as before.

    The backup copy guarded against losing a message taken off Redis while its reader was cancelled. Here the
    read runs in a task of its own that a cancelled receive does not cancel (`asyncio.shield`): what it takes
    lands in the process's memory, and the next receive hands it out. What is in memory is lost only with the
    process, whose channel no one reads again anyway (a process's channel name is its own). A Redis without
    `BZMPOP` (before 7.0) is read as channels_redis reads it, with the batch taken in one more round trip.
    """

    def __init__(self, *args, receive_batch: int = 100, **kwargs):
        super().__init__(*args, **kwargs)
        self.receive_batch = receive_batch
        self._taken: dict[str, deque] = defaultdict(deque)  # messages read but not yet handed out
        self._reading: dict[str, asyncio.Task] = {}  # channel → its one blocking read under way
        self._blocking_batches = True  # False once Redis said it has no BZMPOP

    async def receive_single(self, channel):
        if "!" not in channel:
            return await super().receive_single(channel)
        taken = self._taken[channel]
        while not taken and self._blocking_batches:
            reading = self._reading.get(channel)
            if reading is None or reading.done():
                reading = self._reading[channel] = asyncio.ensure_future(self._read_batch(channel, taken))
                reading.add_done_callback(_retrieved)
            await asyncio.shield(reading)
        if taken:
            return taken.popleft()
        await self._take_batch(channel, taken)
        if taken:
            return taken.popleft()
        return await super().receive_single(channel)

    async def _read_batch(self, channel: str, taken: deque) -> None:
        """One blocking pop of up to `receive_batch` messages (None after `brpop_timeout` with nothing), into
        `taken`: the reply is read even if the receive that started it was cancelled meanwhile."""
        connection = self.connection(self.consistent_hash(channel))
        try:
            reply = await connection.execute_command("BZMPOP", self.brpop_timeout, 1, self.prefix + channel, "MIN",
                                                     "COUNT", self.receive_batch)
        except ResponseError as error:
            if "unknown command" not in str(error).lower():
                raise
            logger.info("this Redis has no BZMPOP: the channel layer reads as channels_redis does")
            self._blocking_batches = False
            return
        if not reply:
            return
        self._unpack(channel, [member for member, _score in _pairs(reply[1])], taken)

    def _unpack(self, channel: str, contents: list, taken: deque) -> None:
        for content in contents:
            try:
                message = self.deserialize(content)
            except Exception:  # one unreadable message is lost, not the batch around it
                logger.exception("could not read a message of channel %s", channel)
                continue
            taken.append((message.pop("__asgi_channel__", channel), message))

    async def _take_batch(self, channel: str, taken: deque) -> None:
        index = self.consistent_hash(channel)
        channel_key = self.prefix + channel
        backup_key = self._backup_channel_name(channel_key)
        connection = self.connection(index)
        await self.receive_clean_locks.acquire(channel_key)
        try:
            popped = await connection.eval(_POP_BATCH_LUA, 2, channel_key, backup_key, self.receive_batch)
        except BaseException:
            self.receive_clean_locks.release(channel_key)
            raise
        if not popped:
            self.receive_clean_locks.release(channel_key)
            return
        # Held in memory now: clear the backup; the next read of the channel waits for that (the lock).
        cleaner = asyncio.ensure_future(connection.delete(backup_key))
        self.receive_cleaners.append(cleaner)

        def cleaned(done):
            self.receive_cleaners.remove(done)
            self.receive_clean_locks.release(channel_key)

        cleaner.add_done_callback(cleaned)
        self._unpack(channel, popped[0::2], taken)


def _pairs(elements) -> list:
    """BZMPOP's elements as (member, score) pairs, however the protocol version nests them."""
    if elements and not isinstance(elements[0], (list, tuple)):
        return list(zip(elements[0::2], elements[1::2], strict=True))
    return [tuple(pair) for pair in elements]


def _retrieved(task: asyncio.Task) -> None:
    """A read whose receive was cancelled may fail with no one awaiting it: its error is logged, not left unread."""
    if not task.cancelled() and task.exception() is not None:
        logger.warning("reading the channel layer failed", exc_info=task.exception())
