"""Reads: decisions, the inbox, requests."""
import difflib
import hashlib
import json
import unicodedata
from dataclasses import dataclass

from django.db.models import Count, F, OuterRef, Prefetch, Subquery, TextField
from django.db.models.functions import Cast, Left

from approvals.engine import CompiledRule, Decision, RuleIndex, compile_rule, decide, index_cache
from approvals.grants import grant_applying
from approvals.matching import Arguments, canonical_json, compile_glob
from approvals.models import ApprovalRequest, PermissionRule, Queue, RequestKind, RequestStatus, Vote, VoteDecision
from tenancy.models import Tenant
from tools.catalog.registry import CallOutcome
from tools.catalog.schemas import with_bound
from tools.catalog.selectors import CALL_PAYLOADS, SESSION_PAYLOADS, TOOL_PAYLOADS, bindings_for, related
from tools.models import CallStatus, Tool, ToolCall, ToolSource


def _rule_index_build(tenant_id: int, version: int) -> RuleIndex:
    return RuleIndex(list(PermissionRule.objects.for_tenant(tenant_id).filter(enabled=True)))


def rule_index(tenant: Tenant) -> RuleIndex:
    return index_cache.get(tenant.pk, _rule_index_build)


def read_only_trusted(tool: Tool | None) -> bool:
    return bool(tool is not None and tool.read_only and tool.trusted)


def from_untrusted_server(tool: Tool | None) -> bool:
    """Whether `tool` is an MCP server's tool whose flags came from an untrusted server (tools.upstream.servers):
    what the tenant's `review_untrusted` has a reviewer look at. An app's own declared tools are not."""
    return bool(tool is not None and tool.source == ToolSource.MCP and not tool.trusted)


def evaluate(*, tenant: Tenant, tool_name: str, effective_input: dict, agent: str = "", user: str = "",
             tool: Tool | None = None, user_verified: bool = False, session=None, grants: bool = True) -> Decision:
    """The one engine behind calls, `rules/evaluate` and the console's simulator.

    Where the rules ask, a grant in force may allow instead (`approvals.grants`; a session's grants only with its
    `session`); `grants=False` gives the rules' own verdict."""
    if tool is None:
        tool = Tool.objects.for_tenant(tenant).filter(name=tool_name).first()
    decision = decide(
        rule_index(tenant), tool_name=tool_name, effective_input=effective_input or {}, agent=agent, user=user,
        read_only_trusted=read_only_trusted(tool), auto_allow_read_only=tenant.auto_allow_read_only,
        default_behavior=tenant.default_behavior, user_verified=user_verified,
        review_untrusted=tenant.review_untrusted and from_untrusted_server(tool),
    )
    if decision.behavior == "ask" and grants:
        granted = grant_applying(tenant_id=tenant.pk, agent=agent, tool_name=tool_name, ask_rule=decision.rule,
                                 effective_input=effective_input or {}, session=session)
        if granted is not None:
            return Decision("allow", decision.rule, granted.reason, grant=granted.id)
    return decision


OUTCOME_LABELS = {"allow": "runs without review", "ask": "asks a reviewer", "deny": "refused",
                  "confirm": "asks the session's user"}


def untrusted_outcomes(*, tenant: Tenant, tools) -> dict[int, CallOutcome]:
    """What happens to calls of the untrusted servers' tools among `tools`, for their badges on the console
    (`tools.catalog.registry.register_outcome_describer`): the decision of a call that no rule with conditions
    (agents, users, arguments) matches, made by the engine from the enabled rules without conditions and the
    tenant's settings; `conditional` says a rule with conditions may decide some calls otherwise."""
    index = rule_index(tenant)
    outcomes = {}
    for tool in tools:
        if not from_untrusted_server(tool):
            continue
        candidates = index.candidates(tool.name)
        plain = [rule for rule in candidates
                 if not (rule.arg_match or rule.agents or rule.users or rule.user_verified is not None)]
        decision = decide(
            RuleIndex(plain), tool_name=tool.name, effective_input={}, agent="", user="",
            read_only_trusted=read_only_trusted(tool), auto_allow_read_only=tenant.auto_allow_read_only,
            default_behavior=tenant.default_behavior, review_untrusted=tenant.review_untrusted)
        # a rule with conditions counts only when it is tried before the one that decides
        deciding = next((rule for rule in plain if rule.id == decision.rule), None)
        conditional = any(rule not in plain and (deciding is None or rule.sort_key < deciding.sort_key)
                          for rule in candidates)
        outcomes[tool.pk] = CallOutcome(behavior=decision.behavior, label=OUTCOME_LABELS[decision.behavior],
                                        reason=decision.reason, conditional=conditional)
    return outcomes


