"""Reads: what a session's model may see, in the formats apps ask for."""
import copy
from dataclasses import dataclass, field

from django.db import connection

from .catalog import CatalogSnapshot, GroupView, catalog_snapshot
from .models import RESERVED_GROUP, AgentSession, BoundArgument, CallEvent, CallStatus, Tool, ToolCall
from .registry import META_RESET_TOOLS
from .schemas import InputValidator

FORMATS = ("openai", "anthropic", "mcp")


@dataclass
class ExposedTool:
    name: str
    description: str
    schema: dict  # as the model sees it: bound argument names removed
    tool: Tool | None = None  # None for meta tools
    bound: dict = field(default_factory=dict)  # name -> server value; never shown to the model
    annotations: dict = field(default_factory=dict)
    catalog: CatalogSnapshot | None = field(default=None, repr=False, compare=False)

    @property
    def is_meta(self) -> bool:
        return self.tool is None

    @property
    def validator(self) -> InputValidator:
        """`schema` compiled, once per catalog version (and set of bound names)."""
        if self.catalog is None:
            return InputValidator(self.schema)
        return self.catalog.validator(self.name, self.bound, self.schema)


def groups_of(tenant) -> list[GroupView]:
    """The tenant's groups with the names of their enabled tools, from the catalog snapshot."""
    return catalog_snapshot(getattr(tenant, "pk", tenant)).groups


def active_group_names(session: AgentSession, groups: list[GroupView]) -> list[str]:
    """basic, the operator-managed groups that are on, and the session's own switchable choices."""
    chosen = set(session.active_groups)
    return [
        group.name for group in groups
        if group.name == RESERVED_GROUP
        or (not group.switchable and group.default_active)
        or (group.switchable and group.name in chosen)
    ]


def switchable_groups(groups: list[GroupView]) -> list[GroupView]:
    return [g for g in groups if g.switchable and g.name != RESERVED_GROUP]


def bindings_for(tenant, agent: str, tool_ids) -> dict[int, dict]:
    """Bound values per tool for this agent: an agent-specific binding beats the tenant-wide one."""
    result: dict[int, dict] = {}
    rows = BoundArgument.objects.for_tenant(tenant).filter(tool_id__in=list(tool_ids), agent__in=["", agent])
    for binding in sorted(rows, key=lambda b: b.agent != ""):
        result.setdefault(binding.tool_id, {})[binding.name] = binding.value
    return result


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


def reset_tools_schema(groups: list[GroupView]) -> dict:
    return {
        "type": "object",
        "properties": {
            group.name: {"type": "boolean", "description": group.description or f"The {group.name} tools."}
            for group in groups
        },
        "additionalProperties": False,
    }


def _expose(catalog: CatalogSnapshot, tool: Tool, agent: str) -> ExposedTool:
    bound = catalog.bound_values(tool, agent)
    return ExposedTool(name=tool.name, description=tool.description, tool=tool, bound=bound, catalog=catalog,
                       schema=exposed_schema(tool.input_schema, bound.keys()), annotations=tool_annotations(tool))


def visible_tools(session: AgentSession) -> list[ExposedTool]:
    catalog = catalog_snapshot(session.tenant_id)
    active = set(active_group_names(session, catalog.groups))
    names = sorted({name for group in catalog.groups if group.name in active for name in group.tool_names})
    exposed = [_expose(catalog, catalog.tools[name], session.agent) for name in names]
    switchable = switchable_groups(catalog.groups)
    if switchable:
        exposed.append(ExposedTool(
            name=META_RESET_TOOLS,
            description=(
                "Choose which optional tool groups are active. Send the complete desired state: "
                "a group not set to true is deactivated. Returns the notes of newly activated groups."
            ),
            schema=reset_tools_schema(switchable), catalog=catalog,
            annotations={"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True},
        ))
    return exposed


def visible_tool(session: AgentSession, name: str) -> ExposedTool | None:
    """One tool as this session's model sees it, or None when it is not visible now."""
    if name == META_RESET_TOOLS:
        return next((exposed for exposed in visible_tools(session) if exposed.name == name), None)
    catalog = catalog_snapshot(session.tenant_id)
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
    return "\n\n".join(sections)


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


def call_history_day(*, tenant, start, end) -> list[dict]:
    """Calls created in [start, end) grouped by tool and status, with their summed run time."""
    from django.db.models import Count, DurationField, ExpressionWrapper, F, Sum

    duration = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
    rows = (ToolCall.objects.for_tenant(tenant).filter(created_at__gte=start, created_at__lt=end)
            .values("tool_name", "status")
            .annotate(n=Count("id"), total=Sum(duration), timed=Count("finished_at")))
    return [{"tool_name": r["tool_name"], "status": r["status"], "n": r["n"], "timed": r["timed"],
             "total_ms": r["total"].total_seconds() * 1000 if r["total"] is not None else None} for r in rows]


IN_FLIGHT_STATUSES = (CallStatus.RECEIVED, CallStatus.QUEUED, CallStatus.RUNNING)


def calls_in_flight(*, tenant, api_key=None) -> tuple[int, int]:
    """The tenant's calls received, queued or running, and how many of them are in sessions the key created.

    Checked on every submission, inside its transaction: one statement over the (tenant, status) index, in
    SQL of its own (the ORM's aggregate took over half a millisecond to build), reading only the calls in
    flight, which the limits keep few.
    """
    quote = connection.ops.quote_name
    call, session = ToolCall._meta, AgentSession._meta
    params: list = []
    key_count, join = "0", ""
    if api_key is not None:
        key_count = f"SUM(CASE WHEN s.{quote(session.get_field('api_key').column)} = %s THEN 1 ELSE 0 END)"
        join = (f" JOIN {quote(session.db_table)} s ON s.{quote(session.pk.column)} = "
                f"c.{quote(call.get_field('session').column)}")
        params.append(api_key.pk)
    sql = (f"SELECT COUNT(*), {key_count} FROM {quote(call.db_table)} c{join} "  # noqa: S608 (names from metadata)
           f"WHERE c.{quote(call.get_field('tenant').column)} = %s AND c.{quote(call.get_field('status').column)} "
           f"IN ({', '.join(['%s'] * len(IN_FLIGHT_STATUSES))})")
    params += [getattr(tenant, "pk", tenant), *IN_FLIGHT_STATUSES]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        tenant_count, key_in_flight = cursor.fetchone()
    return tenant_count, key_in_flight or 0
