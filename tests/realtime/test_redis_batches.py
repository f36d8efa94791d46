"""Batches on the Redis channel layer (`realtime.layers`).

Sends (`RedisGroupSender`): what the publisher sends in one batch reaches every listener as channels_redis's
own group_send would deliver it, each group's messages in the order given, across batches too; a full
channel drops what comes to it, as before.

Reads (`BatchedRedisChannelLayer`): a server process takes what waits in one read (one round trip: a blocking
BZMPOP) and hands it out in order to each of its listeners; a receive cancelled while its read is under way loses
none of what the read takes. A Redis without BZMPOP is read with channels_redis's backup, and there too a read
cancelled after it took messages loses none of them.

Blocking sends (`RedisGroupSender.send_blocking`, `realtime.broadcast.publish_status_inline`): a worker's status
event is stored before its publish returns, in the order of its process's other events, and an unreachable Redis
holds the sending thread no longer than the sender's timeout.
"""
import asyncio
import contextlib
import os
import secrets
import socket
import time
import uuid

import pytest
import redis
from channels_redis.core import RedisChannelLayer

from realtime import broadcast
from realtime.layers import BatchedRedisChannelLayer, RedisGroupSender
from tests.live.server import port_open


def _redis_url() -> str:
    url = os.environ.get("TEST_REDIS_URL")
    if url:
        return url
    if not port_open("127.0.0.1", 6379):
        if os.environ.get("TOOLKEEPER_REQUIRE_SERVICES") == "1":
            pytest.fail("Redis is required (TOOLKEEPER_REQUIRE_SERVICES=1) but not reachable")
        pytest.skip("Redis is not reachable")
    return f"redis://127.0.0.1:6379/{secrets.randbelow(14) + 2}"


@pytest.fixture
def make_layer():
    """Layers that share a key prefix of their own, like the processes of one deployment."""
    url, prefix = _redis_url(), f"test-{uuid.uuid4().hex[:8]}"

    def make(batched: bool = False, **config) -> RedisChannelLayer:
        return (BatchedRedisChannelLayer if batched else RedisChannelLayer)(hosts=[url], prefix=prefix, **config)

    return make


def events(first: int, last: int) -> list[dict]:
    return [{"type": "call.event", "call": "c1", "seq": seq, "data": {"text": "é" * seq}}
            for seq in range(first, last + 1)]


async def _receive(layer: RedisChannelLayer, channel: str, count: int) -> list[dict]:
    return [await asyncio.wait_for(layer.receive(channel), timeout=5) for _ in range(count)]


async def _nothing_more(layer: RedisChannelLayer, channel: str) -> bool:
    try:
        await asyncio.wait_for(layer.receive(channel), timeout=0.5)
    except TimeoutError:
        return True
    return False


def test_a_batch_reaches_every_listener_in_order_across_batches(make_layer):
    # Room for all 120 messages that the first process's two listeners hear before they read any.
    server, other_server, worker = make_layer(capacity=200), make_layer(capacity=200), make_layer(capacity=200)

    async def scenario():
        # Two listeners in one process share a Redis key; a third listens from another process.
        both, session_only, calls_only = (await server.new_channel(), await server.new_channel(),
                                          await other_server.new_channel())
        await server.group_add("t1.s1", both)
        await server.group_add("t1.calls", both)
        await server.group_add("t1.s1", session_only)
        await other_server.group_add("t1.calls", calls_only)
        sender = RedisGroupSender(worker)
        for first in (1, 21, 41):  # three batches, back to back
            assert await sender.send([(["t1.s1", "t1.calls"], event) for event in events(first, first + 19)]) == 0
        received = (await _receive(server, both, 120), await _receive(server, session_only, 60),
                    await _receive(other_server, calls_only, 60), await _nothing_more(server, session_only))
        await server.flush()
        return received

    both, session_only, calls_only, nothing_more = asyncio.run(scenario())
    assert session_only == events(1, 60) and calls_only == events(1, 60) and nothing_more
    # The listener in both groups hears every event once per group, each group's copies in order.
    assert both[0::2] == events(1, 60) and both[1::2] == events(1, 60)