def simulate(*, tenant: Tenant, tool_name: str, tool_input: dict | None = None, agent: str = "",
             user: str = "", session=None) -> Decision:
    """Decide a hypothetical call as a real one would be decided: the agent's bound arguments are applied
    to the input first (so a rule on a bound argument matches exactly as it does for real calls).
    Behind `POST /api/v1/rules/evaluate` and the console's rule simulator."""
    tool = Tool.objects.for_tenant(tenant).filter(name=tool_name).first()
    bound = bindings_for(tenant, agent, [tool.pk]).get(tool.pk, {}) if tool is not None else {}
    effective = with_bound(tool_input or {}, bound)
    return evaluate(tenant=tenant, tool_name=tool_name, effective_input=effective, agent=agent, user=user, tool=tool,
                    session=session)


@dataclass(frozen=True)
class RuleConsidered:
    rule: CompiledRule
    misses: list[str]  # why it does not match the call; empty: it matches
    decides: bool


def rules_considered(*, tenant: Tenant, tool_name: str, tool_input: dict | None = None, agent: str = "",
                     user: str = "", decision: Decision) -> list[RuleConsidered]:
    """Every enabled rule in the order the engine tries them, and why each matches `simulate`'s call or not:
    the simulator's explanation of `decision`."""
    tool = Tool.objects.for_tenant(tenant).filter(name=tool_name).first()
    bound = bindings_for(tenant, agent, [tool.pk]).get(tool.pk, {}) if tool is not None else {}
    arguments = Arguments(with_bound(tool_input or {}, bound))
    rules = sorted((compile_rule(rule) for rule in PermissionRule.objects.for_tenant(tenant).filter(enabled=True)),
                   key=lambda rule: rule.sort_key)
    considered = []
    for rule in rules:
        misses = []
        if not compile_glob(rule.tool_pattern)(tool_name):
            misses.append(f"the tool is not {rule.tool_pattern!r}")
        if rule.agents and agent not in rule.agents:
            misses.append(f"the agent is not {' or '.join(sorted(rule.agents))}")
        if rule.users and user not in rule.users:
            misses.append(f"the user is not {' or '.join(sorted(rule.users))}")
        misses += [f"the call fails the condition “{spec.describe()}”" for spec in rule.arg_match
                   if not spec.matches(arguments, oversized=rule.behavior != "allow")]
        considered.append(RuleConsidered(rule=rule, misses=misses, decides=rule.id == decision.rule))
    return considered


def tool_names(*, tenant: Tenant) -> list[str]:
    return list(Tool.objects.for_tenant(tenant).order_by("name").values_list("name", flat=True))


def tools_matching(*, tenant: Tenant, pattern: str, names: list[str] | None = None) -> tuple[list[str], list[str]]:
    """The tenant's tools (`names`, when already read) a rule's tool pattern matches, and, when it matches none,
    the names it may have meant."""
    names = tool_names(tenant=tenant) if names is None else names
    matches = compile_glob(pattern)
    matched = [name for name in names if matches(name)]
    return matched, [] if matched else difflib.get_close_matches(pattern, names, n=3, cutoff=0.6)


def approved_edit(request: ApprovalRequest) -> dict | None:
    """The input the latest reviewer edit proposes, or None when nobody edited: what runs once approved."""
    edit = (Vote.objects.for_tenant(request.tenant_id).filter(request=request, decision=VoteDecision.EDIT)
            .order_by("-at", "-id").first())
    return edit.input if edit is not None else None


def approvals_of(request: ApprovalRequest, approved_input: dict | None) -> list[Vote]:
    """The approve and edit votes that approved exactly this input (None: the model's own input).

    An approve vote records the edit it approved (None when it approved the model's input), so a vote for
    an input that a later edit replaced no longer counts towards the quorum.
    """
    model_input = request.call.input
    wanted = canonical_json(model_input if approved_input is None else approved_input)
    votes = Vote.objects.for_tenant(request.tenant_id).filter(
        request=request, decision__in=[VoteDecision.APPROVE, VoteDecision.EDIT]).order_by("at", "id")
    return [vote for vote in votes if canonical_json(model_input if vote.input is None else vote.input) == wanted]


