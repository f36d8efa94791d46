"""The distributed mode's waiter reads the calls' statuses before waiting only when its process's listener joined the
tenant's group late (docs/notes/calls-and-execution.md, "Distributed execution"). Run in this process, on the
in-process channel layer: no stack needed."""
import asyncio
import time

import pytest
from channels.layers import get_channel_layer
from django.db import connections

from realtime.groups import settled_group
from tools.calls import waiting
from tools.calls.submit import calls_submit
from tools.calls.waiting import ChannelLayerWaiter, TenantCallsListener, WaitPlan
from tools.catalog.services import session_create
from tools.models import SETTLED_STATUSES, CallStatus, ToolCall

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def status_reads(monkeypatch):
    """The statuses the waits of this process read (a fresh listener: none of its tenants joined yet)."""
    reads: list[set] = []
    read = waiting.call_statuses

    def noted(tenant_id, call_ids, **kwargs):
        reads.append(set(map(str, call_ids)))
        return read(tenant_id, call_ids, **kwargs)

    monkeypatch.setattr(waiting, "call_statuses", noted)
    monkeypatch.setattr(waiting, "tenant_calls_listener", TenantCallsListener())
    monkeypatch.setattr(waiting, "WATCH_RECHECK_S", 60.0)  # a wait ends by what it hears, not by a re-read
    return reads


def running_calls(world, count: int) -> list[ToolCall]:
    session = session_create(tenant=world.a.tenant, agent="waits")
    calls = calls_submit(session=session, calls=[{"name": "current_time", "input": {}}] * count)
    ids = [call.pk for call in calls]
    deadline = time.monotonic() + 10  # the embedded executor runs them: let it finish before they are put back
    while ToolCall.objects.for_tenant(world.a.tenant).filter(pk__in=ids, status=CallStatus.SUCCEEDED).count() < count:
        assert time.monotonic() < deadline, "the calls did not run"
        time.sleep(0.01)
    ToolCall.objects.for_tenant(world.a.tenant).filter(pk__in=ids).update(status=CallStatus.RUNNING)
    return list(ToolCall.objects.for_tenant(world.a.tenant).filter(pk__in=ids).order_by("created_at"))


def plan_for(call: ToolCall) -> WaitPlan:
    return WaitPlan(tenant_id=call.tenant_id, session_ids={call.session_id}, calls=[call], timeout=10,
                    until=SETTLED_STATUSES, grant=None, render=list, offline=lambda calls: True)


def settle(call: ToolCall) -> None:
    """In a thread of its own, as a worker would (its connection closed after)."""
    try:
        ToolCall.objects.for_tenant(call.tenant_id).filter(pk=call.pk).update(status=CallStatus.SUCCEEDED)
    finally:
        connections.close_all()


async def status_event(call: ToolCall) -> None:
    await get_channel_layer().group_send(settled_group(call.tenant_id), {
        "type": "call.event", "call": str(call.pk), "session": str(call.session_id), "seq": 9, "kind": "status",
        "data": {"status": CallStatus.SUCCEEDED}, "at": "2026-01-01T00:00:00+00:00"})


def test_a_wait_reads_the_statuses_only_when_its_listener_joined_late(world, status_reads, drain_calls):
    early, later = running_calls(world, 2)
    waiter = ChannelLayerWaiter()

    async def waits():
        # The first wait of the tenant in this process: its call settled before the listener joined, and its
        # event reached no one here. The read before waiting finds it.
        await asyncio.to_thread(settle, early)
        with waiter.watching(early.session_id) as watch:
            first = await waiter.answer(plan_for(early), watch)
        # The listener is in the group now, from before the next wait's watch: no read, and the settle is heard.
        with waiter.watching(later.session_id) as watch:
            waiting_for = asyncio.ensure_future(waiter.answer(plan_for(later), watch))
            await asyncio.sleep(0.05)
            assert not waiting_for.done()
            await asyncio.to_thread(settle, later)
            await status_event(later)
            second = await waiting_for
        return first, second

    first, second = asyncio.run(waits())
    assert [call.status for call in first.payload] == [CallStatus.SUCCEEDED]
    assert [call.status for call in second.payload] == [CallStatus.SUCCEEDED]
    assert status_reads == [{str(early.pk)}], "only the wait whose listener joined late read the statuses"


def test_a_listener_started_again_reads_before_waiting(world, status_reads, drain_calls):
    """A listener whose receiving stopped joins again with a new channel: the waits in between heard nothing."""
    first, second = running_calls(world, 2)
    waiter = ChannelLayerWaiter()

    async def waits():
        await asyncio.to_thread(settle, first)
        with waiter.watching(first.session_id) as watch:
            await waiter.answer(plan_for(first), watch)
        waiting.tenant_calls_listener._task.cancel()
        await asyncio.sleep(0)
        await asyncio.to_thread(settle, second)
        with waiter.watching(second.session_id) as watch:
            return await waiter.answer(plan_for(second), watch)

    answer = asyncio.run(waits())
    assert [call.status for call in answer.payload] == [CallStatus.SUCCEEDED]
    assert status_reads == [{str(first.pk)}, {str(second.pk)}]
