"""The governed chain's own steps and its resumption, exactly: which steps run again when a held call goes on,
what a held call whose tool went away fails with, what a reviewer's edit is checked and bound against, and what
the chain's context writes (its collected changes, the moves a call passes on the way, its failures)."""
from types import SimpleNamespace

import pytest
from django.db import transaction
from django.db.transaction import TransactionManagementError

from approvals.services import rule_create
from tests.tools.support import install_tool, wait_terminal
from tools.calls.pipeline import (
    NO_POLICY_DECISION,
    CallContext,
    input_problems,
    input_refusal,
    pipeline_resume,
    pipeline_run,
)
from tools.calls.submit import calls_submit
from tools.catalog.schemas import ToolMisconfigured
from tools.catalog.services import tool_external_create
from tools.models import CallStatus, Tool, ToolCall, ToolGroup

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("drain_calls")]

BOUND = {"timezone": "Asia/Tokyo"}  # world.a's binding of current_time for its session's agent


def held(tenant_world, name: str = "current_time", arguments: dict | None = None, call_id: str = "h1") -> ToolCall:
    """A call of `name` held by an ask rule at the permission step."""
    rule_create(tenant=tenant_world.tenant, behavior="ask", tool_pattern=name)
    (call,) = calls_submit(session=tenant_world.session, calls=[{"id": call_id, "name": name,
                                                                 "input": arguments or {}}])
    assert call.status == CallStatus.AWAITING_APPROVAL
    return ToolCall.objects.for_tenant(tenant_world.tenant).select_related("session").get(pk=call.pk)


def row(call: ToolCall) -> ToolCall:
    return ToolCall.all_tenants.get(pk=call.pk)


def statuses(call: ToolCall) -> list[str]:
    return [e.data["status"] for e in row(call).events.order_by("seq") if e.kind == "status"]


def hide_from_the_session(tenant_world, name: str) -> None:
    for group in ToolGroup.objects.for_tenant(tenant_world.tenant):
        group.tools.remove(tenant_world.tools[name])


def test_an_approved_call_goes_on_after_the_step_that_held_it(world):
    call = held(world.a)
    pipeline_resume(call=call, after="permission")
    done = wait_terminal(call.pk, tenant=world.a.tenant)
    assert done.status == CallStatus.SUCCEEDED and done.effective_input == BOUND
    assert statuses(call) == ["awaiting_approval", "queued", "running", "succeeded"]


def test_an_approved_call_of_an_external_tool_waits_for_its_answer(world):
    tool = tool_external_create(tenant=world.a.tenant, name="book_room", description="By hand.",
                                input_schema={"properties": {"room": {"type": "string"}}, "required": ["room"]})
    ToolGroup.objects.for_tenant(world.a.tenant).get(name="basic").tools.add(tool)
    call = held(world.a, "book_room", {"room": "Everest"})
    pipeline_resume(call=call, after="permission")
    waiting = row(call)
    assert waiting.status == CallStatus.AWAITING_EXTERNAL
    assert statuses(call) == ["awaiting_approval", "awaiting_external"]


@pytest.fixture
def shout(make_tool):
    def shout(text: str) -> dict:
        """Shout.

        Args:
            text: What to shout.
        """
        return {"text": text.upper()}

    return make_tool(shout)


def test_an_edited_input_is_validated_again(world, shout):
    call = held(world.a, shout.name, {"text": "hi"})
    pipeline_resume(call=call, after="permission", new_input={"text": 5})
    invalid = row(call)
    assert (invalid.status, invalid.error["errorType"]) == (CallStatus.FAILED, "InvalidInput")
    assert invalid.error["error"].startswith("text: ")
    assert statuses(call) == ["awaiting_approval", "failed"]


def test_an_edit_that_sets_a_bound_argument_is_refused(world):
    call = held(world.a)
    pipeline_resume(call=call, after="permission", new_input={"timezone": "UTC"})
    refused = row(call)
    assert (refused.status, refused.error["errorType"], refused.error["error"]) == (
        CallStatus.FAILED, "BoundArgumentOverride", "timezone: fixed by the server and cannot be set")


def test_an_edit_is_bound_before_the_call_runs(world):
    call = held(world.a)
    pipeline_resume(call=call, after="permission", new_input={})
    done = wait_terminal(call.pk, tenant=world.a.tenant)
    assert (done.status, done.effective_input) == (CallStatus.SUCCEEDED, BOUND)
    assert done.result["structured"]["timezone"] == "Asia/Tokyo"