DECIDED_STATUSES = tuple(status for status in RequestStatus.values if status != RequestStatus.PENDING)


def inbox_requests(*, tenant, statuses=(RequestStatus.PENDING,), queue: str = "", agent: str = "", tool: str = ""):
    """Approval requests in `statuses`, narrowed by the inbox filters: the queue's name, the agent, the tool's
    name (empty: any). Only pending ones: oldest first, the order they are worked through; otherwise the
    most recently decided first. The one selector behind the inbox, its history and the approvals API list."""
    queryset = ApprovalRequest.objects.for_tenant(tenant).filter(status__in=statuses, kind=RequestKind.APPROVAL)
    if queue:
        queryset = queryset.filter(queue__name=queue)
    if agent:
        queryset = queryset.filter(agent=agent)
    if tool:
        queryset = queryset.filter(tool_name=tool)
    if set(statuses) == {RequestStatus.PENDING}:
        order = ["opened_at", "id"]
    else:
        order = [F("decided_at").desc(nulls_last=True), "-id"]
    return queryset.select_related("queue").order_by(*order)


def inbox_filter_choices(*, tenant, statuses) -> dict[str, list[str]]:
    """What the inbox filters offer: the tenant's queues, and the agents and tools of requests in `statuses`."""
    existing = ApprovalRequest.objects.for_tenant(tenant).filter(kind=RequestKind.APPROVAL, status__in=statuses)
    return {
        "queue": sorted(Queue.objects.for_tenant(tenant).values_list("name", flat=True)),
        "agent": sorted(set(existing.order_by().values_list("agent", flat=True).distinct()) - {""}),
        "tool": sorted(set(existing.order_by().values_list("tool_name", flat=True).distinct()) - {""}),
    }


def inbox_count(*, tenant) -> int:
    return ApprovalRequest.objects.for_tenant(tenant).filter(status=RequestStatus.PENDING, kind="approval").count()


def request_of_call(call) -> ApprovalRequest | None:
    """The call's approval request, whatever its state, with its queue and its votes in order."""
    votes = Prefetch("votes", queryset=Vote.objects.for_tenant(call.tenant_id).order_by("at", "id"))
    return (ApprovalRequest.objects.for_tenant(call.tenant_id).filter(call=call, kind=RequestKind.APPROVAL)
            .select_related("queue").prefetch_related(votes).first())


def pending_request_of(call) -> ApprovalRequest | None:
    """The call's approval request while it waits for a reviewer, with its queue."""
    return (ApprovalRequest.objects.for_tenant(call.tenant_id).filter(call=call, status=RequestStatus.PENDING)
            .select_related("queue").first())


def request_rows(requests, *, tenant):
    """Approval requests as list rows show them (queue, session user, votes), without JSON payloads."""
    votes = Prefetch("votes", queryset=Vote.objects.for_tenant(tenant).defer("input").order_by("at", "id"))
    return (requests.select_related("queue", "call__session")
            .defer(*related("call", CALL_PAYLOADS), *related("call__session", SESSION_PAYLOADS))
            .prefetch_related(votes))


LIST_INPUT_CHARS = 1000  # the most of an input (as JSON text) the inbox list shows; longer ones are read on their page
LINE_CHARS = 60  # an input's one-line form in the list


def with_shown_input(requests, *, tenant):
    """List rows with the input approving them would run, cut by the database to LIST_INPUT_CHARS + 1
    characters of JSON text (a list page never loads whole inputs): `edit_input_head`, the standing reviewer
    edit (`approved_edit`), else None; `call_input_head`, the model's input. `shown_input` reads them."""
    def head(column):
        return Left(Cast(column, output_field=TextField()), LIST_INPUT_CHARS + 1)

    standing_edit = (Vote.objects.for_tenant(tenant).filter(request=OuterRef("pk"), decision=VoteDecision.EDIT)
                     .order_by("-at", "-id").annotate(head=head("input")).values("head")[:1])
    return requests.annotate(edit_input_head=Subquery(standing_edit, output_field=TextField()),
                             call_input_head=head("call__input"))


