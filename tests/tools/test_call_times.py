"""A call's times are in order (docs/calls.md): created, then started, then finished, whatever settles it; a call
settled in the request that submits it (denied, refused, a meta tool) included, and its first events are not
older than the call."""
import pytest

from approvals.services import rule_create
from tools.calls.submit import calls_submit
from tools.catalog.services import session_create
from tools.models import CallEvent, CallStatus, ToolCall


@pytest.fixture
def session(world):
    return session_create(tenant=world.a.tenant, agent="planner", user="u@example.com")


def _in_order(call: ToolCall) -> ToolCall:
    row = ToolCall.objects.for_tenant(call.tenant_id).get(pk=call.pk)
    assert row.finished_at is not None, row.status
    assert row.created_at <= row.finished_at, (row.status, row.created_at, row.finished_at)
    if row.started_at is not None:
        assert row.created_at <= row.started_at <= row.finished_at
    events = CallEvent.objects.for_tenant(call.tenant_id).filter(call=row).order_by("seq")
    assert events and all(event.at >= row.created_at for event in events)
    assert (call.created_at, call.finished_at) == (row.created_at, row.finished_at)  # the caller's copy agrees
    return row


def test_a_call_denied_at_submission_finishes_after_it_was_created(world, session):
    rule_create(tenant=world.a.tenant, behavior="deny", tool_pattern="current_time", note="never")
    [call] = calls_submit(session=session, calls=[{"name": "current_time", "input": {}}])
    assert call.status == CallStatus.DENIED
    _in_order(call)


@pytest.mark.parametrize("spec, status", [
    ({"name": "no_such_tool", "input": {}}, CallStatus.FAILED),  # refused by the first step
    ({"name": "reset_tools", "input": {"ops": True}}, CallStatus.SUCCEEDED),  # a meta tool, run inline
    ({"name": "reset_tools", "input": {"nope": True}}, CallStatus.FAILED),  # a meta tool that refuses its input
])
def test_calls_settled_in_the_submitting_request_have_their_times_in_order(session, spec, status):
    [call] = calls_submit(session=session, calls=[spec])
    assert call.status == status
    _in_order(call)
