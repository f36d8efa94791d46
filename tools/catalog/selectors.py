"""Reads: what a session's model may see, in the formats apps ask for; calls and their events for lists."""
import copy
from dataclasses import dataclass
from datetime import datetime

from django.core.cache import cache
from django.db.models import Count, DurationField, ExpressionWrapper, F, Sum

from tenancy.models import ToolSurface
from tools.catalog.meta import enabled_tool_names, meta_tool, meta_tools, search_surface
from tools.catalog.registry import RESERVED_TOOL_NAMES, exposure_hidden, meta_providers
from tools.catalog.snapshot import (
    CatalogSnapshot,
    ExposedTool,
    GroupView,
    bound_values,
    catalog_snapshot,
    switchable_groups,
)
from tools.models import (
    RESERVED_GROUP,
    TERMINAL_STATUSES,
    AgentSession,
    BoundArgument,
    CallEvent,
    Tool,
    ToolCall,
    ToolSource,
)

FORMATS = ("openai", "anthropic", "mcp")


def groups_of(tenant) -> list[GroupView]:
    """The tenant's groups with the names of their enabled tools, from the catalog snapshot."""
    return catalog_snapshot(getattr(tenant, "pk", tenant)).groups


def loaded_skill_names(session: AgentSession) -> set[str]:
    """The skills this session loaded (`loaded_skills` entries name them)."""
    return {loaded["skill"] for loaded in session.loaded_skills or ()
            if isinstance(loaded, dict) and isinstance(loaded.get("skill"), str)}


def active_group_names(session: AgentSession, groups: list[GroupView], *, search: bool | None = None) -> list[str]:
    """basic, the operator-managed groups that are on, the session's own switchable choices, and the groups
    bound to the skills it loaded (for this session only); never a group limited to other agents. With the
    tool search (`search`, by default the tenant's `tool_surface`), operator-managed groups are not listed up
    front: their tools are found with search_tools and switched on one by one (docs/governance.md#tool-search)."""
    chosen = set(session.active_groups)
    skills = loaded_skill_names(session) if session.loaded_skills else ()
    managed_on = not (search_surface(session) if search is None else search)
    return [
        group.name for group in groups
        if group.open_to(session.agent) and (
            group.name == RESERVED_GROUP
            or (managed_on and not group.switchable and group.default_active)
            or (group.switchable and group.name in chosen)
            or (group.skill_ref and group.skill_ref in skills))
    ]


def reachable_group_names(session: AgentSession, groups: list[GroupView]) -> list[str]:
    """The groups whose tools this session may find with search_tools and switch on with enable_tools: those it
    has on, as it would with the whole surface listed, and the switchable ones open to its agent (it could switch
    them on with reset_tools anyway). Never an operator-managed group that is off, a group limited to other
    agents, or the group of a skill it has not loaded."""
    active = set(active_group_names(session, groups, search=False))
    switchable = {group.name for group in switchable_groups(groups, session.agent)}
    return [group.name for group in groups if group.name in active or group.name in switchable]


def reachable_tool_names(session: AgentSession, catalog: CatalogSnapshot) -> set[str]:
    """The enabled tools of the session's reachable groups (before the exposure filters)."""
    reachable = set(reachable_group_names(session, catalog.groups))
    return {name for group in catalog.groups if group.name in reachable for name in group.tool_names}


def _enabled_reachable(session: AgentSession, catalog: CatalogSnapshot) -> set[str]:
    """The tools the session switched on (enable_tools) that it may still reach: a tool whose group went off,
    was limited to other agents or lost it, and a disabled tool, leave the surface again."""
    enabled = enabled_tool_names(session)
    if not enabled:
        return set()
    return {name for name in enabled if name in catalog.tools
            and reachable_group_names(session, catalog.groups_of_tool.get(name, []))}


def default_group_names(groups: list[GroupView], agent: str, *, tenant=None) -> list[str]:
    """The switchable groups a new session of `agent` starts with: none when the tenant lists a new session the
    core and the tool search only."""
    if tenant is not None and getattr(tenant, "tool_surface", ToolSurface.FULL) == ToolSurface.SEARCH:
        return []
    return [g.name for g in switchable_groups(groups, agent) if g.default_active]


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


DECLARED_REPLACE = "replace"  # AgentSession.declared_mode: the declared tools are the whole surface


