"""Waiting holds no thread and no database connection (docs/calls.md), on PostgreSQL.

200 calls of the shipped `countdown` tool are submitted (the demo tenant runs 8 at a time, the
rest stay queued: all 200 are pending). 200 concurrent `GET /api/v1/calls/{id}?wait=…` requests
then wait on them. While they wait, the server holds fewer than 20 connections to its database
and still answers other API requests. Cancelling the calls ends every wait.
"""
import asyncio

import httpx
import psycopg
import pytest

from tests.live.server import pg_admin_url

pytestmark = [pytest.mark.live, pytest.mark.postgres]

CALLS = 200
BATCH = 50
WAIT_S = 40
MAX_CONNECTIONS = 20
PENDING = {"queued", "running"}
ENDED = {"cancelled", "interrupted"}


def server_connections(database: str) -> int:
    with psycopg.connect(pg_admin_url(), autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [database]).fetchone()
    return row[0]


async def _scenario(server) -> dict:
    limits = httpx.Limits(max_connections=CALLS + 50, max_keepalive_connections=CALLS + 50)
    timeout = httpx.Timeout(WAIT_S + 30, connect=30)
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers(), limits=limits,
                                 timeout=timeout) as client:
        response = await client.post("/api/v1/sessions", json={"agent": "ops-bot", "user": "load@example.com"})
        assert response.status_code == 201, response.text
        session = response.json()["id"]
        response = await client.post(f"/api/v1/sessions/{session}/calls",
                                     json={"name": "reset_tools", "input": {"ops": True}, "wait": 10})
        assert response.json()["calls"][0]["status"] == "succeeded", response.text

        call_ids = []
        for start in range(0, CALLS, BATCH):
            batch = [{"id": f"countdown_{n}", "name": "countdown", "input": {"seconds": 60}}
                     for n in range(start, start + BATCH)]
            response = await client.post(f"/api/v1/sessions/{session}/calls", json={"calls": batch})
            assert response.status_code == 200, response.text
            calls = response.json()["calls"]
            assert {c["status"] for c in calls} <= PENDING, calls
            call_ids += [c["id"] for c in calls]
        assert len(set(call_ids)) == CALLS

        waits = [asyncio.create_task(client.get(f"/api/v1/calls/{cid}", params={"wait": WAIT_S}))
                 for cid in call_ids]
        try:
            # Let the waits reach the server, sampling the database's connections meanwhile.
            samples = []
            for _ in range(16):
                await asyncio.sleep(0.25)
                samples.append(await asyncio.to_thread(server_connections, server.database_name))
            assert not any(w.done() for w in waits), [w.result().text for w in waits if w.done()][:3]

            # Another API request answers while all 200 waits are still pending.
            other = await client.get(f"/api/v1/sessions/{session}")
            assert other.status_code == 200, other.text
            assert other.json()["id"] == session
            samples.append(await asyncio.to_thread(server_connections, server.database_name))
            still_pending = not any(w.done() for w in waits)
            probe = await client.get(f"/api/v1/calls/{call_ids[-1]}")
            assert probe.json()["status"] in PENDING, probe.text
        finally:
            cancels = asyncio.Semaphore(16)

            async def cancel(cid):
                async with cancels:
                    return await client.post(f"/api/v1/calls/{cid}/cancel")

            cancelled = await asyncio.gather(*(cancel(cid) for cid in call_ids))
            results = await asyncio.gather(*waits, return_exceptions=True)
    return {"samples": samples, "still_pending": still_pending, "cancelled": cancelled, "results": results}


def test_waiting_holds_no_database_connections(toolkeeper_server_pg):
    outcome = asyncio.run(_scenario(toolkeeper_server_pg))
    print("connections to the server's database while 200 waits were pending:", outcome["samples"])

    assert outcome["still_pending"], "the waits ended before the other request was answered"
    assert max(outcome["samples"]) < MAX_CONNECTIONS, outcome["samples"]
    assert min(outcome["samples"]) > 0, "the server held no connection at all: were the waits served?"

    assert [r.status_code for r in outcome["cancelled"]] == [200] * CALLS, \
        [r.text for r in outcome["cancelled"] if r.status_code != 200][:3]
    errors = [r for r in outcome["results"] if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    assert [r.status_code for r in outcome["results"]] == [200] * CALLS
    assert {r.json()["status"] for r in outcome["results"]} <= ENDED
