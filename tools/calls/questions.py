"""Questions for the session's own user (docs/calls.md#questions-for-the-user): a call waits `awaiting_user` with
the question on it, until its user answers (REST, or their MCP client's elicitation), or the question expires.

Two kinds ask. A `confirm` rule asks before the call runs (the permission step, approvals.pipeline): the user's
acceptance lets the chain go on from that step. A running Python tool asks through its context (`ctx.ask_user`):
the answer goes back to the tool, which runs on. Either way the first answer wins: answering clears the
question's deadline with a conditional UPDATE, so a second answer, or the expiry job, finds nothing to answer.
"""
import json
import time

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from common.errors import Conflict, NotPermitted, ServiceError
from tools.calls.events import call_event_append, call_fail, call_transition
from tools.calls.pipeline import pipeline_resume
from tools.models import CallStatus, ToolCall
from tools.python.decorators import CallCancelled

CONFIRM = "confirm"  # a confirm rule asks before the call runs
TOOL = "tool"  # the running tool asks
ACTIONS = ("accept", "decline", "cancel")
MAX_SHOWN_INPUT_CHARS = 2000  # of the input, in the question's message
MAX_CONTENT_CHARS = 64 * 1024  # of an answer's content, as JSON
POLL_S = 0.2  # how often a tool waiting for its answer looks


def _iso(value) -> str:
    return value.isoformat().replace("+00:00", "Z")


def question_deadline(seconds: float | None = None):
    seconds = settings.TOOLKEEPER_CONFIRM_EXPIRES_S if seconds is None else seconds
    return timezone.now() + timezone.timedelta(seconds=seconds)


def what_it_does(exposed) -> str:
    """A plain sentence of what the tool does, from its description and flags."""
    description = " ".join((exposed.description or "").split())
    first = description.split(". ")[0].rstrip(".")[:300]
    sentence = f"{exposed.name}: {first}." if first else f"It calls {exposed.name}."
    tool = exposed.tool
    if tool is not None and tool.read_only and tool.trusted:
        return sentence + " It only reads."
    if tool is not None and tool.destructive:
        return sentence + " It may change or delete things."
    return sentence


def confirm_schema(tool_name: str) -> dict:
    """An elicitation form (MCP's `requestedSchema`: a flat object of primitives) with one boolean."""
    return {"type": "object", "properties": {"confirm": {
        "type": "boolean", "title": f"Run {tool_name}", "description": "Let the call run with the input shown",
        "default": False}}, "required": ["confirm"]}


def confirm_question(*, call: ToolCall, exposed, agent: str, reason: str, expires_at) -> dict:
    """What a confirm rule asks: the tool, the input it runs with (values the server binds are named, never
    shown), what it does, the form, and until when."""
    bound = set(exposed.bound) if exposed is not None else set()
    shown = {name: value for name, value in (call.effective_input or {}).items() if name not in bound}
    text = json.dumps(shown, ensure_ascii=False, sort_keys=True)
    if len(text) > MAX_SHOWN_INPUT_CHARS:
        text = text[:MAX_SHOWN_INPUT_CHARS] + "…"
    does = what_it_does(exposed) if exposed is not None else f"It calls {call.tool_name}."
    message = f"{agent or 'The agent'} wants to call {call.tool_name}. {does} Input: {text}"
    if bound:
        message += f" (set by the server: {', '.join(sorted(bound))})"
    return {"kind": CONFIRM, "message": message, "tool": call.tool_name, "input": shown, "fixed": sorted(bound),
            "description": does, "reason": reason, "requestedSchema": confirm_schema(call.tool_name),
            "expires_at": _iso(expires_at)}


def public_question(call: ToolCall) -> dict | None:
    """The question as apps see it (REST, MCP), while the call waits for its user."""
    if call.status != CallStatus.AWAITING_USER or not isinstance(call.question, dict):
        return None
    return {key: value for key, value in call.question.items() if key != "answer"}


def questions_of_person(*, tenant, person):
    """The calls of the tenant that wait for this verified person's own answer (their sessions' questions), the
    soonest to expire first."""
    return ToolCall.objects.for_tenant(tenant).filter(
        status=CallStatus.AWAITING_USER, question_expires_at__isnull=False, session__user_verified=True,
        session__person=person).select_related("session").order_by("question_expires_at")


