"""Writes for rules, queues and approval requests; the reviewer's decisions."""
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from approvals.engine import Decision
from approvals.grants import MAX_DURATION, MIN_DURATION, PATTERN_DEFAULT_DURATION, SCOPES, matches_input
from approvals.matching import is_arg_spec, normalize_space
from approvals.models import (
    ApprovalRequest,
    Grant,
    GrantScope,
    PermissionRule,
    PolicyVersion,
    Queue,
    RequestKind,
    RequestStatus,
    Vote,
    VoteDecision,
)
from approvals.notifications import notify_request
from approvals.selectors import approvals_of, approved_edit, evaluate, input_digest, request_rows
from audit.services import audit_record
from common import metrics
from common.errors import Conflict, NotPermitted, ServiceError
from realtime.broadcast import publish_on_commit
from realtime.groups import inbox_group
from tenancy.models import REVIEW_ROLES, Membership
from tenancy.versions import version_bump
from tools.calls.aftercare import result_finish
from tools.calls.events import call_fail, call_source, call_transition
from tools.calls.pipeline import input_problems, pipeline_resume
from tools.calls.questions import questions_expire_due
from tools.catalog.declared import call_exposed
from tools.catalog.schemas import with_bound
from tools.models import CallStatus, ToolCall, ToolSource
from tools.python.results import tool_result

PERMISSION_STEP = "permission"
DECIDED = frozenset({RequestStatus.APPROVED, RequestStatus.REJECTED, RequestStatus.RESPONDED})  # a reviewer's word
EXPIRE_BATCH = 500  # requests (and external calls) the periodic job settles per pass, most overdue first
RULE_FIELDS = ("behavior", "tool_pattern", "arg_match", "agents", "users", "user_verified", "queue", "priority",
               "enabled", "note")


# --- rules -------------------------------------------------------------------------------------

def policy_bump(*, tenant) -> None:
    """Invalidate every process's compiled rules for this tenant (in the caller's transaction)."""
    version_bump(PolicyVersion, tenant.pk)


def _check_rule(tenant, values: dict) -> None:
    errors = {}
    arg_match = values.get("arg_match") or {}
    if not isinstance(arg_match, dict) or not all(is_arg_spec(v) for v in arg_match.values()):
        errors["arg_match"] = ['an object of argument name → glob, → list of globs, → {"equals": exact value} '
                               'or → {"absent": true}']
    for name in ("agents", "users"):
        value = values.get(name) or []
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            errors[name] = ["a list of names"]
    if values.get("user_verified") not in (None, True, False):
        errors["user_verified"] = ["true, false or null"]
    if not str(values.get("tool_pattern") or "").strip():
        errors["tool_pattern"] = ["name a tool, or a pattern such as mcp__github__*"]
    queue = values.get("queue")
    if queue is not None and queue.tenant_id != tenant.pk:
        errors["queue"] = ["no such queue"]
    if errors:
        raise ServiceError(errors)


@transaction.atomic
def rule_create(*, tenant, actor=None, **values) -> PermissionRule:
    _check_rule(tenant, values)
    user = actor if getattr(actor, "_meta", None) is not None else None
    rule = PermissionRule.objects.create(tenant=tenant, created_by=user, **values)
    policy_bump(tenant=tenant)
    audit_record(tenant=tenant, actor=actor, verb="rule.created", target=f"rule:{rule.pk}",
                 data={"behavior": rule.behavior, "tool_pattern": rule.tool_pattern})
    return rule


@transaction.atomic
def rule_update(*, rule: PermissionRule, actor=None, **changes) -> PermissionRule:
    values = {name: getattr(rule, name) for name in RULE_FIELDS} | changes
    _check_rule(rule.tenant, values)
    for key, value in changes.items():
        setattr(rule, key, value)
    rule.save()
    policy_bump(tenant=rule.tenant)
    audit_record(tenant=rule.tenant, actor=actor, verb="rule.updated", target=f"rule:{rule.pk}",
                 data={k: v for k, v in changes.items() if k != "queue"})
    return rule


@transaction.atomic
def rule_delete(*, rule: PermissionRule, actor=None) -> None:
    audit_record(tenant=rule.tenant, actor=actor, verb="rule.deleted", target=f"rule:{rule.pk}")
    tenant = rule.tenant
    rule.delete()
    policy_bump(tenant=tenant)


# --- queues ------------------------------------------------------------------------------------

def default_queue(tenant) -> Queue:
    queue = Queue.objects.for_tenant(tenant).filter(is_default=True).first()
    if queue is None:
        try:
            with transaction.atomic():
                queue = Queue.objects.create(tenant=tenant, name="default", is_default=True,
                                             description="Requests no rule routes elsewhere.")
        except IntegrityError:
            queue = Queue.objects.for_tenant(tenant).get(is_default=True)
    return queue


