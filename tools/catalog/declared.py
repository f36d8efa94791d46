"""Request-scoped tools: schema-only tools an app declares for its session or for one request of calls.

A declaration is `{"name", "description", "input_schema"}` (`parameters` is taken for `input_schema`, and an
OpenAI-style `{"type": "function", "function": {...}}` for the declaration inside it). Mode "add" puts the
declared tools beside the session's surface, and may not take the name of a tool already on it, so an app
never shadows a governed tool; mode "replace" makes them the whole surface (no catalog tools, no meta tools).
Session declarations live on the session (`AgentSession.declared_tools`, `declared_mode`) and are shown by
`tools.catalog.selectors`; a request's apply to the calls of that request only, each of which keeps the declaration
it was made with (`ToolCall.declared_tool`), so approval, resume and the result post still know it.

Their calls run the whole chain: the permission step decides them by name like any tool, and the external
step leaves them `awaiting_external` for the app to post the result.
"""
import json
import re
from dataclasses import dataclass

from django.db import transaction

from audit.services import audit_record
from common.errors import ServiceError
from common.json_values import json_problem
from tools.catalog.schemas import declared_object_schema, tool_name_reserved
from tools.catalog.selectors import (
    DECLARED_REPLACE,
    declared_exposed,
    session_declared_tool,
    visible_tool,
    visible_tools,
)
from tools.catalog.services import session_create
from tools.catalog.snapshot import ExposedTool, surface_announce
from tools.models import AgentSession, ToolCall

DECLARED_ADD = "add"
MODES = (DECLARED_ADD, DECLARED_REPLACE)
DECLARED_MAX = 64  # tools in one declaration list
DESCRIPTION_MAX = 4000
DECLARATIONS_MAX_BYTES = 256 * 1024  # all of one list, as compact JSON: a session's row is read by every call
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_KEYS = frozenset({"name", "description", "input_schema", "parameters"})


@dataclass(frozen=True)
class Declarations:
    """One request's declared tools by name, and how they meet the session's surface."""

    tools: dict[str, dict]
    mode: str

    def declared_tool(self, name: str) -> dict | None:
        """What a call of `name` in this request keeps (ToolCall.declared_tool); None when it is not declared."""
        declaration = self.tools.get(name)
        return None if declaration is None else {**declaration, "scope": "request"}


def _schema(value, errors: dict, where: str) -> dict | None:
    return declared_object_schema({"properties": {}} if value is None else value, errors, where)


def _declaration(item, where: str, errors: dict, seen: set) -> dict | None:
    if isinstance(item, dict) and item.get("type") == "function" and isinstance(item.get("function"), dict):
        item = item["function"]  # an OpenAI-style tool
    if not isinstance(item, dict):
        errors[where] = ['a tool declaration: {"name", "description", "input_schema"}']
        return None
    unknown = sorted(str(key) for key in item if key not in _KEYS)
    if unknown:
        errors[where] = [f"unknown keys: {', '.join(unknown)} (a declaration has name, description, input_schema)"]
    name = item.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        errors[f"{where}.name"] = ["1-64 letters, digits, '_' or '-'"]
    elif tool_name_reserved(name):
        errors[f"{where}.name"] = [f"{name!r} is reserved for a tool of the platform"]
    elif name in seen:
        errors[f"{where}.name"] = [f"{name!r} is declared twice"]
    else:
        seen.add(name)
    description = item.get("description", "")
    if not isinstance(description, str) or len(description) > DESCRIPTION_MAX:
        errors[f"{where}.description"] = [f"text of at most {DESCRIPTION_MAX} characters"]
    if "input_schema" in item and "parameters" in item:
        errors[f"{where}.input_schema"] = ["send input_schema or parameters, not both"]
        return None
    schema = _schema(item.get("input_schema", item.get("parameters")), errors, f"{where}.input_schema")
    if schema is None or f"{where}.name" in errors or f"{where}.description" in errors or where in errors:
        return None
    return {"name": name, "description": description, "input_schema": schema}


