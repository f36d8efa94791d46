"""Meta tools at run time: inline, in the request that submits the call (`meta_run`, from the pipeline's
dispatch step), so a batch that activates a group and then calls one of its tools works in one request.
Where they appear on the surface: `tools.catalog.meta`."""
from common.errors import ServiceError
from tools.calls.events import call_fail, call_transition
from tools.catalog.registry import META_ENABLE_TOOLS, META_RESET_TOOLS, META_SEARCH_TOOLS, meta_providers
from tools.catalog.search import tools_search
from tools.catalog.selectors import loaded_skill_names
from tools.catalog.services import session_tools_enable
from tools.catalog.snapshot import catalog_snapshot, surface_announce, switchable_groups
from tools.models import AgentSession, CallStatus, ToolCall
from tools.python.decorators import ToolError
from tools.python.results import tool_result


def session_groups_reset(*, session: AgentSession, choices) -> dict:
    """reset_tools: the final state of every switchable group open to the session's agent. All or nothing. The
    answer's `active_groups` are the switchable groups on afterwards: those chosen, and those a loaded skill
    keeps on (`kept_on` says which and why, when the choices left them off)."""
    groups = switchable_groups(catalog_snapshot(session.tenant_id).groups, session.agent)
    by_name = {g.name: g for g in groups}
    if not isinstance(choices, dict):
        raise ToolError("send an object of group names to true/false", error_type="InvalidInput")
    unknown = sorted(set(choices) - set(by_name))
    wrong = sorted(name for name, value in choices.items() if name in by_name and not isinstance(value, bool))
    if unknown or wrong:
        problems = []
        if unknown:
            problems.append(f"unknown groups: {', '.join(unknown)} (available: {', '.join(sorted(by_name))})")
        if wrong:
            problems.append(f"not true/false: {', '.join(wrong)}")
        raise ToolError("; ".join(problems) + ". Nothing was changed.", error_type="InvalidInput")
    # A group that a skill loaded in this session switched on stays on for the rest of the session, whatever
    # the choices say: the answer names it, with the skill, so what it reports is what the session sees.
    skills = loaded_skill_names(session)
    by_skill = {name: group.skill_ref for name, group in by_name.items() if group.skill_ref in skills}
    before = set(session.active_groups) | set(by_skill)
    chosen = [name for name in by_name if choices.get(name) is True]
    AgentSession.objects.for_tenant(session.tenant_id).filter(pk=session.pk).update(active_groups=chosen)
    session.active_groups = chosen
    after = [name for name in by_name if name in chosen or name in by_skill]
    surface_announce(session.tenant_id, session.pk)
    activated = [name for name in after if name not in before]
    return {
        "active_groups": after,
        "activated": activated,
        "deactivated": sorted(before & set(by_name) - set(after)),
        "kept_on": {name: f"switched on by the skill {skill}, loaded in this session: it stays on until the "
                          "session ends" for name, skill in by_skill.items() if name not in chosen},
        "notes": {name: by_name[name].notes for name in activated if by_name[name].notes},
    }


def session_tools_search(*, session: AgentSession, arguments) -> dict:
    """search_tools: the tools this session may see that match the query (tools.catalog.search)."""
    arguments = arguments if isinstance(arguments, dict) else {}
    hits = tools_search(session=session, query=arguments.get("query"), limit=arguments.get("limit"))
    return {"tools": [hit.as_dict() for hit in hits],
            "next": "Switch the tools you need on with enable_tools; a listed one can be called already."
            if hits else "No tool matches: try other words."}


def meta_run(*, call: ToolCall, session: AgentSession) -> None:
    """Run a meta call that the dispatch step has moved to `running`, and settle it."""
    try:
        if call.tool_name == META_RESET_TOOLS:
            value = session_groups_reset(session=session, choices=call.effective_input)
        elif call.tool_name in (META_SEARCH_TOOLS, META_ENABLE_TOOLS):
            try:
                if call.tool_name == META_SEARCH_TOOLS:
                    value = session_tools_search(session=session, arguments=call.effective_input)
                else:
                    value = session_tools_enable(session=session, names=(call.effective_input or {}).get("names"))
            except ServiceError as exc:
                raise ToolError(exc.message, error_type="InvalidInput") from None
        else:
            provider = next((p for p in meta_providers() if p.name == call.tool_name), None)
            if provider is None:
                raise ToolError(f"{call.tool_name} is not available", error_type="ToolUnavailable")
            value = provider.run(call=call, session=session)
    except ToolError as exc:
        call_fail(call=call, error_type=exc.error_type, message=str(exc), from_statuses=[CallStatus.RUNNING])
        return
    call_transition(call=call, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.SUCCEEDED,
                    result=tool_result(value))
