"""Writes for the catalog, groups, bindings, sessions and calls."""
import logging
import re

from django.db import IntegrityError, connection, transaction
from rest_framework.exceptions import ValidationError

from audit.services import audit_record
from tenancy.limits import calls_admit
from tenancy.models import SYSTEM_AGENT, SYSTEM_AGENT_RESERVED, is_system_agent
from toolkeeper.api import Conflict

from .decorators import ToolError
from .events import call_transition
from .models import (
    RESERVED_GROUP,
    AgentSession,
    BoundArgument,
    CallStatus,
    Tool,
    ToolCall,
    ToolGroup,
    ToolSource,
)
from .registry import sources
from .results import interrupted_result
from .schemas import SchemaProblem, schema_check, tool_name_reserved
from .selectors import calls_in_flight, groups_of, switchable_groups
from .signals import call_cancelled

logger = logging.getLogger(__name__)

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
        schema_check(definition.input_schema)
    except SchemaProblem as exc:
        logger.error("tool %s (%s) not synced for tenant %s: its input schema %s",
                     definition.name, definition.source_ref or definition.source, tenant.pk, exc)
        return False
    return True


def tenant_seed_catalog(sender, tenant, **kwargs):
    ToolGroup.objects.get_or_create(
        tenant=tenant, name=RESERVED_GROUP,
        defaults={"description": "Always available.", "default_active": True, "switchable": False},
    )
    catalog_sync(tenant=tenant)


def catalog_sync_all(**kwargs):
    from tenancy.fastread import tables_exist
    from tenancy.models import Tenant

    if not tables_exist(Tenant, Tool, ToolGroup):
        return
    for tenant in Tenant.objects.all():
        catalog_sync(tenant=tenant)


def tool_update(*, tool: Tool, actor=None, **changes) -> Tool:
    allowed = {"enabled", "timeout_s", "description"}
    if tool.source != ToolSource.EXTERNAL:
        allowed -= {"description"}  # synced from the source
    unknown = set(changes) - allowed
    if unknown:
        raise ValidationError({name: ["cannot be changed for this tool"] for name in sorted(unknown)})
    if "timeout_s" in changes and not 0.1 <= float(changes["timeout_s"]) <= 86400:
        raise ValidationError({"timeout_s": ["between 0.1 and 86400 seconds"]})
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
    schema = None
    if not isinstance(input_schema, dict):
        errors["input_schema"] = ['a JSON Schema of type "object"']
    else:
        schema = {"type": "object", **input_schema}
        if "additionalProperties" not in schema and "unevaluatedProperties" not in schema:
            schema["additionalProperties"] = False  # the tool takes what it declares, nothing else
        try:
            schema_check(schema)
        except SchemaProblem as exc:
            errors["input_schema"] = [f"the schema {exc}"]
    if errors:
        raise ValidationError(errors)
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
        raise ValidationError({"name": [f"a group named {name!r} exists"]})


@transaction.atomic
def group_create(*, tenant, name: str, description: str = "", notes: str = "", default_active: bool = False,
                 switchable: bool = True, tools=(), actor=None) -> ToolGroup:
    _check_group_name(tenant, name)
    group = ToolGroup.objects.create(tenant=tenant, name=name, description=description, notes=notes,
                                     default_active=default_active, switchable=switchable)
    group.tools.set(tools)
    audit_record(tenant=tenant, actor=actor, verb="group.created", target=f"group:{name}",
                 data={"tools": sorted(t.name for t in tools)})
    return group


@transaction.atomic
def group_update(*, group: ToolGroup, actor=None, tools=None, **changes) -> ToolGroup:
    if group.is_reserved and ({"name", "switchable", "default_active"} & set(changes)):
        changed = {k for k in ("name", "switchable", "default_active") if k in changes
                   and changes[k] != getattr(group, k)}
        if changed:
            raise ValidationError({k: [f"the {RESERVED_GROUP} group is always active"] for k in sorted(changed)})
    if "name" in changes:
        _check_group_name(group.tenant, changes["name"], instance=group)
    for key, value in changes.items():
        setattr(group, key, value)
    group.save()
    if tools is not None:
        group.tools.set(tools)
    audit_record(tenant=group.tenant, actor=actor, verb="group.updated", target=f"group:{group.name}",
                 data={k: v for k, v in changes.items() if k != "notes"})
    return group


