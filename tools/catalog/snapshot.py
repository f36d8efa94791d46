"""A per-process snapshot of each tenant's catalog: tools, groups and bound arguments.

Every call asks which tools its session may see. Rebuilding that from the database costs several
queries; the snapshot costs one (the tenant's catalog version, `tenancy.versions`) and is rebuilt only
when a tool, group or binding of the tenant changes — signals bump the version for every write,
including the Django admin's. Also the one rule of which bound value wins (`bound_values`) and what a
tool looks like on a session's surface (`ExposedTool`).
"""
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db import transaction

from realtime.broadcast import publish
from realtime.groups import surface_group
from tenancy.versions import VersionedCache, version_bump
from tools.catalog.schemas import InputValidator, ToolMisconfigured
from tools.models import RESERVED_GROUP, BoundArgument, CatalogVersion, Tool, ToolGroup, ToolSource


@dataclass(frozen=True)
class GroupView:
    id: int
    name: str
    description: str
    notes: str
    default_active: bool
    switchable: bool
    tool_names: tuple[str, ...]
    skill_ref: str = ""  # the skill whose loading switches the group on, for that session
    agents: frozenset[str] = frozenset()  # the agents it is limited to; empty: every agent

    def open_to(self, agent: str) -> bool:
        return not self.agents or agent in self.agents


def switchable_groups(groups: list[GroupView], agent: str) -> list[GroupView]:
    """The groups a session of `agent` may switch on and off itself (with `reset_tools`)."""
    return [g for g in groups if g.switchable and g.name != RESERVED_GROUP and g.open_to(agent)]


def group_agents(group: ToolGroup) -> frozenset[str]:
    """The agents a stored group is limited to. `basic` never is, whatever its row says (the Django admin
    could store anything there); an entry that is no name stays in the set, where it matches no agent."""
    agents = group.agents if isinstance(group.agents, list) and group.name != RESERVED_GROUP else ()
    return frozenset(agent if isinstance(agent, str) else "" for agent in agents)


def bound_values(bindings: Iterable[tuple[str, str, object]], agent: str) -> dict:
    """The bound arguments that apply to `agent`, from (agent, name, value) bindings of one tool: an
    agent-specific value beats the tenant-wide one (agent "")."""
    values: dict = {}
    for binding_agent, name, value in sorted(bindings, key=lambda b: b[0] != ""):
        if binding_agent in ("", agent):
            values[name] = value
    return values


@dataclass
class CatalogSnapshot:
    version: int
    groups: list[GroupView] = field(default_factory=list)
    tools: dict[str, Tool] = field(default_factory=dict)  # enabled tools by name
    # enabled tools withheld while their changed definition waits for review, with the groups that hold them
    withheld: dict[str, list[GroupView]] = field(default_factory=dict)
    groups_of_tool: dict[str, list[GroupView]] = field(default_factory=dict)
    bindings: dict[int, list[tuple[str, str, object]]] = field(default_factory=dict)  # tool id → (agent, name, value)
    validators: dict[tuple, InputValidator] = field(default_factory=dict)

    def bound_values(self, tool: Tool, agent: str) -> dict:
        return bound_values(self.bindings.get(tool.pk, ()), agent)

    def validator(self, tool_name: str, bound_names, schema: dict, *, per_schema: bool = False) -> InputValidator:
        """The tool's input validator for `schema`, its schema without `bound_names`: compiled on first use,
        then kept as long as this version of the catalog. A meta tool's schema differs between sessions
        (`reset_tools` offers only the groups open to the agent, `load_skill_through_path` only its skills), so
        its validators are kept per schema (`per_schema`)."""
        key = (tool_name, frozenset(bound_names), json.dumps(schema, sort_keys=True) if per_schema else None)
        validator = self.validators.get(key)
        if validator is None:
            validator = self.validators.setdefault(key, InputValidator(schema))
        return validator


@dataclass
class ExposedTool:
    """A tool as one session's model sees it."""
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
    def output_schema(self) -> dict | None:
        """The tool's declared output schema, when it is one MCP can carry (an object schema); None otherwise."""
        schema = self.tool.output_schema if self.tool is not None else None
        return schema if isinstance(schema, dict) and schema.get("type") == "object" else None

    def output_problems(self, structured) -> list[str]:
        """Why `structured` (a result's structured part) does not match the declared output schema; [] when it
        does or there is none. The schema is compiled once per catalog version."""
        schema = self.output_schema
        if schema is None:
            return []
        if not isinstance(structured, dict):
            return ["the result has no structured content"]
        validator = (InputValidator(schema) if self.catalog is None
                     else self.catalog.validator(f"{self.name}#output", (), schema))
        try:
            return validator.errors(structured)
        except ToolMisconfigured:  # a schema the catalog's checks refused, or one that does not resolve
            return ["the declared output schema is not usable"]

    @property
    def validator(self) -> InputValidator:
        """`schema` compiled, once per catalog version (and set of bound names)."""
        if self.catalog is None:
            return InputValidator(self.schema)
        return self.catalog.validator(self.name, self.bound, self.schema, per_schema=self.is_meta)