def declarations_clean(tools, mode, *, field: str = "tools", mode_field: str = "tools_mode") -> list[dict]:
    """The declarations as stored, each checked as an external tool's definition is; ServiceError naming each
    problem by its place (`tools[2].name`) otherwise."""
    errors: dict = {}
    if mode not in MODES:
        errors[mode_field] = ['"add" or "replace"']
    if not isinstance(tools, list):
        errors[field] = ["a list of tool declarations"]
        raise ServiceError(errors)
    if len(tools) > DECLARED_MAX:
        errors[field] = [f"at most {DECLARED_MAX} tools"]
        raise ServiceError(errors)
    problem = json_problem(tools)
    if problem is not None:
        raise ServiceError({**errors, field: [problem]})
    size = len(json.dumps(tools, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    if size > DECLARATIONS_MAX_BYTES:
        raise ServiceError({**errors, field: [f"{size} bytes of declarations; the limit is {DECLARATIONS_MAX_BYTES}"]})
    seen: set = set()
    cleaned = [_declaration(item, f"{field}[{index}]", errors, seen) for index, item in enumerate(tools)]
    if errors:
        raise ServiceError(errors)
    return cleaned


def _refuse_shadowing(declarations: list[dict], surface: list[ExposedTool], field: str) -> None:
    """Added tools may not take the name of a tool on the surface they join."""
    on_surface = {exposed.name for exposed in surface}
    errors = {f"{field}[{index}].name": [f"{d['name']!r} is a tool of this session: an added tool needs its own name"]
              for index, d in enumerate(declarations) if d["name"] in on_surface}
    if errors:
        raise ServiceError(errors)


def session_tools_declare(*, session: AgentSession, tools: list, mode: str, api_key=None) -> AgentSession:
    """Set the session's declared tools (all of them: the list replaces the one before) and their mode."""
    declarations = declarations_clean(tools, mode)
    if mode == DECLARED_ADD:
        _refuse_shadowing(declarations, visible_tools(session, declared=False), "tools")
    AgentSession.objects.for_tenant(session.tenant_id).filter(pk=session.pk).update(
        declared_tools=declarations, declared_mode=mode)
    session.declared_tools, session.declared_mode = declarations, mode
    surface_announce(session.tenant_id, session.pk)
    audit_record(tenant=session.tenant, actor=api_key and f"apikey:{api_key.name}", verb="session.tools_declared",
                 target=f"session:{session.pk}", data={"tools": [d["name"] for d in declarations], "mode": mode})
    return session


def session_create_declaring(*, tenant, agent: str, user: str = "", context: dict | None = None, api_key=None,
                             tools: list | None = None, tools_mode: str = DECLARED_ADD,
                             user_verified: bool = False, person=None) -> AgentSession:
    """`session_create`, with the app's declared tools when it sends some: all or nothing."""
    if tools is None and tools_mode == DECLARED_ADD:
        return session_create(tenant=tenant, agent=agent, user=user, user_verified=user_verified, context=context,
                              api_key=api_key, person=person)
    declarations_clean(tools or [], tools_mode)  # a bad list is refused before anything is written
    with transaction.atomic():
        session = session_create(tenant=tenant, agent=agent, user=user, user_verified=user_verified,
                                 context=context, api_key=api_key, person=person)
        return session_tools_declare(session=session, tools=tools or [], mode=tools_mode, api_key=api_key)


def request_declarations(*, session: AgentSession, tools: list, mode: str) -> Declarations:
    """A request's declared tools, checked against the session's surface (its own declared tools included)."""
    declarations = declarations_clean(tools, mode)
    if mode == DECLARED_ADD:
        _refuse_shadowing(declarations, visible_tools(session), "tools")
    return Declarations(tools={d["name"]: d for d in declarations}, mode=mode)


def call_exposed(session: AgentSession, call: ToolCall, request: Declarations | None = None) -> ExposedTool | None:
    """The tool a call is made with: the declaration its request gave it, the session's declaration it was
    made with (if the session still declares it), or what the session shows under its name; None if nothing."""
    declared = call.declared_tool
    if declared is not None:
        if isinstance(declared, dict) and declared.get("scope") == "request":
            return declared_exposed(declared, "request")
        return session_declared_tool(session, call.tool_name)
    if request is not None and request.mode == DECLARED_REPLACE:
        return None  # the request's own tools are its whole surface
    return visible_tool(session, call.tool_name)