def is_persons_question(call: ToolCall, person) -> bool:
    """Whether the call's question is this verified person's to answer."""
    return bool(call.session.user_verified and call.session.person_id and call.session.person_id == person.pk)


def form_content(question: dict, fields) -> dict:
    """An answer's content from a web form's fields (`fields.get(name)`), by the question's requestedSchema: the
    confirm box ticked for a confirm, each primitive field of a tool's form typed as its schema says; a value
    that does not fit its type is a 400 naming the field."""
    if question.get("kind") != TOOL:
        return {"confirm": True}
    content, problems = {}, {}
    for name, field in ((question.get("requestedSchema") or {}).get("properties") or {}).items():
        kind = field.get("type") if isinstance(field, dict) else None
        raw = fields.get(name)
        if kind == "boolean":
            content[name] = raw in ("on", "true", "1")
            continue
        if raw in (None, ""):
            continue
        try:
            content[name] = int(raw) if kind == "integer" else float(raw) if kind == "number" else str(raw)
        except ValueError:
            problems[name] = [f"a {kind}"]
    if problems:
        raise ServiceError(problems)
    return content


def _audit(call: ToolCall, verb: str, actor=None, **data) -> None:
    kind = (call.question or {}).get("kind", CONFIRM)
    audit_record(tenant=call.session.tenant, actor=actor, verb=f"confirmation.{verb}", target=f"call:{call.pk}",
                 data={"kind": kind, "tool": call.tool_name, **data})


def confirm_ask(ctx, *, reason: str, seconds: float | None = None) -> bool:
    """The permission step's confirm: the new (or resumed) call waits for its user. False ends the chain."""
    expires_at = question_deadline(seconds)
    question = confirm_question(call=ctx.call, exposed=ctx.exposed, agent=ctx.session.agent, reason=reason,
                                expires_at=expires_at)
    if not ctx.transition(CallStatus.AWAITING_USER, question=question, question_expires_at=expires_at,
                          event_data={"question": question["message"], "expires_at": question["expires_at"]}):
        return False
    _audit(ctx.call, "asked", expires_at=question["expires_at"])
    return False


def answer_permitted(*, session, api_key=None, user=None) -> None:
    """Who may answer for the session's user. A verified user (docs/identity.md) answers for themselves: over
    REST with their console login, over /mcp/ through their own client's session; an app's API key (which may
    name any user) answers only for a user it named. 403 otherwise."""
    if session.user_verified:
        acting_for = getattr(api_key, "acting_for", None) if api_key is not None else user
        if acting_for is None or session.person_id is None or getattr(acting_for, "pk", None) != session.person_id:
            raise NotPermitted("this session's user is a verified person: only they answer its questions, from "
                               "their own MCP client or their console login")
        return
    if api_key is None:
        raise NotPermitted("this session's user is named by its app: the app answers its questions")


def answer_check(action, content) -> dict | None:
    """The answer's content as the call keeps it; a 400 for a bad shape."""
    if action not in ACTIONS:
        raise ServiceError({"action": ["one of accept, decline, cancel"]})
    if content is None:
        return None
    if not isinstance(content, dict):
        raise ServiceError({"content": ["an object of the form's fields"]})
    if len(json.dumps(content)) > MAX_CONTENT_CHARS:
        raise ServiceError({"content": [f"at most {MAX_CONTENT_CHARS} characters as JSON"]})
    return content


def _claim(call: ToolCall) -> bool:
    """Take the question for this answer: only one answer (or the expiry) ever does."""
    return bool(ToolCall.objects.for_tenant(call.tenant_id).filter(
        pk=call.pk, status=CallStatus.AWAITING_USER, question_expires_at__isnull=False,
    ).update(question_expires_at=None))