@transaction.atomic
def queue_save(*, tenant, queue: Queue | None = None, actor=None, reviewers=None, escalation_reviewers=None,
               **values) -> Queue:
    if values.get("required_approvals", 1) < 1:
        raise ServiceError({"required_approvals": ["at least one"]})
    for group in (reviewers, escalation_reviewers):
        members = set(Membership.objects.filter(tenant=tenant, user__in=group or []).values_list("user_id", flat=True))
        if group and any(user.pk not in members for user in group):
            raise ServiceError({"reviewers": ["reviewers must be members of the tenant"]})
    _check_quorum_reachable(tenant=tenant, queue=queue, reviewers=reviewers,
                            escalation_reviewers=escalation_reviewers, values=values)
    name = values.get("name", queue.name if queue else "")
    clash = Queue.objects.for_tenant(tenant).filter(name=name)
    if queue is not None:
        clash = clash.exclude(pk=queue.pk)
    if clash.exists():
        raise ServiceError({"name": [f"a queue named {name!r} exists"]})
    if values.get("is_default"):
        Queue.objects.for_tenant(tenant).filter(is_default=True).exclude(pk=getattr(queue, "pk", None)).update(
            is_default=False)
    if queue is None:
        queue = Queue.objects.create(tenant=tenant, **values)
        verb = "queue.created"
    else:
        for key, value in values.items():
            setattr(queue, key, value)
        queue.save()
        verb = "queue.updated"
    if reviewers is not None:
        queue.reviewers.set(reviewers)
    if escalation_reviewers is not None:
        queue.escalation_reviewers.set(escalation_reviewers)
    audit_record(tenant=tenant, actor=actor, verb=verb, target=f"queue:{queue.name}",
                 data={k: str(v) for k, v in values.items()})
    return queue


def _check_quorum_reachable(*, tenant, queue, reviewers, escalation_reviewers, values) -> None:
    """A queue must have the people its quorum needs, or its requests could never be approved: the members
    who review among those it names (all of them when it names none; escalation reviewers when it escalates),
    one more with four-eyes, since the session's own user may be one of them."""
    def current(field, default):
        return values.get(field, getattr(queue, field) if queue is not None else default)

    if reviewers is None:
        reviewers = list(queue.reviewers.all()) if queue is not None else []
    if escalation_reviewers is None:
        escalation_reviewers = list(queue.escalation_reviewers.all()) if queue is not None else []
    voters = Membership.objects.filter(tenant=tenant, role__in=REVIEW_ROLES)
    if reviewers:
        named = {user.pk for user in reviewers}
        if current("escalate_after", None) is not None:
            named |= {user.pk for user in escalation_reviewers}
        voters = voters.filter(user_id__in=named)
    required, four_eyes = current("required_approvals", 1), current("four_eyes", False)
    needed = required + (1 if four_eyes else 0)
    eligible = voters.count()
    if eligible < needed:
        asked = f"{required} approval{'s' if required > 1 else ''}"
        if four_eyes:
            asked += " with four-eyes (which keeps out the session's own user)"
        whom = "of the reviewers it names" if reviewers else "in the tenant"
        raise ServiceError({"required_approvals": [
            f"{asked} need{'s' if required == 1 else ''} {needed} members who review, and only {eligible} {whom} can: "
            "name more reviewers or ask for fewer approvals"]})


def queue_delete(*, queue: Queue, actor=None) -> None:
    if queue.is_default:
        raise ServiceError({"is_default": ["make another queue the default first"]})
    audit_record(tenant=queue.tenant, actor=actor, verb="queue.deleted", target=f"queue:{queue.name}")
    queue.delete()


# --- requests ----------------------------------------------------------------------------------

def request_open(*, call: ToolCall, session, decision) -> ApprovalRequest:
    queue = None
    if decision.queue is not None:
        queue = Queue.objects.for_tenant(call.tenant_id).filter(pk=decision.queue).first()
    queue = queue or default_queue(session.tenant)
    now = timezone.now()
    request = ApprovalRequest.objects.create(
        tenant_id=call.tenant_id, call=call, queue=queue, kind=RequestKind.APPROVAL, rule_id=decision.rule,
        reason=decision.reason, agent=session.agent, tool_name=call.tool_name,
        expires_at=now + queue.expires_after if queue.expires_after else None,
        escalate_at=now + queue.escalate_after if queue.escalate_after else None,
    )
    audit_record(tenant=session.tenant, verb="approval.opened", target=f"call:{call.pk}",
                 data={"queue": queue.name, "rule": decision.rule, "reason": decision.reason})
    _announce(request, "opened")
    return request


def _announce(request: ApprovalRequest, change: str) -> None:
    """Tell open inboxes (after commit), and the queue's notification channels, that a request appeared or was
    settled."""
    notify_request(request, change)
    publish_on_commit([inbox_group(request.tenant_id)], {
        "type": "inbox.event", "change": change, "request": request.pk, "status": request.status,
        "tool": request.tool_name, "agent": request.agent, "queue": request.queue.name if request.queue else None,
        "call": str(request.call_id),
    })


