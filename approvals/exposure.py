"""What the rules keep off a session's listed surface (`tools.registry.register_exposure_filter`).

A tool that an enabled deny rule refuses whatever the arguments — its pattern matches the tool, its agents and
users include the session's (or are empty), and it has no argument conditions — is not advertised: every call
of it would be denied. The call path does not consult this; its permission step decides each call with the same
rules and denies such a call with that rule's reason, so the surface and the decisions agree. A rule with argument
conditions hides nothing, nor does the tenant's default behaviour: an allow rule or read-only auto-allow may
still let a call through.
"""
from .engine import CompiledRule
from .selectors import rule_index


def _always_denies(rule: CompiledRule, *, tool_name: str, agent: str, user: str) -> bool:
    return (rule.behavior == "deny" and not rule.arg_match
            and rule.matches(tool_name=tool_name, effective_input={}, agent=agent, user=user))


def tools_always_denied(*, tenant, agent: str, user: str, names) -> dict[str, str]:
    """{name: the decision's reason} for the tools of `names` a deny rule always refuses this agent and user."""
    index = rule_index(tenant)  # compiled once per policy version
    hidden = {}
    for name in names:
        rule = next((rule for rule in index.candidates(name)
                     if _always_denies(rule, tool_name=name, agent=agent, user=user)), None)
        if rule is not None:
            hidden[name] = f"denied by {rule.describe()}"
    return hidden
