"""The governed call pipeline (docs/calls.md): steps registered in `CALL_STEPS` by the apps that own them.

Each step looks at the call and either lets it continue or settles it (failed, denied, waiting).
This module holds the chain and the steps before the executor (normalize, validate, bind, external);
apps add steps through the setting (the permission step comes from `approvals`), and the last step,
dispatch, lives with submission in `tools.calls.submit`, above the runtime whose executor it hands calls to.
An approved call re-enters the chain after the step that held it. `input_refusal` is the one check
of a call's input, for the chain and for a reviewer's edit alike.
"""
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import transaction

from common import metrics
from tools.calls.events import call_failure, call_source, call_transition
from tools.calls.traces import call_span
from tools.catalog.declared import call_exposed
from tools.catalog.registry import StepChain
from tools.catalog.schemas import ToolMisconfigured, bound_overrides, with_bound
from tools.catalog.selectors import DeclaredTool, visible_tool, withheld_from
from tools.catalog.snapshot import ExposedTool
from tools.models import AgentSession, CallStatus, ToolCall, ToolSource

NO_POLICY_DECISION = {"behavior": "allow", "rule": None, "reason": "no permission policy is installed"}


@dataclass
class CallContext:
    call: ToolCall
    session: AgentSession
    exposed: ExposedTool | None = None
    actor: object = None
    pending: dict = field(default_factory=dict)  # field changes written with the next transition
    edited_input: dict | None = None  # a reviewer's edit; `call.input` keeps what the model sent
    declared: object = None  # the tools its request declared (tools.catalog.declared.Declarations), if any
    # A new call's row is not written until the chain settles it (or ends): the row and its first move are
    # then one statement. `record(status=None, passing=(), event_data=None, **fields)` writes it (tools.calls.submit).
    record: Callable | None = None
    confirmed: bool = False  # the session's user accepted the call a confirm rule asked about (tools.calls.questions)

    @property
    def arguments(self) -> dict:
        return self.edited_input if self.edited_input is not None else self.call.input

    def set(self, **fields) -> None:
        for name, value in fields.items():
            setattr(self.call, name, value)
        self.pending.update(fields)

    def transition(self, to_status: str, *, event_data: dict | None = None, passing: tuple[str, ...] = (),
                   **fields) -> bool:
        """Move the call to `to_status`, through `passing` (statuses it passes on the way, each with its
        event), with the changes the steps collected; a new call's row is written with the moves."""
        changes, self.pending = {**self.pending, **fields}, {}
        if self.record is not None:
            record, self.record = self.record, None
            return record(status=to_status, passing=passing, event_data=event_data, **changes)
        for passed in passing:
            if not call_transition(call=self.call, from_statuses=[self.call.status], to_status=passed):
                return False
        return call_transition(call=self.call, from_statuses=[self.call.status], to_status=to_status,
                               event_data=event_data, **changes)

    def flush(self) -> None:
        """Write the changes the steps collected (a new call's row, if nothing has written it yet)."""
        changes, self.pending = self.pending, {}
        if self.record is not None:
            record, self.record = self.record, None
            record(**changes)
        elif changes:
            ToolCall.objects.for_tenant(self.call.tenant_id).filter(pk=self.call.pk).update(**changes)

    def fail(self, error_type: str, message: str, status: str = CallStatus.FAILED) -> bool:
        """Settle the call with this error, with the changes the steps collected; False ends the chain."""
        failure, data = call_failure(self.call, error_type=error_type, message=message)
        self.transition(status, event_data=data, **failure)
        return False

    def ensure_decision(self) -> None:
        """A call that reaches the executor without the permission step was allowed by no policy."""
        if self.call.decision is None:
            self.set(decision=NO_POLICY_DECISION)


class Step:
    """A pipeline step. `process` returns True to pass the call on, False when it settled it."""

    name = "step"

    def process(self, ctx: CallContext) -> bool:
        raise NotImplementedError


def not_available(ctx: CallContext, message: str) -> bool:
    """Settle a call whose tool is not on the session's surface; one withheld for review says so."""
    if ctx.call.declared_tool is None and withheld_from(ctx.session, ctx.call.tool_name):
        return ctx.fail("ToolDefinitionChanged", f"{ctx.call.tool_name} cannot be called now: its MCP server changed "
                        "its definition (or offered it anew), and an operator must review the change first")
    return ctx.fail("ToolNotAvailable", message)