def _is_person(reviewer) -> bool:
    return getattr(reviewer, "_meta", None) is not None


def reviewer_may_decide(*, request: ApprovalRequest, user) -> bool:
    """Members who review, limited to the queue's reviewers when it names them. Escalation only adds
    its reviewers to a named set: a queue that names none stays open to every member who reviews.

    An admin-scoped API key decides for automation; it may do so only in queues that name no reviewers.
    """
    queue = request.queue
    allowed = set(queue.reviewers.values_list("pk", flat=True)) if queue else set()
    if allowed and request.escalated_at is not None:
        allowed |= set(queue.escalation_reviewers.values_list("pk", flat=True))
    if not _is_person(user):
        return not allowed
    membership = Membership.objects.filter(tenant_id=request.tenant_id, user=user).first()
    if membership is None or not membership.can_review:
        return False
    return not allowed or user.pk in allowed


def _same_person(reviewer, session_user: str) -> bool:
    """Four-eyes: the session's user names the reviewer, by username or e-mail, whatever the case or spaces.

    An API key is never the session's user: the user an app names is a person, and a key is not one, even if
    the name reads like the key's label (docs/notes/governance.md, Governance)."""
    if not _is_person(reviewer):
        return False
    claimed = (session_user or "").strip().lower()
    names = {(getattr(reviewer, field, "") or "").lower() for field in ("username", "email")}
    return bool(claimed) and claimed in names


def decide_refusals(*, requests, user) -> dict[int, str]:
    """Why `user`, a member who reviews, cannot decide each of these pending requests ({pk: why}; a request
    they can decide is absent), so that a page hides the buttons instead of refusing after the click.

    The same checks as `request_decide`, made for a whole list page in three queries whatever its length: the
    requests come as `selectors.request_rows` gives them (queue, call and session loaded, votes prefetched).
    """
    queue_ids = {r.queue_id for r in requests if r.queue_id}
    named = Queue.reviewers.through.objects.filter(queue_id__in=queue_ids)
    named_any = set(named.values_list("queue_id", flat=True))
    named_me = escalation_me = set()  # a key is named in no queue: it decides only where none are named
    if _is_person(user):
        named_me = set(named.filter(user_id=user.pk).values_list("queue_id", flat=True))
        escalation_me = set(Queue.escalation_reviewers.through.objects.filter(
            queue_id__in=queue_ids, user_id=user.pk).values_list("queue_id", flat=True))
    refusals = {}
    for request in requests:
        queue = request.queue
        listed = request.queue_id in named_me or (request.escalated_at is not None
                                                   and request.queue_id in escalation_me)
        if request.queue_id in named_any and not listed:
            refusals[request.pk] = "you are not a reviewer of this request's queue"
        elif queue is not None and queue.four_eyes and _same_person(user, request.call.session.user):
            refusals[request.pk] = "four-eyes: you cannot decide a call made in your own session"
        elif _vote_stands(request, user):
            refusals[request.pk] = "you have voted; it waits for the other reviewers"
    return refusals


def _vote_stands(request: ApprovalRequest, user) -> bool:
    """Whether the user's vote still counts: a later edit by someone else asks everyone again (`_vote_record`)."""
    votes = list(request.votes.all())
    mine = [i for i, vote in enumerate(votes) if _cast_by(vote, user)]
    return bool(mine) and not any(vote.decision == VoteDecision.EDIT for vote in votes[mine[-1] + 1:])


def _cast_by(vote: Vote, reviewer) -> bool:
    """A person's vote is theirs by user id; a key's (no user) by its label, as `_vote_record` finds it."""
    if _is_person(reviewer):
        return vote.reviewer_id == reviewer.pk
    return vote.reviewer_id is None and vote.reviewer_label == str(reviewer.username)


def _finish(request: ApprovalRequest, status: str) -> bool:
    moved = ApprovalRequest.objects.for_tenant(request.tenant_id).filter(
        pk=request.pk, status=RequestStatus.PENDING).update(status=status, decided_at=timezone.now())
    if moved:
        request.status = status
        _announce(request, status)
        if metrics.ENABLED and status in DECIDED:
            metrics.step_observe("approval_wait", call_source(request.call),
                                 (timezone.now() - request.opened_at).total_seconds())
    return bool(moved)


