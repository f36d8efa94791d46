"""Writes for the catalog, groups, bindings and sessions. Calls are submitted and cancelled in `tools.calls.submit`."""
import functools
import json
import logging
import re

from django.db import transaction

from audit.services import audit_record
from common.errors import ServiceError
from tenancy.fastread import tables_exist
from tenancy.models import SYSTEM_AGENT_RESERVED, Tenant, is_system_agent
from tools.catalog.meta import ENABLE_MAX, ENABLED_MAX, ENABLED_TOOLS, NAME_MAX, enabled_tool_names
from tools.catalog.registry import exposure_hidden, sources
from tools.catalog.schemas import (
    SchemaProblem,
    argument_problems,
    declared_object_schema,
    schema_check,
    tool_name_reserved,
)
from tools.catalog.selectors import default_group_names, groups_of, reachable_tool_names
from tools.catalog.snapshot import catalog_snapshot
from tools.models import RESERVED_GROUP, AgentSession, BoundArgument, Tool, ToolGroup, ToolSource

logger = logging.getLogger(__name__)

# Tools a tenant defines itself (not synced from a source): a source's tool of the same name leaves them be.
TENANT_DEFINED_SOURCES = (ToolSource.EXTERNAL, ToolSource.HTTP)
SYNCED_FIELDS = ("description", "input_schema", "output_schema", "source", "source_ref", "read_only", "trusted",
                 "destructive", "idempotent", "concurrency_safe", "timeout_s")


# --- catalog -----------------------------------------------------------------------------------

@transaction.atomic
def catalog_sync(*, tenant) -> list[Tool]:
    """Bring the tenant's catalog in line with what the registered sources offer."""
    existing = {tool.name: tool for tool in Tool.objects.for_tenant(tenant)}
    synced = []
    new_tools = []
    for source in sources():
        for definition in source.definitions(tenant):
            values = {name: getattr(definition, name) for name in SYNCED_FIELDS}
            tool = existing.get(definition.name)
            if tool is not None and tool.source in TENANT_DEFINED_SOURCES:
                # A plugin or server tool never takes over a tool the tenant defined under the same name.
                logger.error("tool %s (%s) not synced for tenant %s: the tenant defined a tool of that name",
                             definition.name, definition.source_ref or definition.source, tenant.pk)
                continue
            changed = tool is None or any(getattr(tool, k) != v for k, v in values.items())
            if changed and not _definition_usable(definition, tenant):
                continue
            if tool is None:
                tool = Tool.objects.create(tenant=tenant, name=definition.name, **values)
                new_tools.append((tool, definition.default_groups))
            elif changed:
                for key, value in values.items():
                    setattr(tool, key, value)
                tool.save()
            synced.append(tool)
    for tool, group_names in new_tools:
        for name in group_names:
            group, _ = ToolGroup.objects.get_or_create(
                tenant=tenant, name=name,
                defaults={"switchable": name != RESERVED_GROUP, "default_active": name == RESERVED_GROUP},
            )
            group.tools.add(tool)
    return synced


def _definition_usable(definition, tenant) -> bool:
    """A source's tool enters or changes the catalog only with a schema that passes the check; a broken one
    is logged and left out (a stored version stays as it was), so one bad tool does not stop the sync."""
    try:
        text = json.dumps(definition.input_schema, sort_keys=True)
    except (TypeError, ValueError):
        text = None  # not JSON at all: schema_check says why
    problem = _schema_problem(text) if text is not None else _schema_problem_of(definition.input_schema)
    if problem is not None:
        logger.error("tool %s (%s) not synced for tenant %s: its input schema %s",
                     definition.name, definition.source_ref or definition.source, tenant.pk, problem)
        return False
    return True


@functools.lru_cache(maxsize=1024)
def _schema_problem(schema_text: str) -> str | None:
    """Every new tenant syncs the same source schemas: checking one (the metaschema walk) costs more than
    the rest of seeding a tool, and its verdict depends on the schema alone."""
    return _schema_problem_of(json.loads(schema_text))


def _schema_problem_of(schema) -> str | None:
    try:
        schema_check(schema)
    except SchemaProblem as exc:
        return str(exc)
    return None


def tenant_seed_catalog(sender, tenant, **kwargs):
    ToolGroup.objects.get_or_create(
        tenant=tenant, name=RESERVED_GROUP,
        defaults={"description": "Always available.", "default_active": True, "switchable": False},
    )
    catalog_sync(tenant=tenant)