class Normalize(Step):
    name = "normalize"

    def process(self, ctx):
        ctx.exposed = call_exposed(ctx.session, ctx.call, ctx.declared)
        if ctx.exposed is None:
            return not_available(ctx, f"no tool named {ctx.call.tool_name!r} is available in this session")
        if isinstance(ctx.exposed, DeclaredTool):  # no catalog row: the call keeps the declaration instead
            if ctx.call.declared_tool is None:
                ctx.set(declared_tool=ctx.exposed.declaration)
        elif ctx.exposed.tool is not None and ctx.call.tool_id != ctx.exposed.tool.pk:
            ctx.set(tool=ctx.exposed.tool)
        return True


def input_refusal(exposed: ExposedTool, arguments) -> tuple[str, list[str]] | None:
    """Why these arguments may not run as `exposed`: (errorType, problems); None when they may."""
    if not isinstance(arguments, dict):
        return "InvalidInput", ["input must be a JSON object"]
    overridden = bound_overrides(arguments, exposed.bound)
    if overridden:
        return "BoundArgumentOverride", [f"{name}: fixed by the server and cannot be set" for name in overridden]
    try:
        errors = exposed.validator.errors(arguments)
    except ToolMisconfigured as exc:
        return "ToolMisconfigured", [str(exc)]
    return ("InvalidInput", errors) if errors else None


class Validate(Step):
    name = "validate"

    def process(self, ctx):
        refusal = input_refusal(ctx.exposed, ctx.arguments)
        if refusal is not None:
            error_type, problems = refusal
            return ctx.fail(error_type, "; ".join(problems))
        return True


class Bind(Step):
    name = "bind"

    def process(self, ctx):
        ctx.set(effective_input=with_bound(ctx.arguments, ctx.exposed.bound))
        return True


class External(Step):
    name = "external"

    def process(self, ctx):
        tool = ctx.exposed.tool
        if tool is not None and tool.source == ToolSource.EXTERNAL:
            ctx.ensure_decision()
            ctx.transition(CallStatus.AWAITING_EXTERNAL)
            return False
        return True


# The governed chain before the executor. Its owners register their steps from AppConfig.ready: tools its
# own (Normalize 100, Validate 200, Bind 300, ResultRules 600, Dispatch 700), approvals the permission step
# (Permission 400) and the wait for an external result (External 500, which also notifies).
CALL_STEPS = StepChain("the call pipeline")


def pipeline_steps() -> tuple[Step, ...]:
    return CALL_STEPS.steps()


def pipeline_run(ctx: CallContext, *, resume_after: str | None = None, rerun: tuple[str, ...] = ()) -> None:
    """Run the call through the chain; or, resuming, through `rerun` steps and those after `resume_after`."""
    steps = pipeline_steps()
    if resume_after is not None:
        names = [step.name for step in steps]
        cut = names.index(resume_after) + 1
        steps = tuple(step for step in steps[:cut] if step.name in rerun) + steps[cut:]
        if ctx.exposed is None:
            ctx.exposed = call_exposed(ctx.session, ctx.call)
            if ctx.exposed is None:
                not_available(ctx, f"{ctx.call.tool_name!r} is no longer available in this session")
                return
    policy = metrics.stopwatch("policy")  # the steps before dispatch (or until one settles the call)
    with transaction.atomic(savepoint=False), call_span(ctx.call, "policy"):
        for step in steps:
            if step.name == "dispatch":
                policy.stop_with(call_source, ctx.call)
            with call_span(ctx.call, step.name):
                if not step.process(ctx):
                    break
        ctx.flush()
    policy.stop_with(call_source, ctx.call)


def input_problems(*, session: AgentSession, tool_name: str, new_input, call: ToolCall | None = None) -> list[str]:
    """Why an input (a reviewer's edit) would not pass validation for this session; [] when it would. With the
    call, a declared tool's call is checked against the declaration it was made with."""
    exposed = call_exposed(session, call) if call is not None else visible_tool(session, tool_name)
    if exposed is None:
        return [f"{tool_name!r} is no longer available in this session"]
    refusal = input_refusal(exposed, new_input)
    return refusal[1] if refusal is not None else []


def pipeline_resume(*, call: ToolCall, after: str, new_input: dict | None = None, confirmed: bool = False) -> None:
    """Continue a held call after the step that held it; an edited input is validated and bound again. A call its
    user `confirmed` passes the step that held it again, which knows the user said yes."""
    ctx = CallContext(call=call, session=call.session, edited_input=new_input, confirmed=confirmed)
    rerun: tuple[str, ...] = ()
    if new_input is not None:
        rerun = ("normalize", "validate", "bind")
    if confirmed:
        rerun += (after,)
    pipeline_run(ctx, resume_after=after, rerun=rerun)
