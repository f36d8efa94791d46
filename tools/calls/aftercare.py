"""After-execution steps (`RESULT_STEPS`): what happens to a call's outcome between the
tool and the model.

A tool ran (or an outside system or a person posted its result): the outcome — a result or an error — passes
through the steps in order before the call settles. A step may transform the result, settle the call
differently (`fail`, `succeed`) or, for a call the executor ran, ask for another run after a delay (`retry`,
which ends the pass). What a step did is an event (kind `log`, `{"step": ...}`) on the call's timeline, written
before the call settles; no event carries what a step removed.
"""
import json
import math
import time
from dataclasses import dataclass, field

from django.conf import settings

from common import metrics
from tools.calls.events import call_event_append, call_source
from tools.calls.pipeline import CallContext, Step
from tools.calls.traces import call_span
from tools.catalog.registry import StepChain
from tools.models import EventKind, Tool, ToolCall
from tools.python.decorators import ToolError
from tools.python.results import tool_result
from tools.redaction.rules import Redaction, tenant_rules

TRANSIENT_ERROR_TYPES = frozenset({"Transient", "Unavailable"})


def error_is_transient(exc: ToolError) -> bool:
    return bool(getattr(exc, "transient", False)) or exc.error_type in TRANSIENT_ERROR_TYPES


@dataclass
class Outcome:
    """A call's outcome as the steps see and change it: `result` (a result dict), or `error` ((errorType,
    message)) when the call fails."""

    call: ToolCall
    tool: Tool | None
    result: dict | None = None
    error: tuple[str, str] | None = None
    transient: bool = False  # the error may pass on another run
    executed: bool = True  # run by the executor here; False for a result posted from outside
    attempt: int = 1  # the run that gave this outcome
    deadline: float | None = None  # time.monotonic() at which the call times out
    retry_after: float | None = None
    fields: dict = field(default_factory=dict)  # call fields written when the call settles
    effects: list[dict] = field(default_factory=list)  # event data, in order

    def fail(self, error_type: str, message: str) -> None:
        self.result, self.error, self.transient = None, (error_type, message), False

    def succeed(self, result) -> None:
        self.result, self.error, self.transient = tool_result(result), None, False

    def retry(self, after_s: float) -> None:
        self.retry_after = after_s

    def note(self, step: str, **data) -> None:
        self.effects.append({"step": step, **data})

    def time_left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.monotonic()

    @property
    def cap(self) -> int:
        own = self.tool.max_result_chars if self.tool is not None else None
        return own or settings.TOOLKEEPER_MAX_RESULT_CHARS


class ResultRules(Step):
    """A step of the call chain (before dispatch): the redaction rules that apply to the call, compiled under the
    catalog version the chain has just read, so the executor in this process applies them without reading the
    version again. A call run elsewhere (a Celery worker) reads the rules when its result comes."""

    name = "result_rules"

    def process(self, ctx: CallContext) -> bool:
        exposed = ctx.exposed
        if exposed is not None and exposed.tool is not None and exposed.catalog is not None:
            rules = tenant_rules(ctx.call.tenant_id, version=exposed.catalog.version)
            ctx.call.result_rules = rules.for_tool(ctx.call.tool_name)
        return True


class ResultStep:
    """An after-execution step. `process` changes the outcome in place; `executed_only` steps skip results
    posted from outside (there is nothing to run again)."""

    name = "step"
    executed_only = False

    def process(self, outcome: Outcome) -> None:
        raise NotImplementedError


class Retry(ResultStep):
    """An idempotent tool with `retry_max` runs again after a transient error, waiting `retry_backoff_s`,
    doubled each time — unless the call's timeout comes first."""

    name = "retry"
    executed_only = True

    def process(self, outcome):
        tool = outcome.tool
        if (outcome.error is None or not outcome.transient or tool is None or not tool.idempotent
                or outcome.attempt > tool.retry_max):
            return
        after_s = tool.retry_backoff_s * 2 ** (outcome.attempt - 1)
        error_type, message = outcome.error
        # The message can carry what redaction would remove; this event is written before the Redact step runs.
        text = f"{error_type}: {_redaction(outcome).text(message)}"
        if after_s >= outcome.time_left():
            outcome.note(self.name, attempt=outcome.attempt + 1, skipped="the call's timeout comes first",
                         error=text)
            return
        outcome.note(self.name, attempt=outcome.attempt + 1, after_s=after_s, error=text)
        outcome.retry(after_s)


def _redaction(outcome: Outcome) -> Redaction:
    rules = getattr(outcome.call, "result_rules", None)  # prepared by ResultRules when the call was dispatched
    if rules is None:
        rules = tenant_rules(outcome.call.tenant_id).for_tool(outcome.call.tool_name)
    return Redaction(rules)


