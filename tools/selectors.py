"""Reads: what a session's model may see, in the formats apps ask for; calls and their events for lists."""
import copy
from datetime import datetime

from django.core.cache import cache
from django.db.models import Count, DurationField, ExpressionWrapper, F, Sum

from .catalog import CatalogSnapshot, ExposedTool, GroupView, bound_values, catalog_snapshot, switchable_groups
from .meta import meta_tool, meta_tools
from .models import RESERVED_GROUP, AgentSession, BoundArgument, CallEvent, Tool, ToolCall
from .registry import RESERVED_TOOL_NAMES, meta_providers

FORMATS = ("openai", "anthropic", "mcp")


def groups_of(tenant) -> list[GroupView]:
    """The tenant's groups with the names of their enabled tools, from the catalog snapshot."""
    return catalog_snapshot(getattr(tenant, "pk", tenant)).groups


def loaded_skill_names(session: AgentSession) -> set[str]:
    """The skills this session loaded (`loaded_skills` entries name them)."""
    return {loaded["skill"] for loaded in session.loaded_skills or ()
            if isinstance(loaded, dict) and isinstance(loaded.get("skill"), str)}


def active_group_names(session: AgentSession, groups: list[GroupView]) -> list[str]:
    """basic, the operator-managed groups that are on, the session's own switchable choices, and the groups
    bound to the skills it loaded (for this session only)."""
    chosen = set(session.active_groups)
    skills = loaded_skill_names(session) if session.loaded_skills else ()
    return [
        group.name for group in groups
        if group.name == RESERVED_GROUP
        or (not group.switchable and group.default_active)
        or (group.switchable and group.name in chosen)
        or (group.skill_ref and group.skill_ref in skills)
    ]


def bindings_for(tenant, agent: str, tool_ids) -> dict[int, dict]:
    """Bound values per tool for this agent: an agent-specific binding beats the tenant-wide one."""
    rows: dict[int, list] = {}
    for tool_id, binding_agent, name, value in BoundArgument.objects.for_tenant(tenant).filter(
            tool_id__in=list(tool_ids), agent__in=["", agent]).values_list("tool_id", "agent", "name", "value"):
        rows.setdefault(tool_id, []).append((binding_agent, name, value))
    return {tool_id: bound_values(bindings, agent) for tool_id, bindings in rows.items()}


def exposed_schema(schema: dict, bound_names) -> dict:
    """The tool's schema without the bound arguments, neither as properties nor as required."""
    exposed = copy.deepcopy(schema) if schema else {"type": "object", "properties": {}}
    exposed.setdefault("type", "object")
    properties = exposed.setdefault("properties", {})
    for name in bound_names:
        properties.pop(name, None)
    if "required" in exposed:
        exposed["required"] = [name for name in exposed["required"] if name not in bound_names]
        if not exposed["required"]:
            del exposed["required"]
    return exposed


def tool_annotations(tool: Tool) -> dict:
    return {
        "readOnlyHint": tool.read_only,
        "destructiveHint": tool.destructive,
        "idempotentHint": tool.idempotent,
    }


def _expose(catalog: CatalogSnapshot, tool: Tool, agent: str) -> ExposedTool:
    bound = catalog.bound_values(tool, agent)
    return ExposedTool(name=tool.name, description=tool.description, tool=tool, bound=bound, catalog=catalog,
                       schema=exposed_schema(tool.input_schema, bound.keys()), annotations=tool_annotations(tool))


def visible_tools(session: AgentSession) -> list[ExposedTool]:
    catalog = catalog_snapshot(session.tenant_id)
    active = set(active_group_names(session, catalog.groups))
    names = sorted({name for group in catalog.groups if group.name in active for name in group.tool_names})
    return [_expose(catalog, catalog.tools[name], session.agent) for name in names] + meta_tools(catalog, session)


def visible_tool(session: AgentSession, name: str) -> ExposedTool | None:
    """One tool as this session's model sees it, or None when it is not visible now."""
    catalog = catalog_snapshot(session.tenant_id)
    if name in RESERVED_TOOL_NAMES:
        return meta_tool(catalog, session, name)
    tool = catalog.tools.get(name)
    if tool is None or not active_group_names(session, catalog.groups_of_tool.get(name, [])):
        return None
    return _expose(catalog, tool, session.agent)


