"""What the rules keep off a session's listed surface (`tools.catalog.registry.register_exposure_filter`).

A tool that an enabled deny rule refuses whatever the arguments — its pattern matches the tool, its agents and
users include the session's (or are empty), and it has no argument conditions — is not advertised: every call
of it would be denied. The call path does not consult this; its permission step decides each call with the same
rules and denies such a call with that rule's reason, so the surface and the decisions agree. A rule with argument
conditions hides nothing, nor does the tenant's default behaviour: an allow rule or read-only auto-allow may
still let a call through.
"""
from dataclasses import dataclass

from approvals.engine import CompiledRule, Decision
from approvals.selectors import evaluate, rule_index
from tools.catalog.schemas import with_bound
from tools.catalog.selectors import active_group_names, visible_tools
from tools.catalog.snapshot import catalog_snapshot
from tools.models import AgentSession


def _always_denies(rule: CompiledRule, *, tool_name: str, agent: str, user: str, user_verified: bool) -> bool:
    return (rule.behavior == "deny" and not rule.arg_match
            and rule.matches(tool_name=tool_name, effective_input={}, agent=agent, user=user,
                             user_verified=user_verified))


def tools_always_denied(*, tenant, agent: str, user: str, names, user_verified: bool = False) -> dict[str, str]:
    """{name: the decision's reason} for the tools of `names` a deny rule always refuses this agent and user."""
    index = rule_index(tenant)  # compiled once per policy version
    hidden = {}
    for name in names:
        rule = next((rule for rule in index.candidates(name)
                     if _always_denies(rule, tool_name=name, agent=agent, user=user,
                                       user_verified=user_verified)), None)
        if rule is not None:
            hidden[name] = f"denied by {rule.describe()}"
    return hidden


@dataclass(frozen=True)
class SeenTool:
    """One tool on a session's listed surface, and why it is there and how a call of it would go."""
    name: str
    schema: dict  # as the model sees it
    groups: list[str]  # the session's active groups that list it; empty for a meta tool
    bound: list[str]  # the names of the arguments the server sets
    decision: Decision | None  # for a call with no other arguments; None for a meta tool (never governed)


def agents_eye_view(session: AgentSession) -> list[SeenTool]:
    """The tools the model of `session` is listed, computed as `GET /api/v1/sessions/{id}/tools` lists
    them, each with its groups, its bound arguments and the decision the rules would make for a call
    that sends no other arguments (a rule with argument conditions may decide a real call otherwise)."""
    catalog = catalog_snapshot(session.tenant_id)
    active = set(active_group_names(session, catalog.groups))
    seen = []
    for exposed in visible_tools(session):
        decision = None
        if not exposed.is_meta:
            decision = evaluate(tenant=session.tenant, tool_name=exposed.name, tool=exposed.tool,
                                effective_input=with_bound({}, exposed.bound), agent=session.agent,
                                user=session.user, user_verified=session.user_verified)
        groups = [group.name for group in catalog.groups_of_tool.get(exposed.name, []) if group.name in active]
        seen.append(SeenTool(name=exposed.name, schema=exposed.schema, groups=groups, bound=sorted(exposed.bound),
                             decision=decision))
    return seen