@transaction.atomic
def call_answer(*, call: ToolCall, action: str, content=None, actor=None, responder: str = "") -> ToolCall:
    """The user's answer to the call's question: accept lets it go on, decline rejects it (`UserDeclined`),
    cancel cancels it (`UserCancelled`); a tool's question gets the answer whatever it is. 409 unless the
    call waits for its user."""
    content = answer_check(action, content)
    call.refresh_from_db(fields=["status", "question", "question_expires_at", "event_seq"])
    if call.status != CallStatus.AWAITING_USER or not _claim(call):
        raise Conflict(f"the call is {call.status}, not waiting for its user's answer")
    question = call.question or {}
    responder = responder or str(getattr(actor, "username", actor) or "")
    if question.get("kind") == TOOL:
        answer = {"action": action, "content": content if action == "accept" else None}
        call_transition(call=call, from_statuses=[CallStatus.AWAITING_USER], to_status=CallStatus.RUNNING,
                        question={**question, "answer": answer},
                        event_data={"answer": action, "responder": responder})
        _audit(call, action, actor)
        return call
    if action == "accept" and isinstance(content, dict) and content.get("confirm") is False:
        action = "decline"  # the form's own box left unticked
    if action == "accept":
        call_event_append(call=call, kind="log", data={"text": "the user confirmed the call", "answer": "accept",
                                                        "responder": responder})
        _audit(call, "accept", actor)
        pipeline_resume(call=call, after="permission", confirmed=True)
        return call
    if action == "decline":
        call_fail(call=call, error_type="UserDeclined", message="the user declined this call",
                  status=CallStatus.REJECTED, from_statuses=[CallStatus.AWAITING_USER],
                  event_data={"responder": responder})
    else:
        call_fail(call=call, error_type="UserCancelled", message="the user cancelled this call",
                  status=CallStatus.CANCELLED, from_statuses=[CallStatus.AWAITING_USER],
                  event_data={"responder": responder})
    _audit(call, action, actor)
    return call


def question_expire(call: ToolCall) -> bool:
    """A question past its deadline: a confirm's call expires (`ConfirmationExpired`); a tool hears `cancel`."""
    with transaction.atomic():
        if not _claim(call):
            return False
        question = call.question or {}
        if question.get("kind") == TOOL:
            call_transition(call=call, from_statuses=[CallStatus.AWAITING_USER], to_status=CallStatus.RUNNING,
                            question={**question, "answer": {"action": "cancel", "content": None}},
                            event_data={"answer": "cancel", "reason": "no answer before the deadline"})
        else:
            call_fail(call=call, error_type="ConfirmationExpired",
                      message="the user did not answer before the question expired", status=CallStatus.EXPIRED,
                      from_statuses=[CallStatus.AWAITING_USER])
        _audit(call, "expired")
    return True


def questions_expire_due(*, now=None, batch: int = 500) -> int:
    """The periodic job's part: every question past its deadline."""
    now = now or timezone.now()
    due = ToolCall.all_tenants.filter(status=CallStatus.AWAITING_USER, question_expires_at__lte=now).select_related(
        "session__tenant").order_by("question_expires_at")[:batch]
    return sum(question_expire(call) for call in due)


def tool_ask(*, call: ToolCall, message: str, requested_schema: dict | None, cancelled, seconds: float | None = None
             ) -> dict:
    """A running tool asks its session's user (`ctx.ask_user`) and waits, bounded, for the answer:
    `{"action": "accept"|"decline"|"cancel", "content": {...}|None}`. The call is `awaiting_user` meanwhile."""
    schema = requested_schema if requested_schema is not None else {"type": "object", "properties": {}}
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise ValueError("ask_user: requested_schema must be an object schema")
    expires_at = question_deadline(seconds)
    question = {"kind": TOOL, "message": str(message)[:4000], "tool": call.tool_name, "requestedSchema": schema,
                "expires_at": _iso(expires_at)}
    with transaction.atomic():
        if not call_transition(call=call, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.AWAITING_USER,
                               question=question, question_expires_at=expires_at,
                               event_data={"question": question["message"], "expires_at": question["expires_at"]}):
            raise CallCancelled("the call was cancelled")
        _audit(call, "asked", expires_at=question["expires_at"])
    deadline = time.monotonic() + max(0.0, (expires_at - timezone.now()).total_seconds())
    rows = ToolCall.objects.for_tenant(call.tenant_id).filter(pk=call.pk)
    while True:
        if cancelled.wait(POLL_S):
            raise CallCancelled("the call was cancelled")
        status, asked = rows.values_list("status", "question").first() or (None, None)
        if status == CallStatus.RUNNING:
            call.status, call.question = status, None
            rows.filter(status=CallStatus.RUNNING).update(question=None)
            return (asked or {}).get("answer") or {"action": "cancel", "content": None}
        if status != CallStatus.AWAITING_USER:
            raise CallCancelled("the call was settled while it waited for its user")
        if time.monotonic() >= deadline:
            question_expire(call)
