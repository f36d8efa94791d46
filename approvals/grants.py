"""Grants (docs/governance.md, Grants): what a reviewer's approval lets through besides the call it decided.

Reads, and the one write a use makes. A grant stands in for the ask rule of the request it was given for: the
engine consults grants only when the rules' verdict is ask (`grant_applying`, from `selectors.evaluate`), so a
deny always wins, an allow never costs a query, and a grant never reaches another tenant, agent, tool, or a call
that a different ask rule (another queue's reviewers) holds. Creating and revoking grants are services
(`approvals.services`, which checks them like votes).
"""
from dataclasses import dataclass
from datetime import timedelta

from django.core.exceptions import ValidationError
from django.db.models import F, Q
from django.utils import timezone

from approvals.matching import Arguments, compile_arg_spec
from approvals.models import Grant, GrantScope
from tools.calls.events import call_event_append
from tools.models import AgentSession, EventKind, ToolCall

SCOPES = ("once", *GrantScope.values)
MIN_DURATION = timedelta(minutes=1)
MAX_DURATION = timedelta(days=30)  # no grant outlives this but a session's, which ends with its session's use
PATTERN_DEFAULT_DURATION = timedelta(days=1)  # a pattern given without a duration
DURATION_CHOICES = (  # what the console offers (the API takes any number of seconds in the bounds)
    (3600, "1 hour"), (2 * 3600, "2 hours"), (8 * 3600, "8 hours"), (86400, "1 day"), (7 * 86400, "7 days"),
    (30 * 86400, "30 days"),
)


@dataclass(frozen=True)
class GrantMatch:
    """The grant that lets a call through, as the decision names it."""

    id: int
    reason: str


def matches_input(arg_match: dict, effective_input: dict) -> bool:
    """Whether an effective input passes a grant's pattern: the rules' matcher, as an allow rule matches (past the
    length cap no glob looks, so an oversized argument does not match)."""
    if not arg_match:
        return True
    arguments = Arguments(effective_input)
    return all(compile_arg_spec(path, spec).matches(arguments, oversized=False)
               for path, spec in sorted(arg_match.items()))


def in_force(queryset, now=None):
    """Grants neither revoked nor expired at `now`."""
    now = now or timezone.now()
    return queryset.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now), revoked_at__isnull=True)


def grant_applying(*, tenant_id: int, agent: str, tool_name: str, ask_rule: int | None, effective_input: dict,
                   session=None, now=None) -> GrantMatch | None:
    """The grant in force that lets this call through instead of asking (one indexed query), or None.

    Only grants of this tenant, agent and tool, given for the same ask rule, in this session or in none (a
    session's grants hold for their session only), whose pattern the effective input matches; the oldest wins."""
    if not agent:
        return None
    session_id = getattr(session, "pk", session)
    holders = Q(session__isnull=True) | Q(session_id=session_id) if session_id is not None else Q(session__isnull=True)
    candidates = in_force(Grant.objects.for_tenant(tenant_id).filter(holders, agent=agent, tool_name=tool_name,
                                                                     ask_rule=ask_rule), now)
    for grant in candidates.order_by("created_at", "id").only(
            "id", "scope", "arg_match", "expires_at", "created_by_label", "session_id"):
        if matches_input(grant.arg_match, effective_input):
            return GrantMatch(id=grant.pk, reason=f"allowed by {describe(grant)}")
    return None


def describe(grant: Grant) -> str:
    """"grant #N (scope, by whom, until when)", as decisions and timelines name it."""
    if grant.scope == GrantScope.SESSION:
        scope = "this session"
    elif grant.arg_match:
        scope = "inputs like " + ", ".join(f"{path}: {spec}" for path, spec in sorted(grant.arg_match.items()))
    else:
        scope = "any input"
    until = (f"until {grant.expires_at.isoformat(timespec='seconds').replace('+00:00', 'Z')}"
             if grant.expires_at else "while the session lasts")
    return f"grant #{grant.pk} ({scope}, by {grant.created_by_label}, {until})"


def grant_use(*, call: ToolCall, grant_id: int, reason: str) -> None:
    """A use: the grant's count and last use (one UPDATE), and a log event on the call's timeline naming it."""
    now = timezone.now()
    Grant.objects.for_tenant(call.tenant_id).filter(pk=grant_id).update(uses=F("uses") + 1, last_used_at=now)
    call_event_append(call=call, kind=EventKind.LOG, data={"text": reason, "grant": grant_id})


def grants_list(*, tenant, session=None, active: bool | None = None, agent: str = "", now=None):
    """The tenant's grants, newest first: of one session (`session`), in force or not (`active`), of an agent."""
    queryset = Grant.objects.for_tenant(tenant).select_related("session", "created_from")
    if session is not None:
        queryset = queryset.filter(session=session)
    if agent:
        queryset = queryset.filter(agent=agent)
    if active is True:
        queryset = in_force(queryset, now)
    elif active is False:
        now = now or timezone.now()
        queryset = queryset.filter(Q(revoked_at__isnull=False) | Q(expires_at__lte=now))
    return queryset.order_by("-created_at", "-id")


def grants_in_force(*, tenant, agent: str, tool_name: str = "", session=None, now=None) -> list[Grant]:
    """What the simulator lists: the agent's grants in force (of the tool, when named), the session's included when
    one is named, the others' left out."""
    queryset = in_force(Grant.objects.for_tenant(tenant).filter(agent=agent), now)
    session_id = getattr(session, "pk", session)
    queryset = queryset.filter(Q(session__isnull=True) | Q(session_id=session_id)) if session_id is not None \
        else queryset.filter(session__isnull=True)
    if tool_name:
        queryset = queryset.filter(tool_name=tool_name)
    return list(queryset.order_by("created_at", "id"))


def is_in_force(grant: Grant, now=None) -> bool:
    now = now or timezone.now()
    return grant.revoked_at is None and (grant.expires_at is None or grant.expires_at > now)


def session_of(*, tenant, session_id):
    """The tenant's session of this id (a filter's value), or None: missing, another tenant's, or no id at all."""
    try:
        return AgentSession.objects.for_tenant(tenant).filter(pk=session_id).first()
    except (ValueError, ValidationError):
        return None
