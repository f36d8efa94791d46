"""Progress streams to apps over WebSockets through the Redis channel layer, from a Celery worker.

`countdown` with seconds=9 emits exactly 10 progress events (0/9 … 8/9, then "done" at 1.0), one a
second, between its `running` and `succeeded` status events.
"""
import asyncio

import pytest

from tests.distributed.support import is_terminal, progress, statuses, ws_collect, ws_connect

pytestmark = [pytest.mark.live, pytest.mark.postgres, pytest.mark.xdist_group("distributed")]

SECONDS = 9
EXPECTED_PROGRESS = [round(n / SECONDS, 6) for n in range(SECONDS)] + [1.0]


def _seqs(events):
    return [e["seq"] for e in events]


def _shape(events):
    return [(e["seq"], e["kind"], e["data"]) for e in events]


def test_progress_streams_in_order_and_a_reconnect_resumes_without_gaps_or_duplicates(deployment):
    tenant = deployment.a
    api = deployment.api(tenant)
    session = api.new_session("stream-bot")
    url = f"{deployment.ws_base}/ws/api/sessions/{session}/"
    header = {"Authorization": f"Bearer {tenant.api_key}"}

    async def scenario():
        # The watcher subscribes to the session before the call exists and stays connected throughout.
        watcher = await ws_connect(url, headers=header)
        call = await asyncio.to_thread(api.submit, session, "countdown", {"seconds": SECONDS})
        call_id = call["id"]
        watched = asyncio.create_task(ws_collect(watcher, lambda m: m and is_terminal(m[-1]), 60, call=call_id))

        # A second client (browser-style auth) starts from the beginning of this one call, leaves after
        # 4 progress events…
        first = await ws_connect(f"{url}?after=0&call={call_id}", subprotocols=[f"bearer.{tenant.api_key}"])
        assert first.subprotocol == f"bearer.{tenant.api_key}"
        part1 = await ws_collect(first, lambda m: len(progress(m)) == 4, 30)
        await first.close()
        last_seen = part1[-1]["seq"]
        # …stays away while at least two more events happen…
        await asyncio.to_thread(api.wait_events, call_id, lambda events: events[-1]["seq"] >= last_seen + 2, 30)
        # …and comes back with after=<last seq it saw>.
        second = await ws_connect(f"{url}?after={last_seen}&call={call_id}", headers=header)
        part2 = await ws_collect(second, lambda m: m and is_terminal(m[-1]), 60)
        await second.close()
        full = await watched
        await watcher.close()
        return call_id, full, part1, part2

    call_id, full, part1, part2 = asyncio.run(scenario())
    stored = api.events(call_id)
    final = api.call(call_id)

    assert final["status"] == "succeeded", final
    assert statuses(stored) == ["queued", "running", "succeeded"]
    assert [round(e["data"]["progress"], 6) for e in progress(stored)] == EXPECTED_PROGRESS
    assert _seqs(stored) == list(range(1, len(stored) + 1))

    # The connected client got every event, in order, and the terminal status last.
    assert _shape(full) == _shape(stored)
    assert [round(e["data"]["progress"], 6) for e in progress(full)] == EXPECTED_PROGRESS
    assert full[-1]["data"]["status"] == "succeeded"

    # Disconnect after 4 progress events, reconnect with after=<last seq>: exactly the rest.
    assert len(progress(part1)) == 4
    assert part2[0]["seq"] == part1[-1]["seq"] + 1
    assert _shape(part1 + part2) == _shape(stored)
    assert all(m["call"] == call_id for m in full + part1 + part2)