def catalog_sync_all(**kwargs):
    if not tables_exist(Tenant, Tool, ToolGroup):
        return
    # Only the columns every migration state has: after `migrate` back past a tenant setting, the model has a
    # field its table no longer has.
    for tenant in Tenant.objects.only("pk", "slug"):
        catalog_sync(tenant=tenant)


def tool_update(*, tool: Tool, actor=None, **changes) -> Tool:
    allowed = {"enabled", "timeout_s", "description", "retry_max", "retry_backoff_s", "max_result_chars"}
    if tool.source != ToolSource.EXTERNAL:
        allowed -= {"description"}  # synced from the source
    unknown = set(changes) - allowed
    if unknown:
        raise ServiceError({name: ["cannot be changed for this tool"] for name in sorted(unknown)})
    if "timeout_s" in changes and not 0.1 <= float(changes["timeout_s"]) <= 86400:
        raise ServiceError({"timeout_s": ["between 0.1 and 86400 seconds"]})
    # After-execution steps (tools.calls.aftercare): retries of transient errors, the tool's own result cap.
    bounds = {"retry_max": (0, 10, "between 0 and 10 retries"),
              "retry_backoff_s": (0, 300, "between 0 and 300 seconds"),
              "max_result_chars": (100, 10_000_000, "empty (the platform's cap) or 100 to 10,000,000 characters")}
    for name, (low, high, text) in bounds.items():
        if name not in changes or (changes[name] is None and name == "max_result_chars"):
            continue
        value = changes[name]
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not low <= value <= high or (name != "retry_backoff_s" and value != int(value)):
            raise ServiceError({name: [text]})
    if changes.get("retry_max") and not tool.idempotent:
        raise ServiceError({"retry_max": ["only an idempotent tool's calls are run again"]})
    if changes.get("enabled") and tool.source == ToolSource.MCP and tool.mcp_server_id is None:
        # Detached by a sync (its server no longer offers it, or is gone): nothing could run it.
        raise ServiceError({"enabled": ["its MCP server no longer offers this tool; a sync that finds it again "
                                        "enables it"]})
    for key, value in changes.items():
        setattr(tool, key, value)
    tool.save()
    audit_record(tenant=tool.tenant, actor=actor, verb="tool.updated", target=f"tool:{tool.name}", data=changes)
    return tool


def tool_external_create(*, tenant, name: str, description: str, input_schema: dict, read_only: bool = False,
                         destructive: bool = False, idempotent: bool = False, timeout_s: float = 30,
                         actor=None) -> Tool:
    """A schema-only tool: a person or an outside system performs its calls and posts the result."""
    errors = {}
    if not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name or ""):
        errors["name"] = ["1-64 letters, digits, '_' or '-'"]
    elif tool_name_reserved(name):
        errors["name"] = [f"{name!r} is reserved for a tool of the platform"]
    elif Tool.objects.for_tenant(tenant).filter(name=name).exists():
        errors["name"] = [f"a tool named {name!r} exists"]
    schema = declared_object_schema(input_schema, errors, "input_schema")
    if errors:
        raise ServiceError(errors)
    tool = Tool.objects.create(
        tenant=tenant, name=name, description=description, input_schema=schema,
        source=ToolSource.EXTERNAL, read_only=read_only, destructive=destructive, idempotent=idempotent,
        timeout_s=timeout_s, trusted=True,
    )
    audit_record(tenant=tenant, actor=actor, verb="tool.created", target=f"tool:{name}", data={"source": "external"})
    return tool


# --- groups ------------------------------------------------------------------------------------

def _check_group_name(tenant, name: str, instance=None) -> None:
    clash = ToolGroup.objects.for_tenant(tenant).filter(name=name)
    if instance is not None:
        clash = clash.exclude(pk=instance.pk)
    if clash.exists():
        raise ServiceError({"name": [f"a group named {name!r} exists"]})


GROUP_AGENTS_MAX = 100
AGENT_NAME_MAX = 100  # as long as a session's agent may be