def test_a_batch_reads_like_channels_redis_own_group_send(make_layer):
    server, worker = make_layer(), make_layer()

    async def scenario():
        channel = await server.new_channel()
        await server.group_add("t1.inbox", channel)
        await worker.group_send("t1.inbox", {"type": "inbox.event", "n": 1})
        await RedisGroupSender(worker).send([(["t1.inbox"], {"type": "inbox.event", "n": 2})])
        received = await _receive(server, channel, 2)
        await server.flush()
        return received

    assert asyncio.run(scenario()) == [{"type": "inbox.event", "n": 1}, {"type": "inbox.event", "n": 2}]


def test_a_full_channel_drops_what_comes_to_it_and_others_still_hear(make_layer):
    server, other_server, worker = make_layer(capacity=5), make_layer(capacity=5), make_layer(capacity=5)

    async def scenario():
        full, other = await server.new_channel(), await other_server.new_channel()
        await server.group_add("t1.s1", full)
        await server.group_add("t1.s1", other)
        dropped = await RedisGroupSender(worker).send([(["t1.s1"], event) for event in events(1, 8)])
        received = (await _receive(server, full, 5), await _nothing_more(server, full),
                    await _receive(other_server, other, 5))
        await server.flush()
        return dropped, received

    dropped, (full, nothing_more, other) = asyncio.run(scenario())
    assert dropped == 6  # three for each listener
    assert full == events(1, 5) and nothing_more and other == events(1, 5)


def test_a_server_process_reads_waiting_messages_in_batches_and_in_order(make_layer):
    server, worker = make_layer(batched=True, receive_batch=7, capacity=200), make_layer(capacity=200)

    async def scenario():
        first, second = await server.new_channel(), await server.new_channel()
        await server.group_add("t1.s1", first)
        await server.group_add("t1.calls", second)
        await RedisGroupSender(worker).send([(["t1.s1", "t1.calls"], event) for event in events(1, 50)])
        # The two listeners read at the same time, as two sockets of one server do.
        received = await asyncio.gather(_receive(server, first, 50), _receive(server, second, 50))
        # Then a message sent while a read waits on an empty channel.
        waiting = asyncio.ensure_future(server.receive(first))
        await asyncio.sleep(0.2)
        await worker.group_send("t1.s1", events(51, 51)[0])
        late = await asyncio.wait_for(waiting, timeout=5)
        await server.flush()
        return received, late

    (first, second), late = asyncio.run(scenario())
    assert first == events(1, 50) and second == events(1, 50)
    assert late == events(51, 51)[0]


def test_a_batch_is_read_in_one_round_trip(make_layer):
    server, worker = make_layer(batched=True, receive_batch=10), make_layer()

    async def scenario():
        channel = await server.new_channel()
        await server.group_add("t1.s1", channel)
        await RedisGroupSender(worker).send([(["t1.s1"], event) for event in events(1, 5)])
        connection = server.connection(0)
        sent, original = [], connection.execute_command

        async def counted(*args, **kwargs):
            sent.append(args[0])
            return await original(*args, **kwargs)

        connection.execute_command = counted
        received = await _receive(server, channel, 5)
        connection.execute_command = original
        await server.flush()
        return received, sent

    received, sent = asyncio.run(scenario())
    assert received == events(1, 5)
    assert sent == ["BZMPOP"]


def test_a_receive_cancelled_while_its_read_waits_loses_nothing(make_layer):
    server, worker = make_layer(batched=True, receive_batch=10), make_layer()

    async def scenario():
        channel = await server.new_channel()
        await server.group_add("t1.s1", channel)
        waiting = asyncio.ensure_future(server.receive(channel))
        await asyncio.sleep(0.2)  # its read blocks in Redis now
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        await RedisGroupSender(worker).send([(["t1.s1"], event) for event in events(1, 5)])
        received = await _receive(server, channel, 5)
        nothing_more = await _nothing_more(server, channel)
        await server.flush()
        return received, nothing_more

    received, nothing_more = asyncio.run(scenario())
    assert received == events(1, 5) and nothing_more


def test_without_bzmpop_a_read_cancelled_after_taking_messages_loses_none(make_layer):
    server, worker = make_layer(batched=True, receive_batch=10), make_layer()
    server._blocking_batches = False  # as on a Redis before 7.0

    async def scenario():
        channel = await server.new_channel()
        await server.group_add("t1.s1", channel)
        await RedisGroupSender(worker).send([(["t1.s1"], event) for event in events(1, 5)])
        connection = server.connection(0)  # one client per layer and loop
        original_eval = connection.eval

        async def taken_then_cancelled(*args):
            await original_eval(*args)  # Redis took the messages...
            raise asyncio.CancelledError  # ...and the reader was cancelled before it held them

        connection.eval = taken_then_cancelled
        with contextlib.suppress(asyncio.CancelledError):
            await server.receive(channel)
        connection.eval = original_eval
        received = await _receive(server, channel, 5)
        await server.flush()
        return received

    assert asyncio.run(scenario()) == events(1, 5)