@dataclass(frozen=True)
class ShownInput:
    """A list row's input as the reviewer reads it (every text is escaped by the template)."""

    line: str  # one line: all of it, or its start and "…"
    pretty: str  # all of it, indented, when `line` is only its start; else empty
    value: str  # all of it as JSON, what the list's Approve sends; empty when too long for the list
    edited: bool  # a reviewer's edit stands: this, not the model's input, is what would run

    @property
    def whole(self) -> bool:
        """The list shows all of it (and so may approve it)."""
        return bool(self.value)

    @property
    def digest(self) -> str:
        """`input_digest` of all of it, which a bulk approval sends back; empty when the list shows only a part."""
        return input_digest(json.loads(self.value)) if self.value else ""


def input_digest(value) -> str:
    """A fingerprint of a JSON input, whatever its key order or spacing: what a bulk approval in the inbox list
    sends back for each row, so that it approves only the input the reviewer was shown."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:32]


# Invisible or reordering characters (bidi controls, zero-width marks, odd spaces) can make a JSON string read as
# something else: the list shows them as \\u escapes, which stand for the same JSON value.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs", "Zl", "Zp", "Zs"})


def _visible(text: str) -> str:
    if text.isascii():
        return text
    return "".join(json.dumps(char)[1:-1] if char != " " and unicodedata.category(char) in _HIDDEN_CATEGORIES
                   else char for char in text)


def shown_input(request) -> ShownInput:
    """What a row of `with_shown_input` shows of the input approving it would run."""
    edited = request.edit_input_head is not None
    head = request.edit_input_head if edited else request.call_input_head
    if len(head) > LIST_INPUT_CHARS:
        return ShownInput(line=_visible(head)[:LINE_CHARS] + "…", pretty="", value="", edited=edited)
    value = json.loads(head)
    line = _visible(json.dumps(value, ensure_ascii=False))
    sent = json.dumps(value)  # ASCII: the same value, nothing hidden in the page
    if len(line) <= LINE_CHARS:
        return ShownInput(line=line, pretty="", value=sent, edited=edited)
    return ShownInput(line=line[:LINE_CHARS] + "…", pretty=_visible(json.dumps(value, indent=2, ensure_ascii=False)),
                      value=sent, edited=edited)


def external_tasks(*, tenant):
    """Calls awaiting an external result, with the input a reviewer answers."""
    return ToolCall.objects.for_tenant(tenant).filter(
        status=CallStatus.AWAITING_EXTERNAL, tool__source=ToolSource.EXTERNAL,
    ).select_related("session", "tool").defer(
        *(name for name in CALL_PAYLOADS if name != "input"), *related("session", SESSION_PAYLOADS),
        *related("tool", TOOL_PAYLOADS),
    ).order_by("created_at")


def ever_asked(call) -> bool:
    """Whether a call was ever held for a reviewer (only those have an approval request): an ask, or a confirm
    whose rule sends it on to a queue once its user confirms."""
    return (call.decision or {}).get("behavior") in ("ask", "confirm")


def approvals_for_calls(calls) -> dict:
    """The `approval` of each call that was ever asked (`ever_asked`), for the API (one query, votes included)."""
    if not calls:
        return {}
    tenant_id = calls[0].tenant_id
    requests = (ApprovalRequest.objects.for_tenant(tenant_id).filter(call_id__in=[c.pk for c in calls])
                .select_related("queue")
                .prefetch_related(Prefetch("votes", queryset=Vote.objects.for_tenant(tenant_id).order_by("at"))))
    return {request.call_id: {"approval": approval_data(request)} for request in requests}


def approval_data(request: ApprovalRequest) -> dict:
    return {
        "id": request.pk,
        "queue": request.queue.name if request.queue else None,
        "status": request.status,
        "expires_at": request.expires_at.isoformat().replace("+00:00", "Z") if request.expires_at else None,
        "votes": [
            {"reviewer": vote.reviewer_label, "decision": vote.decision, "message": vote.message,
             "input": vote.input, "at": vote.at.isoformat().replace("+00:00", "Z")}
            for vote in request.votes.all()
        ],
    }


def pending_counts_by_queue(*, tenant) -> dict:
    rows = (ApprovalRequest.objects.for_tenant(tenant).filter(status=RequestStatus.PENDING, kind="approval")
            .values("queue__name").annotate(n=Count("id")))
    return {row["queue__name"] or "": row["n"] for row in rows}