def group_delete(*, group: ToolGroup, actor=None) -> None:
    if group.is_reserved:
        raise ValidationError({"name": [f"the {RESERVED_GROUP} group cannot be deleted"]})
    audit_record(tenant=group.tenant, actor=actor, verb="group.deleted", target=f"group:{group.name}")
    group.delete()


# --- bound arguments ---------------------------------------------------------------------------

def binding_set(*, tenant, tool: Tool, name: str, value, agent: str = "", actor=None) -> BoundArgument:
    properties = (tool.input_schema or {}).get("properties", {})
    if properties and name not in properties:
        raise ValidationError({"name": [f"{tool.name} has no argument {name!r}"]})
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

def session_create(*, tenant, agent: str, user: str = "", context: dict | None = None, api_key=None) -> AgentSession:
    if api_key is not None and api_key.agent:
        if agent and agent != api_key.agent:
            raise ValidationError({"agent": [f"this API key is locked to the agent {api_key.agent!r}"]})
        agent = api_key.agent
    if not agent:
        raise ValidationError({"agent": ["This field is required."]})
    if is_system_agent(agent):
        raise ValidationError({"agent": [SYSTEM_AGENT_RESERVED]})
    default_groups = [g.name for g in groups_of(tenant) if g.switchable and g.default_active
                      and g.name != RESERVED_GROUP]
    session = AgentSession.objects.create(
        tenant=tenant, api_key=api_key, agent=agent, user=user, context=context or {}, active_groups=default_groups,
    )
    audit_record(tenant=tenant, actor=api_key and f"apikey:{api_key.name}", verb="session.created",
                 target=f"session:{session.pk}", data={"agent": agent, "user": user})
    return session


def session_groups_reset(*, session: AgentSession, choices) -> dict:
    """reset_tools: the final state of every switchable group. All or nothing."""
    groups = switchable_groups(groups_of(session.tenant))
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


# --- calls -------------------------------------------------------------------------------------

def _same_request(call: ToolCall, spec: dict) -> bool:
    return call.tool_name == spec["name"] and call.input == spec.get("input", {})


def _count_calls(session: AgentSession, added: int) -> int:
    """Add to the session's call counter in one statement; returns the new count."""
    meta = AgentSession._meta
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {quote(meta.db_table)} SET call_count = call_count + %s "  # noqa: S608 (identifiers from metadata)
            f"WHERE {quote(meta.pk.column)} = %s AND tenant_id = %s RETURNING call_count",
            [added, meta.pk.get_db_prep_value(session.pk, connection), session.tenant_id],
        )
        return cursor.fetchone()[0]


def _call_ids_taken(session: AgentSession, candidates: list[str]) -> set[str]:
    """Which of these call ids the session already has (one plain statement: this runs for every call)."""
    meta = ToolCall._meta
    quote = connection.ops.quote_name
    marks = ", ".join(["%s"] * len(candidates))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {quote('call_id')} FROM {quote(meta.db_table)} "  # noqa: S608 (identifiers from metadata)
            f"WHERE {quote('tenant_id')} = %s AND {quote('session_id')} = %s AND {quote('call_id')} IN ({marks})",
            [session.tenant_id, AgentSession._meta.pk.get_db_prep_value(session.pk, connection), *candidates],
        )
        return {row[0] for row in cursor.fetchall()}


def _free_call_ids(session: AgentSession, *, first: int, count: int, reserved: set) -> list[str]:
    """`call_<n>` ids from n = first on, skipping any the app already chose for itself."""
    ids: list[str] = []
    n = first
    while len(ids) < count:
        candidates = [f"call_{n + i}" for i in range(count - len(ids))]
        n += len(candidates)
        taken = _call_ids_taken(session, candidates) | reserved
        ids += [candidate for candidate in candidates if candidate not in taken]
    return ids


