"""Submitting and cancelling calls: the services behind the API's call endpoints, the MCP endpoint and
operator-started work.

`calls_submit` records a batch and runs each call through the pipeline (`tools.calls.pipeline`); the pipeline's
last step, `Dispatch`, is here: it runs meta tools inline (`tools.catalog.meta`) and hands every other call to
the runtime's executor after commit. `call_cancel` stops a call wherever it is. This module sits above
the pipeline and the runtime, so neither of them imports an executor.
"""
from contextvars import ContextVar

from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from common.errors import Conflict, ServiceError
from tenancy.entry.limits import calls_admit
from tenancy.models import SYSTEM_AGENT
from tools.calls.events import call_record, call_transition
from tools.calls.meta import meta_run
from tools.calls.pipeline import CallContext, Step, pipeline_run
from tools.calls.runtime import runtime
from tools.calls.statements import calls_in_flight, session_call_count_add
from tools.calls.traces import call_trace_fields
from tools.catalog.services import session_create
from tools.models import AgentSession, CallStatus, Tool, ToolCall
from tools.python.results import interrupted_result
from tools.signals import call_cancelled


class _Claims:
    """The executor places taken by one submission whose transaction is the outermost one (`calls_submit`):
    it alone sees whether that transaction commits. If it does not, the places are given back; if it did
    and something after the commit failed (an earlier commit hook), the claimed calls are started anyway:
    they are `running` in the database."""

    def __init__(self):
        self.jobs: list = []  # (job, call)
        self.committed = False

    def mark_committed(self) -> None:
        self.committed = True

    def settle_after_error(self, executor) -> None:
        for job, call in self.jobs:
            if self.committed:
                executor.start_claimed(job, call)  # no-op for those already started
            else:
                executor.release(job)


_claims_in_submission: ContextVar[_Claims | None] = ContextVar("claims_in_submission", default=None)


class Dispatch(Step):
    """The pipeline's last step: meta tools run now, in the request; other calls are queued for the executor.

    An executor that can say a call may start at once (`claim_now`, the local executor's) has it moved to
    `running` in the submission's own transaction and started after commit: one write transaction fewer
    per call than a claim of its own. That takes a submission that sees its transaction end."""

    name = "dispatch"

    def process(self, ctx: CallContext) -> bool:
        ctx.ensure_decision()
        if ctx.exposed.is_meta:
            ctx.transition(CallStatus.RUNNING, started_at=timezone.now())
            meta_run(call=ctx.call, session=ctx.session)
            return False
        executor = runtime().executor
        # an executor of a deployment's own (TOOLKEEPER_EXECUTOR_CLASS) may know nothing of stamps or claims
        stamp = getattr(executor, "queued_fields", dict)()
        call = ctx.call
        claims = _claims_in_submission.get()
        job = executor.claim_now(call) if claims is not None and hasattr(executor, "claim_now") else None
        if job is not None:  # queued and running at once: for a new call, its row and both events in one write
            claims.jobs.append((job, call))  # given back if the transaction does not commit, whatever ends it
            if ctx.transition(CallStatus.RUNNING, passing=(CallStatus.QUEUED,), started_at=timezone.now(),
                              attempts=1, **stamp):
                transaction.on_commit(lambda: executor.start_claimed(job, call), robust=True)
            else:
                claims.jobs.remove((job, call))
                executor.release(job)
            return False
        if not ctx.transition(CallStatus.QUEUED, **stamp):
            return False
        transaction.on_commit(lambda: executor.submit(call, stamped=True) if stamp else executor.submit(call))
        return False


def _same_request(call: ToolCall, spec: dict) -> bool:
    return call.tool_name == spec["name"] and call.input == spec.get("input", {})


class _GeneratedIds:
    """`call_<n>` ids from n = first on, skipping those the batch names itself; one the session already has
    shows when its row is not written (tried with `unless_taken`), and the next is taken."""

    def __init__(self, first: int, reserved: set):
        self.next, self.reserved = first, reserved

    def take(self) -> str:
        while f"call_{self.next}" in self.reserved:
            self.next += 1
        self.next += 1
        return f"call_{self.next - 1}"