@dataclass
class DeclaredTool(ExposedTool):
    """A schema-only tool an app declared for its session or one request (`tools.catalog.declared`). Not a meta
    tool: the permission step decides its calls and the external step hands them back to the app. `tool` is an unsaved
    external Tool standing in for the declaration, so the rules never see the flags of a catalog namesake."""

    scope: str = "session"  # or "request"

    @property
    def is_meta(self) -> bool:
        return False

    @property
    def declaration(self) -> dict:
        """What its calls keep (ToolCall.declared_tool)."""
        return {"name": self.name, "description": self.description, "input_schema": self.schema, "scope": self.scope}


def declared_exposed(declaration: dict, scope: str) -> DeclaredTool:
    # Stored by tools.catalog.declared after its checks; a row edited elsewhere fails its calls as ToolMisconfigured.
    name, description, schema = declaration.get("name"), declaration.get("description"), declaration.get("input_schema")
    name, description = str(name), description if isinstance(description, str) else ""
    schema = schema if isinstance(schema, dict) else {}
    stand_in = Tool(name=name, description=description, input_schema=schema, source=ToolSource.EXTERNAL,
                    read_only=False, destructive=False, idempotent=False, trusted=False)
    return DeclaredTool(name=name, description=description, schema=schema, tool=stand_in, scope=scope)


def session_declared_tool(session: AgentSession, name: str) -> DeclaredTool | None:
    declaration = next((d for d in session.declared_tools if isinstance(d, dict) and d.get("name") == name), None)
    return None if declaration is None else declared_exposed(declaration, "session")


def _with_declared(session: AgentSession, listed: list[ExposedTool]) -> list[ExposedTool]:
    """`listed` and then the session's declared tools (a catalog namesake keeps its place), or these alone when
    they replace the surface; the exposure filters hide declared tools as they hide catalog ones."""
    taken = {exposed.name for exposed in listed}
    declared = [declared_exposed(d, "session") for d in session.declared_tools
                if isinstance(d, dict) and isinstance(d.get("name"), str) and d["name"] not in taken]
    hidden = exposure_hidden(tenant=session.tenant, agent=session.agent, user=session.user,
                             user_verified=session.user_verified, names=[exposed.name for exposed in declared])
    return listed + [exposed for exposed in declared if exposed.name not in hidden]


def visible_tools(session: AgentSession, *, declared: bool = True) -> list[ExposedTool]:
    """The session's listed surface: the tools of its active groups that no exposure filter hides (a tool a deny
    rule always refuses it), then the meta tools, which no filter hides."""
    if declared and session.declared_tools:  # `declared=False`: the surface the app's declarations meet
        replacing = session.declared_mode == DECLARED_REPLACE
        return _with_declared(session, [] if replacing else visible_tools(session, declared=False))
    catalog = catalog_snapshot(session.tenant_id)
    active = set(active_group_names(session, catalog.groups))
    names = sorted({name for group in catalog.groups if group.name in active for name in group.tool_names}
                   | _enabled_reachable(session, catalog))
    hidden = exposure_hidden(tenant=session.tenant, agent=session.agent, user=session.user,
                             user_verified=session.user_verified, names=names)
    return [_expose(catalog, catalog.tools[name], session.agent) for name in names
            if name not in hidden] + meta_tools(catalog, session)


def visible_tool(session: AgentSession, name: str) -> ExposedTool | None:
    """One tool as this session's model sees it, or None when it is not visible now."""
    if session.declared_tools and session.declared_mode == DECLARED_REPLACE:
        return session_declared_tool(session, name)
    catalog = catalog_snapshot(session.tenant_id)
    if name in RESERVED_TOOL_NAMES:
        return meta_tool(catalog, session, name)
    tool = catalog.tools.get(name)
    if tool is None or not (active_group_names(session, catalog.groups_of_tool.get(name, []))
                            or name in _enabled_reachable(session, catalog)):
        return session_declared_tool(session, name) if session.declared_tools else None
    return _expose(catalog, tool, session.agent)


WITHHELD_WHY = "withheld: its MCP server changed its definition, which waits for an operator's review"


def withheld_from(session: AgentSession, name: str) -> bool:
    """Whether the session would see this tool but for its changed definition, which waits for an operator's review
    (so a call to it is told why, and a tool the session could never see stays unmentioned)."""
    catalog = catalog_snapshot(session.tenant_id)
    groups = catalog.withheld.get(name)
    if not groups or not active_group_names(session, groups):
        return False
    return name not in exposure_hidden(tenant=session.tenant, agent=session.agent, user=session.user,
                                       user_verified=session.user_verified, names=[name])


@dataclass(frozen=True)
class SurfacePreview:
    """The surface a new session of an agent (and user) is shown, and why each other enabled tool is not."""
    agent: str
    user: str
    active_groups: list[str]
    shown: list[str]  # as listed: catalog tools, then meta tools
    hidden: list[tuple[str, str]]  # (tool, why), by name