def _checked_group_agents(name: str, agents) -> list[str]:
    """The agents a group is limited to, checked: names a session could have, each once, never for basic."""
    if not isinstance(agents, list) or not all(isinstance(agent, str) for agent in agents):
        raise ServiceError({"agents": ["a list of agent names"]})
    agents = list(dict.fromkeys(agents))
    if not agents:
        return []
    if name == RESERVED_GROUP:
        raise ServiceError({"agents": [f"the {RESERVED_GROUP} group is open to every agent"]})
    problems = []
    if len(agents) > GROUP_AGENTS_MAX:
        problems.append(f"at most {GROUP_AGENTS_MAX} agents")
    if any(not agent.strip() or len(agent) > AGENT_NAME_MAX for agent in agents):
        problems.append(f"each name 1-{AGENT_NAME_MAX} characters")
    if any(is_system_agent(agent) for agent in agents):
        problems.append(SYSTEM_AGENT_RESERVED)
    if problems:
        raise ServiceError({"agents": problems})
    return agents


@transaction.atomic
def group_create(*, tenant, name: str, description: str = "", notes: str = "", default_active: bool = False,
                 switchable: bool = True, tools=(), actor=None, skill_ref: str = "", agents=None) -> ToolGroup:
    _check_group_name(tenant, name)
    agents = _checked_group_agents(name, agents or [])
    group = ToolGroup.objects.create(tenant=tenant, name=name, description=description, notes=notes,
                                     default_active=default_active, switchable=switchable, skill_ref=skill_ref,
                                     agents=agents)
    group.tools.set(tools)
    audit_record(tenant=tenant, actor=actor, verb="group.created", target=f"group:{name}",
                 data={"tools": sorted(t.name for t in tools), **({"agents": agents} if agents else {})})
    return group


@transaction.atomic
def group_update(*, group: ToolGroup, actor=None, tools=None, **changes) -> ToolGroup:
    if group.is_reserved and ({"name", "switchable", "default_active"} & set(changes)):
        changed = {k for k in ("name", "switchable", "default_active") if k in changes
                   and changes[k] != getattr(group, k)}
        if changed:
            raise ServiceError({k: [f"the {RESERVED_GROUP} group is always active"] for k in sorted(changed)})
    if "name" in changes:
        _check_group_name(group.tenant, changes["name"], instance=group)
    if "agents" in changes:
        changes["agents"] = _checked_group_agents(changes.get("name", group.name), changes["agents"])
    for key, value in changes.items():
        setattr(group, key, value)
    group.save()
    if tools is not None:
        group.tools.set(tools)
    audit_record(tenant=group.tenant, actor=actor, verb="group.updated", target=f"group:{group.name}",
                 data={k: v for k, v in changes.items() if k != "notes"})
    return group


GROUP_ADD_AUDITED = 50  # tool names an audit entry lists; the count is always there


def group_tools_add(*, group: ToolGroup, tools, actor=None) -> list[Tool]:
    """Add tools to a group (from a tool's or an MCP server's page, or as a server's tools join); those in it
    already stay as they are. The tools added, in one audit entry."""
    tools = list(tools)
    if any(tool.tenant_id != group.tenant_id for tool in tools):
        raise ServiceError({"tools": ["a tool of another tenant"]})
    present = set(group.tools.values_list("pk", flat=True))
    added = sorted({tool.pk: tool for tool in tools if tool.pk not in present}.values(), key=lambda tool: tool.name)
    if added:
        group.tools.add(*added)
        audit_record(tenant=group.tenant, actor=actor, verb="group.tools_added", target=f"group:{group.name}",
                     data={"count": len(added), "tools": [tool.name for tool in added[:GROUP_ADD_AUDITED]]})
    return added


def group_delete(*, group: ToolGroup, actor=None) -> None:
    if group.is_reserved:
        raise ServiceError({"name": [f"the {RESERVED_GROUP} group cannot be deleted"]})
    audit_record(tenant=group.tenant, actor=actor, verb="group.deleted", target=f"group:{group.name}")
    group.delete()


# --- bound arguments ---------------------------------------------------------------------------

def binding_set(*, tenant, tool: Tool, name: str, value, agent: str = "", actor=None) -> BoundArgument:
    properties = (tool.input_schema or {}).get("properties", {})
    if properties and name not in properties:
        raise ServiceError({"name": [f"{tool.name} has no argument {name!r}"]})
    if properties:
        # A value the schema refuses would fail every call of the tool, on an argument the model cannot see.
        problems = argument_problems(tool.input_schema, name, value)
        if problems:
            raise ServiceError({"value": [f"{tool.name} refuses it: {problem}" for problem in problems]})
    binding, _ = BoundArgument.objects.update_or_create(
        tenant=tenant, tool=tool, agent=agent, name=name, defaults={"value": value},
    )
    audit_record(tenant=tenant, actor=actor, verb="binding.set", target=f"tool:{tool.name}",
                 data={"name": name, "agent": agent})  # values can be secrets: not in the log
    return binding