def format_tool(exposed: ExposedTool, fmt: str) -> dict:
    if fmt == "openai":
        return {"type": "function", "function": {
            "name": exposed.name, "description": exposed.description, "parameters": exposed.schema}}
    if fmt == "anthropic":
        return {"name": exposed.name, "description": exposed.description, "input_schema": exposed.schema}
    return {"name": exposed.name, "description": exposed.description, "inputSchema": exposed.schema,
            "annotations": exposed.annotations}


def session_tools(session: AgentSession, fmt: str) -> list[dict]:
    return [format_tool(exposed, fmt) for exposed in visible_tools(session)]


def session_prompt(session: AgentSession) -> str:
    groups = groups_of(session.tenant)
    active = set(active_group_names(session, groups))
    sections = []
    for group in groups:
        if group.name in active and group.notes.strip():
            sections.append(f"## {group.name}\n{group.notes.strip()}")
    switchable = switchable_groups(groups)
    if switchable:
        lines = [f"- {g.name}{' (active)' if g.name in active else ''}: {g.description}" for g in switchable]
        sections.append("## Optional tool groups\nActivate them with reset_tools.\n" + "\n".join(lines))
    sections += [section for provider in meta_providers() if (section := provider.prompt_section(session))]
    return "\n\n".join(sections)


# A session heard from over /mcp/ within this many seconds counts as connected (a stateless transport has no
# connection to watch; a waiting call's request is heard from by its heartbeats, at most every 15 s).
MCP_PRESENCE_S = 120


def mcp_presence_key(session_id) -> str:
    return f"mcp:presence:{session_id}"


def mcp_presence(session_id) -> dict | None:
    """When the session was last heard from over /mcp/ and by which kind of client, if it was lately: read
    from the cache, which every server process shares in the distributed mode."""
    seen = cache.get(mcp_presence_key(session_id))
    if not isinstance(seen, dict):
        return None
    return {**seen, "at": datetime.fromisoformat(seen["at"])}


# JSON columns that list rows never show and that can be large: list pages leave them unread.
CALL_PAYLOADS = ("input", "effective_input", "decision", "result", "error")
SESSION_PAYLOADS = ("context", "state", "active_groups", "loaded_skills")
TOOL_PAYLOADS = ("input_schema", "output_schema")


def related(path: str, names) -> list[str]:
    """Field names of a related row (`call__session`, …), for `defer`."""
    return [f"{path}__{name}" for name in names]


def call_rows(calls):
    """Calls as list rows show them: with their session's agent and user, without their JSON payloads."""
    return calls.select_related("session").defer(*CALL_PAYLOADS, *related("session", SESSION_PAYLOADS))


def session_calls(session: AgentSession):
    return ToolCall.objects.for_tenant(session.tenant_id).filter(session=session).defer(*CALL_PAYLOADS)


def call_events(call: ToolCall, after: int = 0):
    return CallEvent.objects.for_tenant(call.tenant_id).filter(call=call, seq__gt=after).order_by("seq")


REPLAY_LIMIT = 5000  # stored events a stream sends a client that joins late


def call_events_since(*, tenant_id: int, after: int, session_id=None, call_id=None) -> list[dict]:
    """The stored events numbered above `after` of a session's calls or of one call, as streams send them."""
    events = CallEvent.objects.for_tenant(tenant_id).filter(seq__gt=after)
    if call_id is not None:
        events = events.filter(call_id=call_id)
    if session_id is not None:
        events = events.filter(call__session_id=session_id)
    events = events.order_by("call__created_at", "call_id", "seq").values(
        "call_id", "seq", "kind", "data", "at")[:REPLAY_LIMIT]
    return [{"call": str(e["call_id"]), "seq": e["seq"], "kind": e["kind"], "data": e["data"],
             "at": e["at"].isoformat()} for e in events]


def call_history_day(*, tenant, start, end) -> list[dict]:
    """Calls created in [start, end) grouped by tool and status, with their summed run time."""
    duration = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
    rows = (ToolCall.objects.for_tenant(tenant).filter(created_at__gte=start, created_at__lt=end)
            .values("tool_name", "status")
            .annotate(n=Count("id"), total=Sum(duration), timed=Count("finished_at")))
    return [{"tool_name": r["tool_name"], "status": r["status"], "n": r["n"], "timed": r["timed"],
             "total_ms": r["total"].total_seconds() * 1000 if r["total"] is not None else None} for r in rows]