class _CallRecorder:
    """Writes a submitted call's row when the chain first moves it (`CallContext.record`), then its audit entry.
    A generated id the session already has shows when the row is not written, and the next is tried; an id the
    request named that a concurrent request took first is a conflict (the whole batch rolls back)."""

    def __init__(self, call: ToolCall, *, ids: _GeneratedIds | None, api_key):
        self.call, self.ids, self.api_key = call, ids, api_key

    def __call__(self, *, status: str | None = None, passing: tuple[str, ...] = (), event_data: dict | None = None,
                 **fields) -> bool:
        call = self.call
        while not call_record(call, status=status, passing=passing, event_data=event_data, **fields):
            if self.ids is None:
                raise Conflict(f"call id {call.call_id!r} is already used in this session")
            call.call_id = self.ids.take()
            for holder in (fields, event_data or {}):  # an error for the model names the call by its id
                error = holder.get("error")
                if isinstance(error, dict) and "callId" in error:
                    holder["error"] = {**error, "callId": call.call_id}
        audit_record(tenant=call.session.tenant, actor=self.api_key and f"apikey:{self.api_key.name}",
                     verb="call.received", target=f"call:{call.pk}",
                     data={"tool": call.tool_name, "call_id": call.call_id})
        return True


def calls_submit(*, session: AgentSession, calls: list[dict], api_key=None, declared=None,
                 traceparent: str | None = None) -> list[ToolCall]:
    """Record and govern a batch of calls, in request order; `declared`: the tools the request declared for its
    own calls (tools.catalog.declared.Declarations); `traceparent`: the app's, as it sent it (the calls' traces
    continue a valid one; anything else is ignored).

    Resending a call_id the session already has returns that call, not a second execution;
    reusing it for a different call is a conflict.
    """
    explicit = [spec["id"] for spec in calls if spec.get("id")]
    if len(explicit) != len(set(explicit)):
        raise ServiceError({"calls": ["call ids must be unique within a batch"]})
    claims = _Claims() if not transaction.get_connection().in_atomic_block else None
    token = _claims_in_submission.set(claims)
    try:
        return _submitted(session=session, calls=calls, api_key=api_key, declared=declared, explicit=explicit,
                          claims=claims, traceparent=traceparent)
    except BaseException:
        if claims is not None:
            claims.settle_after_error(runtime().executor)
        raise
    finally:
        _claims_in_submission.reset(token)


def _submitted(*, session: AgentSession, calls: list[dict], api_key, declared, explicit: list,
               claims: _Claims | None, traceparent: str | None) -> list[ToolCall]:
    with transaction.atomic():
        if claims is not None:
            transaction.on_commit(claims.mark_committed)  # first of the callbacks: they run after the commit
        existing = {
            call.call_id: call
            for call in ToolCall.objects.for_tenant(session.tenant_id).filter(session=session, call_id__in=explicit)
        } if explicit else {}  # most calls name no id: skip building a query that cannot match
        for spec in calls:
            prior = existing.get(spec.get("id"))
            if prior is not None and not _same_request(prior, spec):
                raise Conflict(f"call id {spec['id']!r} was already used for a different call in this session")
        fresh = [spec for spec in calls if spec.get("id") not in existing]
        calls_admit(tenant=session.tenant, api_key=api_key, adding=len(fresh),
                    in_flight=lambda: calls_in_flight(tenant=session.tenant, api_key=api_key))
        generated = _GeneratedIds(session_call_count_add(session, len(fresh)) - len(fresh) + 1, set(explicit))
        results: list[ToolCall] = []
        for spec in calls:
            if spec.get("id") in existing:
                results.append(existing[spec["id"]])
                continue
            call = ToolCall(
                tenant=session.tenant, session=session, call_id=spec.get("id") or generated.take(),
                tool_name=spec["name"], input=spec.get("input", {}),
                declared_tool=declared.declared_tool(spec["name"]) if declared is not None else None,
                **call_trace_fields(traceparent),
            )
            results.append(call)
            # the row is written by the chain's first move (or at its end), with that move's event; it was created
            # when it was received, before the chain (its trace's root span starts then)
            call.created_at = timezone.now()
            record = _CallRecorder(call, ids=None if spec.get("id") else generated, api_key=api_key)
            pipeline_run(CallContext(call=call, session=session, declared=declared, record=record))
    return results