def test_an_edited_call_runs_as_the_tool_the_session_now_has_under_its_name(world):
    """The catalog row was made again while the call was held: the edit's normalize step takes the new one."""
    call = held(world.a)
    Tool.objects.for_tenant(world.a.tenant).filter(pk=call.tool_id).delete()
    tool = install_tool(world.a.tenant, "current_time")
    pipeline_resume(call=call, after="permission", new_input={"timezone": "UTC"})
    done = wait_terminal(call.pk, tenant=world.a.tenant)
    assert (done.status, done.tool_id, done.effective_input) == (CallStatus.SUCCEEDED, tool.pk, {"timezone": "UTC"})


def test_a_held_call_whose_tool_went_away_fails_as_no_longer_available(world):
    call = held(world.a)
    hide_from_the_session(world.a, "current_time")
    pipeline_resume(call=call, after="permission")
    gone = row(call)
    assert (gone.status, gone.error["errorType"], gone.error["error"]) == (
        CallStatus.FAILED, "ToolNotAvailable", "'current_time' is no longer available in this session")
    assert statuses(call) == ["awaiting_approval", "failed"]


def test_the_refusals_of_an_input(world):
    exposed = SimpleNamespace(bound=BOUND, validator=SimpleNamespace(errors=lambda arguments: []))
    assert input_refusal(exposed, ["x"]) == ("InvalidInput", ["input must be a JSON object"])
    assert input_refusal(exposed, {"timezone": "UTC"}) == (
        "BoundArgumentOverride", ["timezone: fixed by the server and cannot be set"])
    assert input_refusal(exposed, {"other": 1}) is None
    picky = SimpleNamespace(bound={}, validator=SimpleNamespace(errors=lambda arguments: ["a: bad", "b: worse"]))
    assert input_refusal(picky, {"a": 1}) == ("InvalidInput", ["a: bad", "b: worse"])

    def misconfigured(arguments):
        raise ToolMisconfigured("the input schema cannot be read")

    broken = SimpleNamespace(bound={}, validator=SimpleNamespace(errors=misconfigured))
    assert input_refusal(broken, {}) == ("ToolMisconfigured", ["the input schema cannot be read"])


def test_the_problems_of_a_reviewer_s_edit(world):
    session = world.a.session
    assert input_problems(session=session, tool_name="current_time", new_input={}) == []
    assert input_problems(session=session, tool_name="current_time", new_input={"timezone": "UTC"}) == [
        "timezone: fixed by the server and cannot be set"]
    assert input_problems(session=session, tool_name="no_such_tool", new_input={}) == [
        "'no_such_tool' is no longer available in this session"]
    call = held(world.a)
    # with the call, the call's own tool is what the edit is checked against
    assert input_problems(session=session, tool_name="no_such_tool", new_input={}, call=call) == []
    hide_from_the_session(world.a, "current_time")
    assert input_problems(session=session, tool_name="current_time", new_input={}, call=call) == [
        "'current_time' is no longer available in this session"]


def a_row(tenant_world, *, status=CallStatus.RECEIVED, call_id="r1", **fields) -> ToolCall:
    return ToolCall.objects.create(tenant=tenant_world.tenant, session=tenant_world.session, call_id=call_id,
                                   tool=tenant_world.tools["current_time"], tool_name="current_time", input={},
                                   status=status, **fields)


def test_the_context_writes_its_collected_changes_to_a_written_call(world):
    call = a_row(world.a)
    ctx = CallContext(call=call, session=world.a.session)
    ctx.set(effective_input={"a": 1})
    ctx.ensure_decision()
    assert (call.effective_input, call.decision) == ({"a": 1}, NO_POLICY_DECISION)
    ctx.flush()
    written = row(call)
    assert (written.effective_input, written.decision) == ({"a": 1}, NO_POLICY_DECISION)
    assert ctx.pending == {}


def test_a_decision_already_made_is_kept(world):
    decided = {"behavior": "allow", "rule": 7, "reason": "a rule"}
    call = a_row(world.a, decision=decided)
    ctx = CallContext(call=call, session=world.a.session)
    ctx.ensure_decision()
    ctx.flush()
    assert ctx.pending == {} and row(call).decision == decided


def test_the_context_hands_a_new_call_s_changes_to_its_record(world):
    recorded = []
    ctx = CallContext(call=ToolCall(tenant=world.a.tenant, session=world.a.session), session=world.a.session,
                      record=lambda **fields: recorded.append(fields) or True)
    ctx.set(effective_input={"a": 1})
    ctx.flush()
    assert recorded == [{"effective_input": {"a": 1}}]
    assert ctx.record is None
    ctx.flush()
    assert recorded == [{"effective_input": {"a": 1}}]


