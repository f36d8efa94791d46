"""A per-process snapshot of each tenant's catalog: tools, groups and bound arguments.

Every call asks which tools its session may see. Rebuilding that from the database costs several
queries; the snapshot costs one (the tenant's catalog version) and is rebuilt only when a tool,
group or binding of the tenant changes — signals bump the version for every write, including the
Django admin's.
"""
import secrets
import threading
from dataclasses import dataclass, field

from django.db import IntegrityError, transaction

from tenancy.fastread import tenant_scalar

from .models import BoundArgument, CatalogVersion, Tool, ToolGroup
from .schemas import InputValidator


@dataclass(frozen=True)
class GroupView:
    id: int
    name: str
    description: str
    notes: str
    default_active: bool
    switchable: bool
    tool_names: tuple[str, ...]


@dataclass
class CatalogSnapshot:
    version: int
    groups: list[GroupView] = field(default_factory=list)
    tools: dict[str, Tool] = field(default_factory=dict)  # enabled tools by name
    groups_of_tool: dict[str, list[GroupView]] = field(default_factory=dict)
    bindings: dict[int, list[tuple[str, str, object]]] = field(default_factory=dict)  # tool id → (agent, name, value)
    validators: dict[tuple, InputValidator] = field(default_factory=dict)

    def bound_values(self, tool: Tool, agent: str) -> dict:
        """The tool's bound arguments for this agent: an agent-specific value beats the tenant-wide one."""
        values: dict = {}
        for binding_agent, name, value in sorted(self.bindings.get(tool.pk, ()), key=lambda b: b[0] != ""):
            if binding_agent in ("", agent):
                values[name] = value
        return values

    def validator(self, tool_name: str, bound_names, schema: dict) -> InputValidator:
        """The tool's input validator for `schema`, its schema without `bound_names`: compiled on first use,
        then kept as long as this version of the catalog."""
        key = (tool_name, frozenset(bound_names))
        validator = self.validators.get(key)
        if validator is None:
            validator = self.validators.setdefault(key, InputValidator(schema))
        return validator


def _load(tenant_id: int, version: int) -> CatalogSnapshot:
    snapshot = CatalogSnapshot(version=version)
    tools = {tool.pk: tool for tool in Tool.objects.for_tenant(tenant_id).filter(enabled=True)}
    snapshot.tools = {tool.name: tool for tool in tools.values()}
    members = ToolGroup.tools.through.objects.filter(toolgroup__tenant_id=tenant_id).values_list(
        "toolgroup_id", "tool_id")
    tool_ids_of_group: dict[int, list[int]] = {}
    for group_id, tool_id in members:
        tool_ids_of_group.setdefault(group_id, []).append(tool_id)
    for group in ToolGroup.objects.for_tenant(tenant_id).order_by("name"):
        names = tuple(sorted(tools[t].name for t in tool_ids_of_group.get(group.pk, ()) if t in tools))
        view = GroupView(id=group.pk, name=group.name, description=group.description, notes=group.notes,
                         default_active=group.default_active, switchable=group.switchable, tool_names=names)
        snapshot.groups.append(view)
        for name in names:
            snapshot.groups_of_tool.setdefault(name, []).append(view)
    for binding in BoundArgument.objects.for_tenant(tenant_id).filter(tool_id__in=list(tools)):
        snapshot.bindings.setdefault(binding.tool_id, []).append((binding.agent, binding.name, binding.value))
    return snapshot


_cache: dict[int, CatalogSnapshot] = {}
_lock = threading.Lock()


def catalog_version(tenant_id: int) -> int:
    return tenant_scalar(CatalogVersion, "version", tenant_id) or 0


def catalog_snapshot(tenant_id: int) -> CatalogSnapshot:
    version = catalog_version(tenant_id)
    snapshot = _cache.get(tenant_id)
    if snapshot is not None and snapshot.version == version:
        return snapshot
    snapshot = _load(tenant_id, version)
    with _lock:
        _cache[tenant_id] = snapshot
    return snapshot


def catalog_bump(tenant_id: int) -> None:
    """Mark the tenant's catalog changed (inside the caller's transaction). Random, never +1: a
    rolled-back change must not leave a snapshot behind under a number that will be reused."""
    version = secrets.randbits(62)
    if CatalogVersion.objects.for_tenant(tenant_id).update(version=version):
        return
    try:
        with transaction.atomic():
            CatalogVersion.objects.create(tenant_id=tenant_id, version=version)
    except IntegrityError:
        CatalogVersion.objects.for_tenant(tenant_id).update(version=version)


def bump_on_change(sender, instance, **kwargs) -> None:
    if kwargs.get("action", "post_")[:5] == "post_":  # m2m_changed fires before and after
        catalog_bump(instance.tenant_id)