def test_a_blocking_send_stores_what_the_loops_send_stores_in_order(make_layer):
    """The blocking sender (a worker's settle, sent from its task's thread) writes the same messages as the
    event loop's, and a process's two senders keep one order: scores only go up."""
    server, worker = make_layer(), make_layer()
    sender = RedisGroupSender(worker)

    async def scenario():
        channel = await server.new_channel()
        await server.group_add("t1.calls", channel)
        await sender.send([(["t1.calls"], event) for event in events(1, 3)])
        # a plain thread, as a task's, while this loop waits for it
        dropped = await asyncio.to_thread(sender.send_blocking, [(["t1.calls", "t1.nobody"], e) for e in events(4, 6)])
        await sender.send([(["t1.calls"], event) for event in events(7, 8)])
        received = (dropped, await _receive(server, channel, 8), await _nothing_more(server, channel))
        await server.flush()
        return received

    dropped, received, nothing_more = asyncio.run(scenario())
    assert dropped == 0 and received == events(1, 8) and nothing_more


def test_a_blocking_send_to_an_unreachable_redis_gives_up_within_its_timeout():
    with socket.socket() as probe:  # a port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sender = RedisGroupSender(RedisChannelLayer(hosts=[f"redis://127.0.0.1:{port}/0"]))
    started = time.monotonic()
    with pytest.raises(redis.exceptions.ConnectionError):
        sender.send_blocking([(["t1.calls"], events(1, 1)[0])])
    assert time.monotonic() - started < 3 * RedisGroupSender.BLOCKING_TIMEOUT_S


@pytest.fixture
def inline_publisher(make_layer, monkeypatch):
    """`realtime.broadcast` publishing status inline (as a worker's pool process does) on a layer of its own,
    with its own publisher thread; counts what goes through that thread."""
    layer = make_layer(capacity=500)  # a sender's layer says how much a listener's channel holds
    publisher = broadcast._Publisher()
    handed_over = []
    queue_send = publisher.send

    def counted(layer, groups, message):
        handed_over.append(message["seq"])
        queue_send(layer, groups, message)

    monkeypatch.setattr(publisher, "send", counted)
    monkeypatch.setattr(broadcast, "_publisher", publisher)
    monkeypatch.setattr(broadcast, "_status_inline", True)
    monkeypatch.setattr(broadcast, "get_channel_layer", lambda: layer)
    return layer, handed_over


def test_a_worker_sends_a_status_event_on_its_own_thread(make_layer, inline_publisher):
    worker, handed_over = inline_publisher
    server = make_layer()

    async def scenario():
        channel = await server.new_channel()
        await server.group_add("t1.calls", channel)
        await asyncio.to_thread(broadcast.publish, ["t1.calls"], events(1, 1)[0], status=True)
        # stored before publish returned: no wait for another thread
        stored = await worker.connection(0).zcard(worker.prefix + worker.non_local_name(channel))
        received = await _receive(server, channel, 1)
        await server.flush()
        return stored, received

    assert asyncio.run(scenario()) == (1, events(1, 1))
    assert handed_over == []


def test_a_status_event_waits_behind_what_its_process_still_has_queued(make_layer, inline_publisher):
    """Progress events go through the publisher's thread; a status event published while some are unsent
    follows them there instead of overtaking them."""
    worker, handed_over = inline_publisher
    server = make_layer(capacity=500)

    async def scenario():
        channel = await server.new_channel()
        await server.group_add("t1.calls", channel)

        def tool_then_settle():
            for event in events(1, 300):
                broadcast.publish(["t1.calls"], event)
            broadcast.publish(["t1.calls"], events(301, 301)[0], status=True)

        await asyncio.to_thread(tool_then_settle)
        received = await _receive(server, channel, 301)
        await server.flush()
        return received

    assert asyncio.run(scenario()) == events(1, 301)
    # the 300 progress events could not all be sent by the time the status came: it was queued behind them
    assert handed_over == list(range(1, 302))