def test_the_context_moves_a_new_call_through_its_record_once(world):
    recorded = []
    ctx = CallContext(call=ToolCall(tenant=world.a.tenant, session=world.a.session), session=world.a.session,
                      record=lambda **fields: recorded.append(fields) or True)
    ctx.set(decision={"behavior": "allow"})
    assert ctx.transition(CallStatus.QUEUED, passing=(CallStatus.RUNNING,), event_data={"x": 1}, effective_input={})
    assert recorded == [{"status": CallStatus.QUEUED, "passing": (CallStatus.RUNNING,), "event_data": {"x": 1},
                         "decision": {"behavior": "allow"}, "effective_input": {}}]
    assert ctx.record is None and ctx.pending == {}


def test_the_context_moves_a_written_call_through_the_statuses_it_passes(world):
    call = a_row(world.a)
    ctx = CallContext(call=call, session=world.a.session)
    ctx.set(effective_input={"b": 2})
    assert ctx.transition(CallStatus.SUCCEEDED, passing=(CallStatus.QUEUED, CallStatus.RUNNING),
                          event_data={"note": "n"}, result={"state": "success"})
    moved = row(call)
    assert (moved.status, moved.effective_input, moved.result) == (CallStatus.SUCCEEDED, {"b": 2},
                                                                   {"state": "success"})
    assert [e.data for e in moved.events.order_by("seq")] == [
        {"status": "queued"}, {"status": "running"}, {"status": "succeeded", "note": "n"}]


def test_the_context_stops_when_a_call_it_moves_was_moved_elsewhere(world):
    call = a_row(world.a)
    ToolCall.all_tenants.filter(pk=call.pk).update(status=CallStatus.CANCELLED)
    ctx = CallContext(call=call, session=world.a.session)
    assert not ctx.transition(CallStatus.SUCCEEDED, passing=(CallStatus.QUEUED,))
    assert row(call).status == CallStatus.CANCELLED and statuses(call) == []


def test_the_last_move_of_a_stale_copy_is_refused_too(world):
    """No statuses to pass: the move itself is conditional on the status the context last saw."""
    call = a_row(world.a, status=CallStatus.QUEUED, call_id="stale")
    ToolCall.all_tenants.filter(pk=call.pk).update(status=CallStatus.CANCELLED)
    ctx = CallContext(call=call, session=world.a.session)
    ctx.set(effective_input={"late": True})
    assert not ctx.transition(CallStatus.RUNNING)
    kept = row(call)
    assert (kept.status, kept.effective_input, statuses(call)) == (CallStatus.CANCELLED, {}, [])
    assert call.status == CallStatus.QUEUED  # the copy is not moved either


def test_failing_in_the_context_settles_the_call_and_ends_the_chain(world):
    call = a_row(world.a, status=CallStatus.RECEIVED, call_id="f1")
    ctx = CallContext(call=call, session=world.a.session)
    assert ctx.fail("PolicyDenied", "not here", status=CallStatus.DENIED) is False
    denied = row(call)
    error = {"errorType": "PolicyDenied", "error": "not here", "tool": "current_time", "callId": "f1"}
    assert (denied.status, denied.error) == (CallStatus.DENIED, error)
    assert [e.data for e in denied.events.order_by("seq")] == [{"status": "denied", "error": error}]


def test_a_chain_that_fails_in_a_caller_s_transaction_dooms_that_transaction(world):
    """The chain takes no savepoint of its own: whatever called it inside a transaction rolls back whole."""
    def unwritable(**fields):
        raise RuntimeError("the row could not be written")

    call = ToolCall(tenant=world.a.tenant, session=world.a.session, call_id="x1", tool_name="current_time", input={})
    ctx = CallContext(call=call, session=world.a.session, record=unwritable)
    with pytest.raises(TransactionManagementError), transaction.atomic():
        with pytest.raises(RuntimeError, match="could not be written"):
            pipeline_run(ctx)
        ToolCall.objects.for_tenant(world.a.tenant).count()


def test_a_refused_input_fails_the_call_with_every_problem_in_one_message(world):
    (call,) = calls_submit(session=world.a.session, calls=[{"id": "two_wrongs", "name": "calculate",
                                                            "input": {"expression": 5, "unexpected": True}}])
    from tools.catalog.declared import call_exposed

    call = row(call)
    assert call.status == CallStatus.FAILED and call.error["errorType"] == "InvalidInput"
    error_type, problems = input_refusal(call_exposed(call.session, call), call.input)
    assert error_type == "InvalidInput" and len(problems) == 2
    assert call.error["error"] == f"{problems[0]}; {problems[1]}"
