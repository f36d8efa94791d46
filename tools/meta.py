"""Meta tools: the platform's own tools on a session's surface, which change the session itself.

`reset_tools` (DESIGN §7) is on the surface whenever the tenant has switchable groups; its schema has
one boolean per such group. Other apps provide meta tools of their own through `tools.registry`
(`load_skill_through_path`, from skills). Meta tools are no rows of the catalog (`ExposedTool.tool` is None) and
their names are reserved (`tools.registry.RESERVED_TOOL_NAMES`). This module is where they appear on
the surface (`meta_tools`) and how they run: inline, in the request that submits the call (`meta_run`,
from the pipeline's dispatch step), so a batch that activates a group and then calls one of its tools
works in one request.
"""
from .catalog import CatalogSnapshot, ExposedTool, GroupView, catalog_snapshot, switchable_groups
from .decorators import ToolError
from .events import call_fail, call_transition
from .models import AgentSession, CallStatus, ToolCall
from .registry import META_RESET_TOOLS, meta_providers
from .results import tool_result

RESET_TOOLS_DESCRIPTION = (
    "Choose which optional tool groups are active. Send the complete desired state: "
    "a group not set to true is deactivated. Returns the notes of newly activated groups."
)


def reset_tools_schema(groups: list[GroupView]) -> dict:
    return {
        "type": "object",
        "properties": {
            group.name: {"type": "boolean", "description": group.description or f"The {group.name} tools."}
            for group in groups
        },
        "additionalProperties": False,
    }


def meta_tools(catalog: CatalogSnapshot, session: AgentSession) -> list[ExposedTool]:
    """The meta tools this session sees, after its catalog tools."""
    switchable = switchable_groups(catalog.groups, session.agent)
    exposed = [ExposedTool(
        name=META_RESET_TOOLS, description=RESET_TOOLS_DESCRIPTION, schema=reset_tools_schema(switchable),
        catalog=catalog, annotations={"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True},
    )] if switchable else []
    for provider in meta_providers():
        provided = provider.exposed(session, catalog)
        if provided is not None:
            exposed.append(provided)
    return exposed


def meta_tool(catalog: CatalogSnapshot, session: AgentSession, name: str) -> ExposedTool | None:
    return next((exposed for exposed in meta_tools(catalog, session) if exposed.name == name), None)


def session_groups_reset(*, session: AgentSession, choices) -> dict:
    """reset_tools: the final state of every switchable group open to the session's agent. All or nothing."""
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
    before = set(session.active_groups)
    after = [name for name in by_name if choices.get(name) is True]
    AgentSession.objects.for_tenant(session.tenant_id).filter(pk=session.pk).update(active_groups=after)
    session.active_groups = after
    activated = [name for name in after if name not in before]
    return {
        "active_groups": after,
        "activated": activated,
        "deactivated": sorted(before & set(by_name) - set(after)),
        "notes": {name: by_name[name].notes for name in activated if by_name[name].notes},
    }


def meta_run(*, call: ToolCall, session: AgentSession) -> None:
    """Run a meta call that the dispatch step has moved to `running`, and settle it."""
    try:
        if call.tool_name == META_RESET_TOOLS:
            value = session_groups_reset(session=session, choices=call.effective_input)
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