def binding_delete(*, binding: BoundArgument, actor=None) -> None:
    audit_record(tenant=binding.tenant, actor=actor, verb="binding.deleted", target=f"tool:{binding.tool.name}",
                 data={"name": binding.name, "agent": binding.agent})
    binding.delete()


# --- sessions ----------------------------------------------------------------------------------

def session_create(*, tenant, agent: str, user: str = "", user_verified: bool = False, context: dict | None = None,
                   api_key=None, person=None) -> AgentSession:
    """`person`: the verified user's account here, if they have one (whose upstream accounts the calls use)."""
    if api_key is not None and api_key.agent:
        if agent and agent != api_key.agent:
            raise ServiceError({"agent": [f"this API key is locked to the agent {api_key.agent!r}"]})
        agent = api_key.agent
    if not agent:
        raise ServiceError({"agent": ["This field is required."]})
    if is_system_agent(agent):
        raise ServiceError({"agent": [SYSTEM_AGENT_RESERVED]})
    default_groups = default_group_names(groups_of(tenant), agent, tenant=tenant)
    session = AgentSession.objects.create(
        tenant=tenant, api_key=api_key, agent=agent, user=user, user_verified=user_verified, context=context or {},
        active_groups=default_groups, person=person if user_verified else None,
    )
    audit_record(tenant=tenant, actor=api_key and f"apikey:{api_key.name}", verb="session.created",
                 target=f"session:{session.pk}", data={"agent": agent, "user": user, "user_verified": user_verified})
    return session


def session_todos_replace(*, session: AgentSession, todos: list[dict]) -> list[dict]:
    with transaction.atomic():
        current = AgentSession.objects.for_tenant(session.tenant_id).select_for_update().get(pk=session.pk)
        current.state = {**current.state, "todos": todos}
        current.save(update_fields=["state"])
    session.state = current.state
    return todos


def session_note_append(*, session: AgentSession, text: str) -> list[str]:
    with transaction.atomic():
        current = AgentSession.objects.for_tenant(session.tenant_id).select_for_update().get(pk=session.pk)
        notes = [*current.state.get("notes", []), text]
        current.state = {**current.state, "notes": notes}
        current.save(update_fields=["state"])
    session.state = current.state
    return notes


def session_tools_enable(*, session: AgentSession, names) -> dict:
    """enable_tools: switch these tools on for this session only (docs/governance.md#tool-search). Each must be
    one the session may find with search_tools; all or nothing. A name it may not find is refused as a missing
    one is, so the answer never tells a hidden tool from none."""
    if (not isinstance(names, list) or not 1 <= len(names) <= ENABLE_MAX
            or not all(isinstance(name, str) and 0 < len(name) <= NAME_MAX for name in names)):
        raise ServiceError({"names": [f"a list of 1 to {ENABLE_MAX} tool names"]})
    names = list(dict.fromkeys(names))
    catalog = catalog_snapshot(session.tenant_id)
    reachable = reachable_tool_names(session, catalog)
    candidates = [name for name in names if name in reachable]
    hidden = exposure_hidden(tenant=session.tenant, agent=session.agent, user=session.user,
                             user_verified=session.user_verified, names=candidates)
    unknown = [name for name in names if name not in reachable or name in hidden]
    if unknown:
        raise ServiceError(f"no tool to switch on is named {', '.join(map(repr, unknown))}; find tools with "
                           "search_tools. Nothing was changed.")
    with transaction.atomic():
        current = AgentSession.objects.for_tenant(session.tenant_id).select_for_update().get(pk=session.pk)
        before = enabled_tool_names(current)
        # names that left the session's reach since it switched them on make room
        kept = [name for name in before if name in reachable]
        added = [name for name in names if name not in kept]
        if len(kept) + len(added) > ENABLED_MAX:
            raise ServiceError(f"a session may switch on at most {ENABLED_MAX} tools; it has {len(kept)}. "
                               "Nothing was changed.")
        current.state = {**(current.state if isinstance(current.state, dict) else {}), ENABLED_TOOLS: kept + added}
        current.save(update_fields=["state"])
    session.state = current.state
    return {"enabled": added, "already_enabled": [name for name in names if name not in added]}