def work_start(*, tenant, tool_name: str, arguments: dict, actor) -> ToolCall:
    """Operator-started work on a built-in tool (a large ingest, a report): a call in the tenant's system
    session, run by the executor like any other and streamed live, so its progress shows on its call page.
    Such tools belong to no group, so no model is ever offered them."""
    tool = Tool.objects.for_tenant(tenant).filter(name=tool_name, enabled=True).first()
    if tool is None:
        raise ServiceError({"tool": [f"{tool_name} is not available"]})
    label = str(getattr(actor, "username", actor or "system"))
    with transaction.atomic():
        session = AgentSession.objects.for_tenant(tenant).filter(agent=SYSTEM_AGENT, api_key=None).first() or \
            AgentSession.objects.create(tenant=tenant, agent=SYSTEM_AGENT, user="", context={"system": True})
        number = session_call_count_add(session, 1)
        call = ToolCall.objects.create(
            tenant=tenant, session=session, call_id=f"work_{number}", tool=tool, tool_name=tool.name,
            input={key: value for key, value in arguments.items() if key != "documents"} | (
                {"documents": f"{len(arguments['documents'])} documents"} if "documents" in arguments else {}),
            effective_input=arguments,
            decision={"behavior": "allow", "rule": None, "reason": f"work started by {label}"},
            **call_trace_fields(),
        )
        audit_record(tenant=tenant, actor=actor, verb="work.started", target=f"call:{call.pk}",
                     data={"tool": tool.name})
        if call_transition(call=call, from_statuses=[CallStatus.RECEIVED], to_status=CallStatus.QUEUED):
            transaction.on_commit(lambda: runtime().executor.submit(call))
    return call


OPERATOR_TEST = "operator_test"  # the key of a session's context that names the operator who tried a tool


def operator_test_call(*, tenant, tool: Tool, arguments, agent: str, user: str = "", actor=None) -> ToolCall:
    """An operator tries a tool from its page: a call in a new session of `agent` (and `user`) that takes the
    whole path an app's call takes (what the agent's sessions see, the rules, bound arguments, limits, a
    reviewer when a rule asks), marked as the operator's test in its session and the audit log."""
    if not isinstance(arguments, dict):
        raise ServiceError({"input": ["a JSON object of the tool's arguments"]})
    label = str(getattr(actor, "username", actor or "an operator"))
    with transaction.atomic():
        session = session_create(tenant=tenant, agent=agent, user=user, context={OPERATOR_TEST: label})
        call = calls_submit(session=session, calls=[{"name": tool.name, "input": arguments}])[0]
        audit_record(tenant=tenant, actor=actor, verb="tool.tried", target=f"call:{call.pk}",
                     data={"tool": tool.name, "agent": agent, "user": user})
    return call


@transaction.atomic
def call_cancel(*, call: ToolCall, actor=None, sparing_people: bool = False) -> ToolCall:
    """Stop a call: not yet started → cancelled; running → interrupted (the tool is told to stop).
    `sparing_people` leaves a call that waits for a reviewer or an external party as it is (Conflict)."""
    # A call waiting for its user's answer has not started when a confirm rule asks, and runs when its tool asks.
    asking_tool = (call.question or {}).get("kind") == "tool"
    people = [CallStatus.AWAITING_APPROVAL, CallStatus.AWAITING_EXTERNAL] + (
        [] if asking_tool else [CallStatus.AWAITING_USER])
    not_started = [CallStatus.RECEIVED, CallStatus.QUEUED] + ([] if sparing_people else people)
    running = [CallStatus.RUNNING] + ([CallStatus.AWAITING_USER] if asking_tool and not sparing_people else [])
    moved = call_transition(
        call=call, from_statuses=not_started, to_status=CallStatus.CANCELLED,
        result=interrupted_result("cancelled before it ran"), cancel_requested=True,
    ) or call_transition(
        call=call, from_statuses=running, to_status=CallStatus.INTERRUPTED,
        result=interrupted_result("interrupted by a cancel request"), cancel_requested=True,
    )
    if not moved:
        call.refresh_from_db()
        raise Conflict(f"the call is already {call.status}")
    call_cancelled.send(sender=ToolCall, call=call)
    transaction.on_commit(lambda: runtime().executor.cancel(call.pk))
    audit_record(tenant=call.tenant, actor=actor, verb="call.cancelled", target=f"call:{call.pk}",
                 data={"status": call.status})
    return call