def _load(tenant_id: int, version: int) -> CatalogSnapshot:
    snapshot = CatalogSnapshot(version=version)
    # The tools of a disabled MCP server leave the surface with it (their rows stay as they are). A tool whose
    # server was deleted is disabled by the sync side; if one is not, its source refuses the call.
    # A tool whose changed definition waits for review is withheld (tools.upstream.definitions).
    tools = {tool.pk: tool for tool in Tool.objects.for_tenant(tenant_id).filter(enabled=True).exclude(
        source=ToolSource.MCP, mcp_server__enabled=False).defer("pinned", "proposed")}
    withheld = {pk: tools.pop(pk) for pk in [pk for pk, tool in tools.items() if tool.proposed_hash]}
    snapshot.tools = {tool.name: tool for tool in tools.values()}
    snapshot.withheld = {tool.name: [] for tool in withheld.values()}
    members = ToolGroup.tools.through.objects.filter(toolgroup__tenant_id=tenant_id).values_list(
        "toolgroup_id", "tool_id")
    tool_ids_of_group: dict[int, list[int]] = {}
    for group_id, tool_id in members:
        tool_ids_of_group.setdefault(group_id, []).append(tool_id)
    for group in ToolGroup.objects.for_tenant(tenant_id).order_by("name"):
        names = tuple(sorted(tools[t].name for t in tool_ids_of_group.get(group.pk, ()) if t in tools))
        view = GroupView(id=group.pk, name=group.name, description=group.description, notes=group.notes,
                         default_active=group.default_active, switchable=group.switchable, tool_names=names,
                         skill_ref=group.skill_ref, agents=group_agents(group))
        snapshot.groups.append(view)
        for name in names:
            snapshot.groups_of_tool.setdefault(name, []).append(view)
        for tool_id in tool_ids_of_group.get(group.pk, ()):
            if tool_id in withheld:
                snapshot.withheld[withheld[tool_id].name].append(view)
    for binding in BoundArgument.objects.for_tenant(tenant_id).filter(tool_id__in=list(tools)):
        snapshot.bindings.setdefault(binding.tool_id, []).append((binding.agent, binding.name, binding.value))
    return snapshot


_snapshots: VersionedCache[CatalogSnapshot] = VersionedCache(CatalogVersion)


def catalog_snapshot(tenant_id: int) -> CatalogSnapshot:
    return _snapshots.get(tenant_id, _load)


def catalog_bump(tenant_id: int) -> None:
    """Mark the tenant's catalog changed (inside the caller's transaction)."""
    version_bump(CatalogVersion, tenant_id)


def bump_on_change(sender, instance, **kwargs) -> None:
    if kwargs.get("action", "post_")[:5] == "post_":  # m2m_changed fires before and after
        catalog_bump(instance.tenant_id)


class _Announcement:
    """One announcement waiting for its transaction to commit (`surface_announce`)."""

    def __init__(self, tenant_id: int, session: str):
        self.key = (tenant_id, session)

    def __call__(self) -> None:
        publish([surface_group(self.key[0])], {"type": "surface.changed", "session": self.key[1]})


def surface_announce(tenant_id: int, session_id=None) -> None:
    """After commit, tell the tenant's MCP notification streams that what its sessions may see may have changed
    (its catalog, its rules; with `session_id`, that session's active groups or skills). Each stream compares
    its session's surface before and after, and tells its client only of a real change (docs/mcp.md). A write of
    many rows (a sync adding tools) announces once: the same announcement already waiting for the same
    savepoints is not added again."""
    announcement = _Announcement(tenant_id, "" if session_id is None else str(session_id))
    connection = transaction.get_connection()
    if connection.in_atomic_block:
        # an atomic block without a savepoint (None) rolls back with the block around it
        savepoints = set(connection.savepoint_ids) - {None}
        if any(isinstance(func, _Announcement) and func.key == announcement.key and sids - {None} == savepoints
               for sids, func, *_ in connection.run_on_commit):
            return
    transaction.on_commit(announcement)


def announce_on_bump(sender, tenant_id: int, **kwargs) -> None:
    surface_announce(tenant_id)
