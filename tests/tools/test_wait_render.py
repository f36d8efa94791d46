"""A waiting request's answer is built on the event loop when it reads nothing but the settled calls, and
on the database pool when another app has something to add (an approval request) that must be read."""
import asyncio
import threading
import uuid

from tools.api.serializers import calls_data_offline
from tools.calls.waiting import InProcessWaiter, WaitPlan
from tools.models import SETTLED_STATUSES, CallStatus, ToolCall


def settled_call(decision: dict | None) -> ToolCall:
    return ToolCall(id=uuid.uuid4(), tenant_id=1, session_id=uuid.uuid4(), call_id="call_1", tool_name="t",
                    status=CallStatus.SUCCEEDED, decision=decision)


def test_only_calls_nobody_annotates_are_rendered_offline():
    allowed = settled_call({"behavior": "allow", "rule": None, "reason": "r"})
    asked = settled_call({"behavior": "ask", "rule": 3, "reason": "r"})
    assert calls_data_offline([allowed, settled_call(None)])
    assert not calls_data_offline([asked])
    assert not calls_data_offline([allowed, asked])


def answered_on(offline: bool) -> str:
    call = settled_call(None)
    plan = WaitPlan(tenant_id=1, session_ids={call.session_id}, calls=[call], timeout=5, until=SETTLED_STATUSES,
                    grant=None, render=lambda calls: threading.current_thread().name,
                    offline=lambda calls: offline)

    async def wait() -> str:
        waiter = InProcessWaiter()
        with waiter.watching(call.session_id) as watch:
            answer = await waiter.answer(plan, watch)
        return answer.payload

    return asyncio.run(wait())


def test_an_offline_answer_is_built_on_the_loop_and_any_other_on_the_database_pool():
    assert answered_on(True) == threading.current_thread().name  # asyncio.run's loop runs in this thread
    assert answered_on(False).startswith("toolkeeper-db")