def request_decide(*, request: ApprovalRequest, reviewer, decision: str, new_input=None,
                   message: str = "", grant: dict | None = None) -> ApprovalRequest:
    """One reviewer's vote. Exactly one concurrent decision settles a request; the rest get 409.

    An edit is decided by the rules again, as the model's call would be (`_edit_decision`). Approvals count
    only for the input that will run: after an edit, earlier approvals of another input no longer count, and
    their reviewers may vote again. `grant` (approve and edit): also let such calls through from now on
    (`_grant_checked`), created when the vote approves the call.
    """
    if decision not in VoteDecision.values:
        raise ServiceError({"decision": [f"one of {', '.join(VoteDecision.values)}"]})
    if request.status == RequestStatus.PENDING and request.expires_at and request.expires_at <= timezone.now():
        with transaction.atomic():
            request_expire(request=request)
        raise Conflict("the request has expired")
    with transaction.atomic():
        request = (ApprovalRequest.objects.for_tenant(request.tenant_id).select_for_update(of=("self",))
                   .select_related("queue", "call", "call__session", "call__session__tenant").get(pk=request.pk))
        call = request.call
        if request.status != RequestStatus.PENDING:
            raise Conflict(f"the request is already {request.status}")
        if call.status == CallStatus.AWAITING_APPROVAL:
            _decide_locked(request=request, call=call, reviewer=reviewer, decision=decision, new_input=new_input,
                           message=message, grant=grant)
            return request
        # The call moved on without a decision (cancelled): the request is moot and leaves the inbox. The 409
        # comes after the commit, which raising it here would undo.
        _finish(request, RequestStatus.CANCELLED)
    raise Conflict(f"the call is already {call.status}")


def _decide_locked(*, request: ApprovalRequest, call: ToolCall, reviewer, decision: str, new_input,
                   message: str, grant: dict | None = None) -> None:
    """`request_decide` with the request locked, pending, and its call waiting for it."""
    if not reviewer_may_decide(request=request, user=reviewer):
        raise NotPermitted("you are not a reviewer of this request's queue")
    if request.queue and request.queue.four_eyes and _same_person(reviewer, call.session.user):
        raise NotPermitted("four-eyes: you cannot decide a call made in your own session")
    if (request.queue and request.queue.verified_requesters and not call.session.user_verified
            and decision in (VoteDecision.APPROVE, VoteDecision.EDIT)):
        raise NotPermitted("this queue approves only calls of a verified user; this call's user is named by its app, "
                           "not verified: reject it, or have the person call through a client they signed in with")
    if decision == VoteDecision.EDIT:
        problems = input_problems(session=call.session, tool_name=call.tool_name, new_input=new_input, call=call)
        if problems:
            raise ServiceError({"input": problems})
    if decision == VoteDecision.RESPOND and not (message or new_input is not None):
        raise ServiceError({"message": ["respond with a message or a structured answer"]})
    approving = decision in (VoteDecision.APPROVE, VoteDecision.EDIT)
    # What this vote approves: the edit it makes, or the edit that stands (None: the model's input).
    approved_input = new_input if decision == VoteDecision.EDIT else approved_edit(request)
    policy = None
    if approving and approved_input is not None:
        policy = _edit_decision(request=request, edited_input=approved_input)
    granting = None
    if grant is not None:
        granting = _grant_checked(request=request, decision=decision, spec=grant,
                                  approved_input=call.input if approved_input is None else approved_input)
    vote_input = new_input if decision == VoteDecision.RESPOND else None
    _vote_record(request=request, reviewer=reviewer, decision=decision, message=message,
                 vote_input=approved_input if approving else vote_input)
    audit_record(tenant=call.session.tenant, actor=reviewer, verb=f"approval.{decision}", target=f"call:{call.pk}",
                 data={"message": message, "edited": decision == VoteDecision.EDIT,
                       **({"edited_input_decision": policy.as_dict()} if policy is not None else {})})
    if approving:
        approvals = approvals_of(request, approved_input)
        required = request.queue.required_approvals if request.queue else 1
        if len(approvals) < required:
            return
        if not _finish(request, RequestStatus.APPROVED):
            raise Conflict("another decision settled the request first")
        if granting is not None:
            _grant_create(request=request, reviewer=reviewer, values=granting)
        if request.kind == RequestKind.APPROVAL:
            if policy is not None:
                _record_edit_decision(call, policy, approvals)
            pipeline_resume(call=call, after=PERMISSION_STEP, new_input=approved_input)
    elif decision == VoteDecision.REJECT:
        if not _finish(request, RequestStatus.REJECTED):
            raise Conflict("another decision settled the request first")
        call_fail(call=call, error_type="Rejected", message=message or "a reviewer rejected this call",
                  status=CallStatus.REJECTED, from_statuses=[call.status],
                  event_data={"reviewer": str(reviewer.username)})
    else:
        if not _finish(request, RequestStatus.RESPONDED):
            raise Conflict("another decision settled the request first")
        call_respond(call=call, actor=reviewer, message=message, structured=new_input)


BULK_MAX = 100  # requests one bulk decision may name
BULK_DECISIONS = (VoteDecision.APPROVE, VoteDecision.REJECT)
NOT_FOUND = "not found"


@dataclass(frozen=True)
class Skipped:
    """A request a bulk decision left alone, and why. `request` is None when the id names none of the tenant's."""

    id: object
    reason: str
    request: ApprovalRequest | None = None