class Redact(ResultStep):
    """The tenant's enabled rules whose tool pattern matches: every string of the result (text, structured,
    other content) and the error message. The original is kept (encrypted) only when every rule that matched
    allows it."""

    name = "redact"

    def process(self, outcome):
        redaction = _redaction(outcome)
        if not redaction.rules:
            return
        original = outcome.result if outcome.error is None else {"error": list(outcome.error)}
        if outcome.result is not None:
            result = outcome.result
            content = [{key: value if key == "type" else redaction.value(value) for key, value in block.items()}
                       if isinstance(block, dict) else block for block in result.get("content") or []]
            outcome.result = {**result, "content": content, "structured": redaction.value(result.get("structured"))}
        if outcome.error is not None:
            outcome.error = (outcome.error[0], redaction.text(outcome.error[1]))
        if not redaction.counts:
            return
        kept = all(rule.keep_original for rule in redaction.matched)
        outcome.fields["unredacted_result"] = original if kept else None
        outcome.note(self.name, rules=[{"rule": rule.name, "replacements": redaction.counts[rule.name]}
                                       for rule in redaction.matched],
                     original_kept=kept)


def _size(value) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str))


def _is_text(block: dict) -> bool:
    return block.get("type") == "text" and isinstance(block.get("text"), str)


def truncation_note(total: int, cap: int) -> str:
    return f"[truncated: the result had {total:,} characters; the first {cap:,} are shown]"


class Cap(ResultStep):
    """Text over the tool's cap (or the platform's) is cut with a note; a structured part or a non-text block
    larger than the cap is dropped with a note (half a JSON document is no use to anyone)."""

    name = "cap"

    def process(self, outcome):
        cap = outcome.cap
        if outcome.error is not None and len(outcome.error[1]) > cap:
            total = len(outcome.error[1])
            outcome.error = (outcome.error[0], f"{outcome.error[1][:cap]}\n{truncation_note(total, cap)}")
            outcome.note(self.name, part="error", chars=total, cap=cap)
        result = outcome.result
        if result is None:
            return
        blocks = [b for b in result.get("content") or [] if isinstance(b, dict)]
        total = sum(len(b["text"]) for b in blocks if _is_text(b))
        cut = total > cap
        content, dropped, left = [], 0, cap
        for block in blocks:
            if _is_text(block):
                if cut:
                    if left <= 0:
                        continue
                    block = {**block, "text": block["text"][:left]}
                    left -= len(block["text"])
            elif _size(block) > cap:
                dropped += 1
                continue
            content.append(block)
        notes, effect = [], {}
        if cut:
            notes.append(truncation_note(total, cap))
            effect["chars"] = total
        if dropped:
            notes.append(f"[{dropped} content block(s) over {cap:,} characters left out]")
            effect["blocks_dropped"] = dropped
        structured = result.get("structured")
        if structured is not None and (size := _size(structured)) > cap:
            notes.append(f"[the structured part had {size:,} characters, more than {cap:,}: left out]")
            effect["structured_chars"] = size
            structured = None
        if not notes:
            return
        note = " ".join(notes)
        if cut and content and _is_text(content[-1]):
            content[-1] = {**content[-1], "text": f"{content[-1]['text']}\n{note}"}
        else:
            content.append({"type": "text", "text": note})
        outcome.result = {**result, "content": content, "structured": structured}
        outcome.note(self.name, cap=cap, **effect)


# The steps after a tool ran, registered by tools.apps: Retry 100, Redact 200, Cap 300.
RESULT_STEPS = StepChain("the steps after a tool ran")


def result_steps() -> tuple[ResultStep, ...]:
    return RESULT_STEPS.steps()


def result_steps_run(outcome: Outcome) -> None:
    watch = metrics.stopwatch("after_steps")
    _result_steps(outcome)
    watch.stop_with(call_source, outcome.call)


def _result_steps(outcome: Outcome) -> None:
    for step in result_steps():
        if step.executed_only and not outcome.executed:
            continue
        step.process(outcome)
        if outcome.retry_after is not None:
            return


def effects_record(outcome: Outcome, *, while_status: str) -> bool:
    """Write the steps' effects on the call's timeline while it is still in `while_status`; False when it has
    moved on (a cancel or a timeout settled it), and the rest is not written."""
    effects, outcome.effects = outcome.effects, []
    for data in effects:
        if call_event_append(call=outcome.call, kind=EventKind.LOG, data=data, while_status=while_status) is None:
            return False
    return True


def result_finish(*, call: ToolCall, result: dict) -> tuple[dict, dict]:
    """A result posted from outside (an external system, a reviewer's answer) before it settles the call:
    through the same steps as an executed call's, less retries. Returns the result the model may see and the
    call fields to store with it; a step that fails the call turns the result into an error result."""
    outcome = Outcome(call=call, tool=call.tool, result=result, executed=False)
    with call_span(call, "after_steps"):
        result_steps_run(outcome)
        effects_record(outcome, while_status=call.status)
    if outcome.error is not None:
        error_type, message = outcome.error
        return {"state": "error", "content": [{"type": "text", "text": f"{error_type}: {message}"}],
                "structured": None}, outcome.fields
    return outcome.result, outcome.fields