def _group_state(group: GroupView) -> str:
    if group.skill_ref:
        return f"on once the skill {group.skill_ref} is loaded"
    if group.switchable:
        return "off until the model switches it on"
    return "off (operator-managed)"


def _not_listed_why(groups: list[GroupView], agent: str) -> str:
    if not groups:
        return "in no group"
    open_groups = [g for g in groups if g.open_to(agent)]
    if not open_groups:
        return "its groups are limited to other agents: " + ", ".join(g.name for g in groups)
    return "not in an active group: " + ", ".join(f"{g.name} ({_group_state(g)})" for g in open_groups)


def new_session_of(tenant, agent: str, user: str = "") -> AgentSession:
    """A session of `agent` and `user` as it would start (not saved): for seeing what it would be shown."""
    return AgentSession(tenant=tenant, agent=agent, user=user,
                        active_groups=default_group_names(catalog_snapshot(tenant.pk).groups, agent, tenant=tenant))


def surface_preview(tenant, agent: str, user: str = "") -> SurfacePreview:
    """What a new session of `agent` and `user` is shown, by the code that shows it to real sessions."""
    catalog = catalog_snapshot(tenant.pk)
    session = new_session_of(tenant, agent, user)
    shown = [exposed.name for exposed in visible_tools(session)]
    active = set(active_group_names(session, catalog.groups))
    in_active = sorted({name for group in catalog.groups if group.name in active for name in group.tool_names})
    reachable = reachable_tool_names(session, catalog) if search_surface(session) else set()
    denied = exposure_hidden(tenant=tenant, agent=agent, user=user, names=sorted(set(in_active) | reachable))
    hidden = [(name, denied.get(name) or ("found with search_tools, then switched on with enable_tools"
                                          if name in reachable else
                                          _not_listed_why(catalog.groups_of_tool.get(name, []), agent)))
              for name in sorted(catalog.tools) if name not in shown]
    hidden = sorted(hidden + [(name, WITHHELD_WHY) for name in catalog.withheld])
    return SurfacePreview(agent=agent, user=user, active_groups=[g.name for g in catalog.groups if g.name in active],
                          shown=shown, hidden=hidden)


def format_tool(exposed: ExposedTool, fmt: str) -> dict:
    if fmt == "openai":
        return {"type": "function", "function": {
            "name": exposed.name, "description": exposed.description, "parameters": exposed.schema}}
    if fmt == "anthropic":
        return {"name": exposed.name, "description": exposed.description, "input_schema": exposed.schema}
    listed = {"name": exposed.name, "description": exposed.description, "inputSchema": exposed.schema,
              "annotations": exposed.annotations}
    if exposed.output_schema is not None:
        listed["outputSchema"] = exposed.output_schema
    return listed


def session_tools(session: AgentSession, fmt: str) -> list[dict]:
    return [format_tool(exposed, fmt) for exposed in visible_tools(session)]


def session_prompt(session: AgentSession) -> str:
    if session.declared_tools and session.declared_mode == DECLARED_REPLACE:
        return ""  # its groups, their notes and skills are off its surface; declared tools carry their descriptions
    groups = groups_of(session.tenant)
    active = set(active_group_names(session, groups))
    sections = []
    for group in groups:
        if group.name in active and group.notes.strip():
            sections.append(f"## {group.name}\n{group.notes.strip()}")
    switchable = switchable_groups(groups, session.agent)
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
CALL_PAYLOADS = ("input", "effective_input", "decision", "result", "unredacted_result", "error", "question")
SESSION_PAYLOADS = ("context", "state", "active_groups", "loaded_skills", "declared_tools")
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


def unfinished_calls(calls) -> int:
    """How many of these calls are not finished yet (waiting or running)."""
    return calls.exclude(status__in=TERMINAL_STATUSES).count()


def key_impact(api_key) -> dict:
    """What revoking an API key stops: the sessions opened with it, and their calls not finished yet."""
    sessions = AgentSession.objects.for_tenant(api_key.tenant_id).filter(api_key=api_key)
    return {"sessions": sessions.count(),
            "unfinished": unfinished_calls(ToolCall.objects.for_tenant(api_key.tenant_id).filter(session__in=sessions))}


def tool_impact(tool: Tool) -> dict:
    """What disabling a tool takes away: the groups that list it, and its calls not finished yet."""
    return {"groups": list(tool.groups.order_by("name").values_list("name", flat=True)),
            "unfinished": unfinished_calls(ToolCall.objects.for_tenant(tool.tenant_id).filter(tool=tool))}