@dataclass
class BulkOutcome:
    decided: list = field(default_factory=list)  # the requests voted on, as `request_decide` left them
    skipped: list = field(default_factory=list)  # [Skipped]


def _request_id(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 < value < 2 ** 63 else None  # a primary key fits in 64 bits: anything else names none
    text = str(value).strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 and int(text) > 0 else None


def requests_decide_bulk(*, tenant, request_ids, reviewer, decision: str, message: str = "",
                         seen: dict | None = None) -> BulkOutcome:
    """Approve or reject many requests, each decided on its own by `request_decide` (its own transaction, vote,
    audit entry and timeline event): one refused or failing never undoes another.

    A request is skipped, with the reason, when it is not the tenant's (or no approval request: "not found"), is
    no longer pending, or `decide_refusals` says the reviewer cannot decide it (another queue's reviewers,
    four-eyes, a vote that stands); and, for an approval with `seen` (request id → `input_digest` of the input the
    reviewer was shown), when the input approving would run is not the one shown. What `request_decide` refuses
    is skipped with its refusal.
    """
    if decision not in BULK_DECISIONS:
        raise ServiceError({"decision": ["approve or reject"]})
    wanted = list(dict.fromkeys(_request_id(value) or str(value)[:40] for value in request_ids))
    if not wanted:
        raise ServiceError({"ids": ["select at least one request"]})
    if len(wanted) > BULK_MAX:
        raise ServiceError({"ids": [f"at most {BULK_MAX} requests at a time ({len(wanted)} were selected): "
                                    "narrow the list with its filters"]})
    ids = [value for value in wanted if isinstance(value, int)]
    found = {row.pk: row for row in request_rows(
        ApprovalRequest.objects.for_tenant(tenant).filter(pk__in=ids, kind=RequestKind.APPROVAL), tenant=tenant)}
    refusals = decide_refusals(requests=[row for row in found.values() if row.status == RequestStatus.PENDING],
                               user=reviewer)
    outcome = BulkOutcome()
    for value in wanted:
        request = found.get(value)
        reason = _bulk_refusal(request, refusals, decision=decision, seen=seen)
        if reason:
            outcome.skipped.append(Skipped(id=value, reason=reason, request=request))
            continue
        try:
            decided = request_decide(request=request, reviewer=reviewer, decision=decision, message=message)
        except ServiceError as exc:
            outcome.skipped.append(Skipped(id=value, reason=exc.message, request=request))
        else:
            outcome.decided.append(decided)
    return outcome


def _bulk_refusal(request, refusals: dict, *, decision: str, seen: dict | None) -> str:
    if request is None:
        return NOT_FOUND
    if request.status != RequestStatus.PENDING:
        return f"already {request.status}"
    if request.pk in refusals:
        return refusals[request.pk]
    if decision == VoteDecision.APPROVE and seen is not None:
        shown = seen.get(request.pk)
        if not shown:
            return "the list did not show all of its input: open it to read it and decide"
        runs = approved_edit(request)
        if input_digest(request.call.input if runs is None else runs) != shown:
            return "its input changed after the list was shown: open it to read it and decide"
    return ""


def _edit_decision(*, request: ApprovalRequest, edited_input: dict) -> Decision:
    """How the rules decide a reviewer's edit: the engine that decides calls, on the edited input after binding.

    A deny refuses the edit. So does an ask that routes to another queue than this request's: that queue's
    reviewers, not this one's, approve such input. So does a confirm, unless the edit is the call's own input:
    the session's user has not confirmed any other. Each time a 400 names the rule, and nothing is recorded.
    """
    call = request.call
    session = call.session
    exposed = call_exposed(session, call)
    effective_input = with_bound(edited_input, exposed.bound if exposed is not None else {})
    decided = evaluate(tenant=session.tenant, tool_name=call.tool_name, effective_input=effective_input,
                       agent=session.agent, user=session.user, tool=exposed.tool if exposed is not None else None,
                       user_verified=session.user_verified)
    if decided.behavior == "deny":
        raise ServiceError({"input": [f"the rules refuse this input: {decided.reason}"]})
    if decided.behavior == "confirm" and effective_input != call.effective_input:
        # Only the session's user confirms what a confirm rule sends them: they confirmed the call's input, if any.
        raise ServiceError({"input": [
            f"this input needs the confirmation of the session's user ({decided.reason}), who has not confirmed it: "
            f"reject the call, or approve the input as it is"]})
    if decided.behavior == "ask":
        queue = None
        if decided.queue is not None:
            queue = Queue.objects.for_tenant(request.tenant_id).filter(pk=decided.queue).first()
        queue = queue or default_queue(session.tenant)
        if queue.pk != request.queue_id:
            here = request.queue.name if request.queue else "none"
            raise ServiceError({"input": [
                f"this input needs the approval of queue {queue.name!r} ({decided.reason}), and this request is "
                f"in queue {here!r}: reject the call, or edit it into input this queue may approve"]})
    return decided


def _vote_record(*, request: ApprovalRequest, reviewer, decision: str, message: str, vote_input) -> Vote:
    """Record a vote. A reviewer whose earlier vote approved an input that an edit has since replaced votes
    again (the earlier vote no longer counts); any other second vote is a 409."""
    label = str(reviewer.username)
    votes = Vote.objects.for_tenant(request.tenant_id).filter(request=request)
    earlier = votes.filter(reviewer_label=label).first()
    if earlier is not None and earlier not in approvals_of(request, approved_edit(request)):
        earlier.delete()
    try:
        with transaction.atomic():
            return Vote.objects.create(tenant_id=request.tenant_id, request=request,
                                       reviewer=reviewer if _is_person(reviewer) else None, reviewer_label=label,
                                       decision=decision, input=vote_input, message=message)
    except IntegrityError as exc:
        raise Conflict("you have already voted on this request") from exc


def _record_edit_decision(call: ToolCall, decided: Decision, approvals: list[Vote]) -> None:
    """The call runs an edited input: its decision says how the rules decided that input and who approved it."""
    reviewers = ", ".join(vote.reviewer_label for vote in approvals)
    call.decision = {"behavior": "ask", "rule": decided.rule,
                     "reason": f"a reviewer's edit, approved by {reviewers}; the edited input: {decided.reason}"}
    ToolCall.objects.for_tenant(call.tenant_id).filter(pk=call.pk).update(decision=call.decision)


def call_respond(*, call: ToolCall, actor, message: str = "", structured=None, state: str = "success",
                 content: list | None = None) -> ToolCall:
    """A human's (or an external system's) answer becomes the call's result."""
    result = tool_result({"state": state, "content": content if content is not None else (
        [{"type": "text", "text": message}] if message else []), "structured": structured})
    waiting = [CallStatus.AWAITING_APPROVAL, CallStatus.AWAITING_EXTERNAL]
    responder = {"responder": str(actor)}  # a user and a key principal both show as their username
    result, kept = result_finish(call=call, result=result)  # redacted and capped like an executed call's result
    if state == "success" and result["state"] == "success":
        moved = call_transition(call=call, from_statuses=waiting, to_status=CallStatus.SUCCEEDED, result=result,
                                error=None, event_data=responder, **kept)
    else:
        text = " ".join(part.get("text", "") for part in result["content"] if isinstance(part, dict)) or "failed"
        moved = call_fail(call=call, error_type="ExternalError", message=text, from_statuses=waiting, result=result,
                          event_data=responder, **kept)
    if not moved:
        raise Conflict(f"the call is {call.status}, not waiting for a result")
    audit_record(tenant=call.session.tenant, actor=actor, verb="call.responded", target=f"call:{call.pk}",
                 data={"state": state})
    return call


def external_result_post(*, call: ToolCall, actor, state: str, content: list, structured=None) -> ToolCall:
    if call.status != CallStatus.AWAITING_EXTERNAL:
        raise Conflict(f"the call is {call.status}, not awaiting an external result")
    with transaction.atomic():
        call_respond(call=call, actor=actor, state=state, content=content, structured=structured)
    if metrics.ENABLED:  # the wait began as the call was received: the chain before it takes no time worth telling
        metrics.step_observe("external_wait", call_source(call), (timezone.now() - call.created_at).total_seconds())
    return call


def request_cancel_for_call(sender, call, **kwargs) -> None:
    """A call cancelled while it waited for a reviewer takes its request out of the inbox."""
    request = ApprovalRequest.objects.for_tenant(call.tenant_id).filter(call=call, status=RequestStatus.PENDING).first()
    if request is not None:
        _finish(request, RequestStatus.CANCELLED)


def request_expire(*, request: ApprovalRequest) -> bool:
    if not _finish(request, RequestStatus.EXPIRED):
        return False
    call = request.call
    call_fail(call=call, error_type="ApprovalExpired", message="no reviewer decided before the request expired",
              status=CallStatus.EXPIRED, from_statuses=[CallStatus.AWAITING_APPROVAL])
    audit_record(tenant=call.tenant, verb="approval.expired", target=f"call:{call.pk}")
    return True


def requests_expire_due(*, now=None) -> int:
    """The periodic job: expire overdue approval requests and external calls, escalate what is due."""
    now = now or timezone.now()
    expired = 0
    due = ApprovalRequest.all_tenants.filter(status=RequestStatus.PENDING, expires_at__lte=now).select_related(
        "call", "call__tenant").order_by("expires_at")[:EXPIRE_BATCH]
    for request in due:
        with transaction.atomic():
            expired += request_expire(request=request)
    escalate = ApprovalRequest.all_tenants.filter(
        status=RequestStatus.PENDING, escalate_at__lte=now, escalated_at__isnull=True,
    ).select_related("tenant", "queue").order_by("escalate_at")[:EXPIRE_BATCH]
    for request in escalate:
        request_escalate(request=request, now=now)
    expired += external_calls_expire(now=now)
    expired += questions_expire_due(now=now)
    return expired


def request_escalate(*, request: ApprovalRequest, now) -> bool:
    """Widen a pending request's reviewers to its queue's escalation reviewers, once. The copy may be stale (the
    job read it before a decision or another escalation): the update's own condition decides."""
    with transaction.atomic():
        if not ApprovalRequest.objects.for_tenant(request.tenant_id).filter(
                pk=request.pk, status=RequestStatus.PENDING, escalated_at__isnull=True).update(escalated_at=now):
            return False
        request.escalated_at = now
        audit_record(tenant=request.tenant, verb="approval.escalated", target=f"call:{request.call_id}",
                     data={"queue": request.queue.name if request.queue else None})
        notify_request(request, "escalated")
    return True


def external_calls_expire(*, now) -> int:
    count = 0
    for queue in Queue.all_tenants.filter(is_default=True, expires_after__isnull=False).select_related("tenant"):
        cutoff = now - queue.expires_after
        calls = ToolCall.objects.for_tenant(queue.tenant).filter(
            Q(tool__source=ToolSource.EXTERNAL) | Q(declared_tool__isnull=False), status=CallStatus.AWAITING_EXTERNAL,
            created_at__lte=cutoff).order_by("created_at")[:EXPIRE_BATCH]
        for call in calls:
            with transaction.atomic():
                if call_fail(call=call, error_type="ExternalExpired", message="no result arrived before the deadline",
                             status=CallStatus.EXPIRED, from_statuses=[CallStatus.AWAITING_EXTERNAL]):
                    audit_record(tenant=queue.tenant, verb="call.expired", target=f"call:{call.pk}",
                                 data={"reason": "no external result before the deadline"})
                    count += 1
    return count


def rule_suggestion_blocked_by(request: ApprovalRequest) -> PermissionRule | None:
    """The ask rule that would still ask after an 'always allow' rule is added (ask beats allow)."""
    if request.rule_id is None:
        return None
    rule = PermissionRule.objects.for_tenant(request.tenant_id).filter(
        pk=request.rule_id, behavior__in=["ask", "confirm"]).first()
    return rule


def _exact_arg_spec(value):
    """An argument spec that matches this value only: the value itself as a glob when it reads the same as one
    (a string without `*`, white space already normal), else `{"equals": value}`."""
    if isinstance(value, str) and "*" not in value and normalize_space(value) == value:
        return value
    return {"equals": value}


def rule_from_approval(*, request: ApprovalRequest, actor, narrow_to_input: bool = False) -> PermissionRule:
    """The suggestion shown when approving: always allow this tool for this agent (optionally this input)."""
    blocking = rule_suggestion_blocked_by(request)
    if blocking is not None:
        raise ServiceError({"add_rule": [f"rule #{blocking.pk} asks for every such call and ask beats allow: "
                                            "change that rule instead"]})
    call = request.call
    arg_match = {}
    if narrow_to_input:
        approved_input = approved_edit(request)
        approved_input = call.input if approved_input is None else approved_input
        arg_match = {key: _exact_arg_spec(value) for key, value in approved_input.items()}
        # Arguments the tool takes but this input left out must stay out (bound ones are not offered).
        exposed = call_exposed(call.session, call)
        properties = exposed.schema.get("properties") if exposed is not None else None
        if isinstance(properties, dict):
            arg_match |= {name: {"absent": True} for name in sorted(properties) if name not in approved_input}
    return rule_create(tenant=call.session.tenant, actor=actor, behavior="allow", tool_pattern=call.tool_name,
                       agents=[call.session.agent], arg_match=arg_match, priority=0,
                       note=f"added while approving call {call.call_id}")


# --- grants ------------------------------------------------------------------------------------

GRANT_KEYS = frozenset({"scope", "duration_s", "arg_match"})


def _grant_refused(text: str) -> ServiceError:
    return ServiceError({"grant": [text]})


def _grant_checked(*, request: ApprovalRequest, decision: str, spec, approved_input: dict) -> dict | None:
    """The grant a reviewer's approval asks for, checked before the vote counts: the values to create it with, or
    None for "once". It is for the request's tenant, agent and tool only, never wider than the rules' verdict it
    stands in for: refused where it would never apply (the rules deny or allow such calls already) or would skip
    what a queue demands of each call (several approvals; four-eyes and verified users beyond its session)."""
    if not isinstance(spec, dict) or not set(spec) <= GRANT_KEYS or spec.get("scope") not in SCOPES:
        raise _grant_refused(f'an object {{"scope": {"|".join(SCOPES)}, "duration_s": seconds, "arg_match": {{...}}}}')
    scope = spec["scope"]
    if scope == "once":
        return None
    if decision not in (VoteDecision.APPROVE, VoteDecision.EDIT):
        raise _grant_refused("a grant comes with an approval (approve or edit)")
    queue = request.queue
    if request.kind != RequestKind.APPROVAL:
        raise _grant_refused("only a reviewer's approval of a call gives a grant")
    if queue is not None and queue.required_approvals > 1:
        raise _grant_refused(f"queue {queue.name!r} needs {queue.required_approvals} approvals for each call: one "
                             "reviewer's grant would skip the others")
    if queue is not None and (queue.four_eyes or queue.verified_requesters) and scope != GrantScope.SESSION:
        raise _grant_refused(f"queue {queue.name!r} checks each call's user (four-eyes or verified users): it grants "
                             "for this session only")
    duration = spec.get("duration_s")
    if duration is not None:
        low, high = int(MIN_DURATION.total_seconds()), int(MAX_DURATION.total_seconds())
        if isinstance(duration, bool) or not isinstance(duration, int) or not low <= duration <= high:
            raise ServiceError({"grant": [f"duration_s: whole seconds from {low} to {high}"]})
        duration = timedelta(seconds=duration)
    elif scope == GrantScope.DURATION:
        raise ServiceError({"grant": ["duration_s: a duration grant needs one"]})
    elif scope == GrantScope.PATTERN:
        duration = PATTERN_DEFAULT_DURATION
    call = request.call
    session = call.session
    exposed = call_exposed(session, call)
    if exposed is None:
        raise _grant_refused(f"{call.tool_name!r} is no longer available in this session")
    arg_match = spec.get("arg_match") or {}
    bound_names = {name.lower() for name in exposed.bound}
    if not isinstance(arg_match, dict) or not all(isinstance(path, str) and path and is_arg_spec(value)
                                                  for path, value in arg_match.items()):
        raise ServiceError({"grant": ['arg_match: an object of argument name → glob, → list of globs, → '
                                      '{"equals": exact value} or → {"absent": true}']})
    if any(path.split(".")[0].lower() in bound_names for path in arg_match):
        raise _grant_refused("arg_match: a bound argument's value is the server's, not the call's: leave it out")
    if scope == GrantScope.PATTERN and not arg_match:
        raise _grant_refused("arg_match: a pattern grant needs the pattern inputs must match")
    effective = with_bound(approved_input, exposed.bound)
    if not matches_input(arg_match, effective):
        raise _grant_refused("arg_match: the pattern does not match this call's input; a grant covers inputs like "
                             "the one approved")
    verdict = evaluate(tenant=session.tenant, tool_name=call.tool_name, effective_input=effective,
                       agent=session.agent, user=session.user, tool=exposed.tool, user_verified=session.user_verified,
                       grants=False)
    if verdict.behavior != "ask":
        raise _grant_refused(f"the rules do not ask about such calls, so a grant would change nothing: "
                             f"{verdict.reason}")
    return {"scope": scope, "arg_match": arg_match, "ask_rule": verdict.rule,
            "session": session if scope == GrantScope.SESSION else None,
            "expires_at": timezone.now() + duration if duration is not None else None}


def _grant_create(*, request: ApprovalRequest, reviewer, values: dict) -> Grant:
    call = request.call
    grant = Grant.objects.create(
        tenant_id=request.tenant_id, agent=call.session.agent, tool_name=call.tool_name, created_from=request,
        created_by=reviewer if _is_person(reviewer) else None, created_by_label=str(reviewer.username), **values)
    audit_record(tenant=call.session.tenant, actor=reviewer, verb="grant.created", target=f"grant:{grant.pk}",
                 data={"call": str(call.pk), "agent": grant.agent, "tool": grant.tool_name, "scope": grant.scope,
                       "session": str(grant.session_id) if grant.session_id else None, "arg_match": grant.arg_match,
                       "expires_at": grant.expires_at.isoformat() if grant.expires_at else None})
    return grant


def grant_revoke(*, grant: Grant, actor) -> Grant:
    """End a grant now: it lets no more calls through. A grant already revoked is a 409."""
    now = timezone.now()
    with transaction.atomic():
        revoked = Grant.objects.for_tenant(grant.tenant_id).filter(pk=grant.pk, revoked_at__isnull=True).update(
            revoked_at=now, revoked_by=actor if _is_person(actor) else None, revoked_by_label=str(actor.username))
        if not revoked:
            raise Conflict("the grant is already revoked")
        audit_record(tenant=grant.tenant, actor=actor, verb="grant.revoked", target=f"grant:{grant.pk}",
                     data={"agent": grant.agent, "tool": grant.tool_name, "scope": grant.scope, "uses": grant.uses})
    grant.refresh_from_db()
    return grant


def grant_pattern_prefill(request: ApprovalRequest) -> dict:
    """The pattern the console offers for "inputs like this one": each argument of the input approving would run,
    exactly (`_exact_arg_spec`); the reviewer edits it into globs."""
    approved_input = approved_edit(request)
    approved_input = request.call.input if approved_input is None else approved_input
    return {key: _exact_arg_spec(value) for key, value in (approved_input or {}).items()}
