"""A call's state changes and progress, exactly as they are written and told: the rows and numbered events, the
call object the caller holds afterwards, what is broadcast to the session's and the tenant's groups after commit,
and the waits of this process told of a call that settled."""
import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import transaction
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from realtime import broadcast
from realtime.groups import calls_group, session_group, settled_group
from tools.calls.events import call_event_append, call_fail, call_failure, call_record, call_transition
from tools.calls.waiting import call_watch
from tools.models import CallStatus, ToolCall

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def told(monkeypatch):
    """What is broadcast: (groups, message), in order; each status event marked as one (a worker sends those
    from its own thread, realtime.broadcast)."""
    sent = []

    def publish(groups, message, *, status=False):
        assert status == (message["kind"] == "status")
        sent.append((groups, message))

    monkeypatch.setattr(broadcast, "publish", publish)
    return sent


def a_call(tenant_world, *, status=CallStatus.RUNNING, call_id="c1", **fields) -> ToolCall:
    tool = tenant_world.tools["current_time"]
    return ToolCall.objects.create(tenant=tenant_world.tenant, session=tenant_world.session, call_id=call_id, tool=tool,
                                   tool_name="current_time", effective_input={}, status=status, **fields)


def new_call(tenant_world, call_id="n1") -> ToolCall:
    return ToolCall(tenant=tenant_world.tenant, session=tenant_world.session, call_id=call_id,
                    tool_name="current_time", input={})


def row(call: ToolCall) -> ToolCall:
    return ToolCall.all_tenants.get(pk=call.pk)


def events(call: ToolCall) -> list[tuple]:
    return [(e.seq, e.kind, e.data) for e in row(call).events.order_by("seq")]


def groups_of(call: ToolCall, *, settles: bool = False) -> list[str]:
    """A call's event goes to its session and its tenant's calls; the status that settles it to the waits too."""
    groups = [session_group(call.tenant_id, call.session_id), calls_group(call.tenant_id)]
    return [*groups, settled_group(call.tenant_id)] if settles else groups


def message(call: ToolCall, seq: int, kind: str, data: dict) -> dict:
    at = row(call).events.get(seq=seq).at
    return {"type": "call.event", "call": str(call.pk), "session": str(call.session_id), "seq": seq, "kind": kind,
            "data": data, "at": at.isoformat()}


def settled_seen(key, write) -> dict:
    """Run `write` while a wait of this process watches `key`: the calls it was told settled, by id."""
    async def watch():
        with call_watch(key) as watching:
            await sync_to_async(write, thread_sensitive=False)()
            await asyncio.sleep(0)  # the notice is handed to this loop
            return {call_id: call.status for call_id, call in watching.settled.items()}

    return asyncio.run(watch())


def test_an_event_is_numbered_after_the_call_s_last_and_broadcast(world, told):
    call = a_call(world.a)
    first = call_event_append(call=call, kind="output", data={"text": "one"})
    second = call_event_append(call=call, kind="progress", data={"text": "two", "progress": 0.5},
                               while_status=CallStatus.RUNNING)
    assert (first, second) == (1, 2)
    assert events(call) == [(1, "output", {"text": "one"}), (2, "progress", {"text": "two", "progress": 0.5})]
    assert told == [(groups_of(call), message(call, 1, "output", {"text": "one"})),
                    (groups_of(call), message(call, 2, "progress", {"text": "two", "progress": 0.5}))]
    assert row(call).event_seq == 2


def test_an_event_while_a_status_is_written_only_while_the_call_is_in_it(world, told):
    call = a_call(world.a, status=CallStatus.SUCCEEDED)
    assert call_event_append(call=call, kind="output", data={"text": "late"}, while_status=CallStatus.RUNNING) is None
    assert events(call) == [] and told == []
    assert call_event_append(call=call, kind="log", data={"text": "note"}) == 1
    assert events(call) == [(1, "log", {"text": "note"})]


