#!/usr/bin/env python
"""A call's status event leaving a Celery pool process: through the process's publisher thread (its own event
loop) against sent on the thread that committed it (`realtime.broadcast.publish_status_inline`), in one run
(docs/performance.md, "The distributed hop").

A private redis-server holds the channel layer. The event goes to its session's group, the tenant's calls group
and its settles group, where a listener channel (a server process's, while a request waits) hears it. One
thread of this process publishes the event, as a task does after its commit, and waits until the listener's
channel holds it (a blocking pop: the server's read), then the next. Over each round this process's CPU (user +
system, `/proc`) and the wall time are divided by the events. The two ways alternate, round by round; the
medians are printed, with inline's over the thread's.

    .venv/bin/python bench/status_publish.py [--rounds 5] [--events 1000] [--json PATH]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path[:0] = [str(ROOT), str(ROOT / "platform"), str(BENCH_DIR)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolkeeper.settings")

from tests.distributed.stack import RedisServer  # noqa: E402


def measure(events: int, rounds: int) -> dict:
    import django
    import redis

    django.setup()
    from bench_http import cpu_seconds
    from channels.layers import get_channel_layer

    from realtime import broadcast
    from realtime.groups import calls_group, session_group, settled_group

    layer = get_channel_layer()
    session = uuid.uuid4()
    groups = [session_group(1, session), calls_group(1), settled_group(1)]
    message = {"type": "call.event", "call": str(uuid.uuid4()), "session": str(session), "seq": 3, "kind": "status",
               "data": {"status": "succeeded"}, "at": "2026-01-01T00:00:00+00:00"}

    async def listen() -> str:
        channel = await layer.new_channel()
        await layer.group_add(settled_group(1), channel)
        return channel

    channel = asyncio.run(listen())
    reader = redis.Redis.from_url(layer.hosts[0]["address"])
    key = layer.prefix + layer.non_local_name(channel)

    def one_round(inline: bool) -> tuple[float, float]:
        broadcast._status_inline = inline
        pid = os.getpid()
        cpu, started = cpu_seconds([pid]), time.perf_counter()
        for _ in range(events):
            broadcast.publish(groups, message, status=True)
            if not reader.bzpopmin(key, 5):
                raise RuntimeError("the event did not arrive")
        return ((cpu_seconds([pid]) - cpu) / events * 1000, (time.perf_counter() - started) / events * 1000)

    one_round(False), one_round(True)  # warm both ways up: connections, the loop thread
    figures: dict[str, list[tuple[float, float]]] = {"thread": [], "inline": []}
    for number in range(1, rounds + 1):
        for way in ("thread", "inline"):
            cpu_ms, wall_ms = one_round(way == "inline")
            figures[way].append((cpu_ms, wall_ms))
            print(f"round {number}  {way:6s}  cpu {cpu_ms:.3f} ms/event  wall {wall_ms:.3f} ms/event", flush=True)
    result = {way: {"cpu_ms_per_event": statistics.median(c for c, _ in rows),
                    "wall_ms_per_event": statistics.median(w for _, w in rows), "rounds": rows}
              for way, rows in figures.items()}
    result["inline_over_thread_cpu"] = result["inline"]["cpu_ms_per_event"] / result["thread"]["cpu_ms_per_event"]
    result["inline_over_thread_wall"] = result["inline"]["wall_ms_per_event"] / result["thread"]["wall_ms_per_event"]
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--events", type=int, default=1000, help="events per round")
    parser.add_argument("--json", help="write the results as JSON to PATH")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tk-publish-") as workdir:
        server = RedisServer(Path(workdir))
        server.start()
        try:
            os.environ["REDIS_URL"] = server.url()
            result = measure(args.events, args.rounds)
        finally:
            server.stop()
    print(f"\nmedians: thread {result['thread']['cpu_ms_per_event']:.3f} ms CPU, "
          f"{result['thread']['wall_ms_per_event']:.3f} ms wall per event; inline "
          f"{result['inline']['cpu_ms_per_event']:.3f} ms CPU, {result['inline']['wall_ms_per_event']:.3f} ms wall "
          f"(inline/thread: CPU {result['inline_over_thread_cpu']:.2f}, wall {result['inline_over_thread_wall']:.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