def calls_submit(*, session: AgentSession, calls: list[dict], api_key=None) -> list[ToolCall]:
    """Record and govern a batch of calls, in request order.

    Resending a call_id the session already has returns that call, not a second execution;
    reusing it for a different call is a conflict.
    """
    from .pipeline import CallContext, pipeline_run

    explicit = [spec["id"] for spec in calls if spec.get("id")]
    if len(explicit) != len(set(explicit)):
        raise ValidationError({"calls": ["call ids must be unique within a batch"]})
    with transaction.atomic():
        existing = {
            call.call_id: call
            for call in ToolCall.objects.for_tenant(session.tenant_id).filter(session=session, call_id__in=explicit)
        } if explicit else {}  # most calls name no id: skip building a query that cannot match
        for spec in calls:
            prior = existing.get(spec.get("id"))
            if prior is not None and not _same_request(prior, spec):
                raise Conflict(f"call id {spec['id']!r} was already used for a different call in this session")
        fresh = [spec for spec in calls if spec.get("id") not in existing]
        calls_admit(tenant=session.tenant, api_key=api_key, adding=len(fresh),
                    in_flight=lambda: calls_in_flight(tenant=session.tenant, api_key=api_key))
        base = _count_calls(session, len(fresh)) - len(fresh)
        generated = _free_call_ids(session, first=base + 1, count=sum(1 for spec in fresh if not spec.get("id")),
                                   reserved=set(explicit))
        results: list[ToolCall] = []
        created: list[ToolCall] = []
        for spec in calls:
            if spec.get("id") in existing:
                results.append(existing[spec["id"]])
                continue
            call = ToolCall(
                tenant=session.tenant, session=session, call_id=spec.get("id") or generated.pop(0),
                tool_name=spec["name"], input=spec.get("input", {}),
            )
            try:
                call.save(force_insert=True)
            except IntegrityError as exc:  # the whole batch rolls back with this error
                raise Conflict(f"call id {call.call_id!r} is already used in this session") from exc
            results.append(call)
            created.append(call)
        for call in created:
            audit_record(tenant=session.tenant, actor=api_key and f"apikey:{api_key.name}", verb="call.received",
                         target=f"call:{call.pk}", data={"tool": call.tool_name, "call_id": call.call_id})
            pipeline_run(CallContext(call=call, session=session))
    return results


def work_start(*, tenant, tool_name: str, arguments: dict, actor) -> ToolCall:
    """Operator-started work on a built-in tool (a large ingest, a report): a call in the tenant's system
    session, run by the executor like any other and streamed live, so its progress shows on its call page.
    Such tools belong to no group, so no model is ever offered them."""
    tool = Tool.objects.for_tenant(tenant).filter(name=tool_name, enabled=True).first()
    if tool is None:
        raise ValidationError({"tool": [f"{tool_name} is not available"]})
    label = str(getattr(actor, "username", actor or "system"))
    with transaction.atomic():
        session = AgentSession.objects.for_tenant(tenant).filter(agent=SYSTEM_AGENT, api_key=None).first() or \
            AgentSession.objects.create(tenant=tenant, agent=SYSTEM_AGENT, user="", context={"system": True})
        number = _count_calls(session, 1)
        call = ToolCall.objects.create(
            tenant=tenant, session=session, call_id=f"work_{number}", tool=tool, tool_name=tool.name,
            input={key: value for key, value in arguments.items() if key != "documents"} | (
                {"documents": f"{len(arguments['documents'])} documents"} if "documents" in arguments else {}),
            effective_input=arguments,
            decision={"behavior": "allow", "rule": None, "reason": f"work started by {label}"},
        )
        audit_record(tenant=tenant, actor=actor, verb="work.started", target=f"call:{call.pk}",
                     data={"tool": tool.name})
        if call_transition(call=call, from_statuses=[CallStatus.RECEIVED], to_status=CallStatus.QUEUED):
            from .executors import get_executor

            transaction.on_commit(lambda: get_executor().submit(call))
    return call


@transaction.atomic
def call_cancel(*, call: ToolCall, actor=None) -> ToolCall:
    """Stop a call: not yet started → cancelled; running → interrupted (the tool is told to stop)."""
    from .executors import get_executor

    not_started = [CallStatus.RECEIVED, CallStatus.QUEUED, CallStatus.AWAITING_APPROVAL,
                   CallStatus.AWAITING_EXTERNAL]
    moved = call_transition(
        call=call, from_statuses=not_started, to_status=CallStatus.CANCELLED,
        result=interrupted_result("cancelled before it ran"), cancel_requested=True,
    ) or call_transition(
        call=call, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.INTERRUPTED,
        result=interrupted_result("interrupted by a cancel request"), cancel_requested=True,
    )
    if not moved:
        call.refresh_from_db()
        raise Conflict(f"the call is already {call.status}")
    call_cancelled.send(sender=ToolCall, call=call)
    transaction.on_commit(lambda: get_executor().cancel(call.pk))
    audit_record(tenant=call.tenant, actor=actor, verb="call.cancelled", target=f"call:{call.pk}",
                 data={"status": call.status})
    return call