def test_a_transition_moves_the_row_and_the_caller_s_copy_and_tells_of_it(world, told):
    call = a_call(world.a, status=CallStatus.QUEUED, attempts=1)
    assert call_transition(call=call, from_statuses=[CallStatus.QUEUED], to_status=CallStatus.RUNNING,
                           event_data={"retry": 2}, attempts=1, lease_until=None)
    moved = row(call)
    assert (moved.status, moved.attempts, moved.event_seq, moved.finished_at) == (CallStatus.RUNNING, 2, 1, None)
    assert (call.status, call.attempts, call.event_seq, call.finished_at) == (CallStatus.RUNNING, 2, 1, None)
    assert events(call) == [(1, "status", {"status": "running", "retry": 2})]
    assert told == [(groups_of(call), message(call, 1, "status", {"status": "running", "retry": 2}))]


def test_a_transition_from_another_status_writes_nothing(world, told):
    call = a_call(world.a, status=CallStatus.SUCCEEDED)
    assert not call_transition(call=call, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.FAILED)
    assert (row(call).status, call.status, call.event_seq) == (CallStatus.SUCCEEDED, CallStatus.SUCCEEDED, 0)
    assert events(call) == [] and told == []


def test_a_transition_whose_condition_fails_writes_nothing(world, told):
    call = a_call(world.a)
    assert not call_transition(call=call, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.SUCCEEDED,
                               condition=("1 = %s", [2]))
    assert row(call).status == CallStatus.RUNNING and events(call) == [] and told == []
    assert call_transition(call=call, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.SUCCEEDED,
                           condition=("1 = %s", [1]))
    assert row(call).status == CallStatus.SUCCEEDED


def test_a_settling_transition_stamps_its_end_unless_given_one(world):
    given = timezone.now() - timedelta(hours=1)
    stamped, kept = a_call(world.a), a_call(world.a, call_id="c2")
    before = timezone.now()
    assert call_transition(call=stamped, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.SUCCEEDED)
    assert call_transition(call=kept, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.CANCELLED,
                           finished_at=given)
    assert before <= row(stamped).finished_at <= timezone.now() and stamped.finished_at == row(stamped).finished_at
    assert row(kept).finished_at == given == kept.finished_at


def test_a_settling_transition_tells_the_waits_after_commit_and_a_move_on_does_not(world):
    call = a_call(world.a, status=CallStatus.QUEUED)
    assert settled_seen(call.pk, lambda: call_transition(
        call=call, from_statuses=[CallStatus.QUEUED], to_status=CallStatus.RUNNING)) == {}

    def settle_in_a_transaction():
        with transaction.atomic():
            call_transition(call=call, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.SUCCEEDED)

    assert settled_seen(call.session_id, settle_in_a_transaction) == {str(call.pk): CallStatus.SUCCEEDED}


def test_a_failure_is_the_error_the_result_and_the_event_data(world):
    call = a_call(world.a)
    error = {"errorType": "Boom", "error": "it broke", "tool": "current_time", "callId": "c1"}
    assert call_failure(call, error_type="Boom", message="it broke") == (
        {"error": error, "result": {"state": "error", "content": [{"type": "text", "text": "Boom: it broke"}],
                                    "structured": None}},
        {"error": error})
    own = {"state": "error", "content": [], "structured": {"code": 7}}
    assert call_failure(call, error_type="Boom", message="it broke", event_data={"reason": "x"}, result=own) == (
        {"error": error, "result": own}, {"error": error, "reason": "x"})


def test_failing_a_call_settles_it_with_its_error_and_status(world, told):
    call = a_call(world.a)
    own = {"state": "error", "content": [], "structured": {"code": 7}}
    assert call_fail(call=call, error_type="Upstream", message="no", from_statuses=[CallStatus.RUNNING],
                     status=CallStatus.TIMED_OUT, event_data={"reason": "slow"}, result=own, lease_until=None)
    error = {"errorType": "Upstream", "error": "no", "tool": "current_time", "callId": "c1"}
    failed = row(call)
    assert (failed.status, failed.error, failed.result) == (CallStatus.TIMED_OUT, error, own)
    assert failed.finished_at is not None
    assert events(call) == [(1, "status", {"status": "timed_out", "error": error, "reason": "slow"})]
    assert told == [(groups_of(call, settles=True), message(call, 1, "status", events(call)[0][2]))]
    assert not call_fail(call=call, error_type="Late", message="no", from_statuses=[CallStatus.RUNNING])
    plain = a_call(world.a, call_id="c2")
    assert call_fail(call=plain, error_type="ToolError", message="bad", from_statuses=[CallStatus.RUNNING])
    assert (row(plain).status, row(plain).result["content"][0]["text"]) == (CallStatus.FAILED, "ToolError: bad")


def test_recording_a_new_call_without_a_status_writes_its_row_alone(world, told):
    call = new_call(world.a)
    assert call_record(call, tool=world.a.tools["current_time"], effective_input={"timezone": "UTC"})
    written = row(call)
    assert (written.status, written.event_seq, written.tool_id, written.effective_input) == (
        CallStatus.RECEIVED, 0, world.a.tools["current_time"].pk, {"timezone": "UTC"})
    assert events(call) == [] and told == []
    assert not call_record(new_call(world.a))  # the session already has a call with this id


def test_recording_a_new_call_in_a_status_writes_each_move_s_event(world, told):
    call = new_call(world.a)
    assert call_record(call, status=CallStatus.FAILED, passing=(CallStatus.QUEUED, CallStatus.RUNNING),
                       event_data={"reason": "x"}, error={"errorType": "E"})
    written = row(call)
    assert (written.status, written.event_seq, written.error) == (CallStatus.FAILED, 3, {"errorType": "E"})
    assert (call.status, call.event_seq) == (CallStatus.FAILED, 3)
    assert written.finished_at is not None and call.finished_at == written.finished_at
    expected = [(1, "status", {"status": "queued"}), (2, "status", {"status": "running"}),
                (3, "status", {"status": "failed", "reason": "x"})]
    assert events(call) == expected
    # only the move that settles it reaches the waits' group
    assert told == [(groups_of(call, settles=seq == 3), message(call, seq, kind, data))
                    for seq, kind, data in expected]


def test_recording_a_call_in_a_status_keeps_a_given_end_and_stamps_none_before_it_settles(world):
    given = timezone.now() - timedelta(hours=1)
    ended = new_call(world.a)
    assert call_record(ended, status=CallStatus.SUCCEEDED, finished_at=given)
    assert row(ended).finished_at == given
    waiting = new_call(world.a, "n2")
    assert call_record(waiting, status=CallStatus.AWAITING_APPROVAL)
    assert row(waiting).finished_at is None
    assert events(waiting) == [(1, "status", {"status": "awaiting_approval"})]


def test_recording_a_call_whose_id_is_taken_writes_nothing_and_leaves_it_unrecorded(world, told):
    assert call_record(new_call(world.a), status=CallStatus.QUEUED)
    told.clear()
    again = new_call(world.a)
    assert not call_record(again, status=CallStatus.QUEUED)
    assert (again.status, again.event_seq) == (CallStatus.RECEIVED, 0)
    assert told == []


def test_recording_a_settled_call_tells_the_waits(world):
    call = new_call(world.a)
    assert settled_seen(world.a.session.pk, lambda: call_record(call, status=CallStatus.SUCCEEDED)) == {
        str(call.pk): CallStatus.SUCCEEDED}
    queued = new_call(world.a, "n2")
    assert settled_seen(world.a.session.pk, lambda: call_record(queued, status=CallStatus.QUEUED)) == {}


def test_a_status_change_that_fails_in_a_caller_s_transaction_dooms_that_transaction(world):
    """No savepoint of its own: a change that fails inside a transaction leaves it to roll back whole."""
    call = a_call(world.a)
    with pytest.raises(TransactionManagementError), transaction.atomic():
        with pytest.raises(TypeError):
            call_transition(call=call, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.FAILED,
                            event_data={"unwritable": object()})
        ToolCall.all_tenants.filter(pk=call.pk).update(status=CallStatus.CANCELLED)
    assert row(call).status == CallStatus.RUNNING and events(call) == []
