"""Meta tools: the platform's own tools on a session's surface, which change the session itself.

`reset_tools` (docs/governance.md) is on the surface whenever the tenant has switchable groups; its schema has
one boolean per such group. `search_tools` and `enable_tools` are on it when the tenant lists sessions the core and
the tool search (`Tenant.tool_surface`, docs/governance.md#tool-search): the first finds tools the session may see,
the second switches the ones it names on for the session. Other apps provide meta tools of their own through
`tools.catalog.registry` (`load_skill_through_path`, from skills). Meta tools are no rows of the catalog
(`ExposedTool.tool` is None) and their names are reserved (`tools.catalog.registry.RESERVED_TOOL_NAMES`). This
module is where they appear on the surface (`meta_tools`); `tools.calls.meta` runs them.
"""
from tenancy.models import ToolSurface
from tools.catalog.registry import META_ENABLE_TOOLS, META_RESET_TOOLS, META_SEARCH_TOOLS, meta_providers
from tools.catalog.snapshot import CatalogSnapshot, ExposedTool, GroupView, switchable_groups
from tools.models import AgentSession

RESET_TOOLS_DESCRIPTION = (
    "Choose which optional tool groups are active. Send the complete desired state: "
    "a group not set to true is deactivated, except one a loaded skill switched on, which stays on for the "
    "session. Returns the active groups and the notes of newly activated groups."
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


# Bounds of the tool search's input: what a model sends is hostile, and a longer query finds nothing more.
QUERY_MAX = 200
SEARCH_LIMIT_MAX = 25
SEARCH_LIMIT_DEFAULT = 10
ENABLE_MAX = 25  # names in one enable_tools call
ENABLED_MAX = 100  # tools one session may have switched on
NAME_MAX = 128  # Tool.name
ENABLED_TOOLS = "enabled_tools"  # the key of AgentSession.state that lists the tools the session switched on

SEARCH_TOOLS_DESCRIPTION = (
    "Find tools for a task among those you may use but are not listed yet: describe what you need in a few words. "
    "Returns matching tools' names and descriptions, best first; switch the ones you need on with enable_tools."
)
ENABLE_TOOLS_DESCRIPTION = (
    "Switch tools found with search_tools on for this session: name them exactly. They are listed from then on "
    "and can be called. All or nothing: an unknown name changes nothing."
)


def search_surface(session: AgentSession) -> bool:
    """Whether the session's tenant lists the core and the tool search rather than the whole surface."""
    return getattr(session.tenant, "tool_surface", ToolSurface.FULL) == ToolSurface.SEARCH


def enabled_tool_names(session: AgentSession) -> list[str]:
    """The tools the session switched on with enable_tools, as stored (each still checked where it is used)."""
    state = session.state if isinstance(session.state, dict) else {}
    names = state.get(ENABLED_TOOLS)
    return [name for name in names if isinstance(name, str)] if isinstance(names, list) else []


SEARCH_TOOLS_SCHEMA = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 1, "maxLength": QUERY_MAX,
                  "description": "What the tool should do, in a few words."},
        "limit": {"type": "integer", "minimum": 1, "maximum": SEARCH_LIMIT_MAX,
                  "description": f"How many tools to return at most (default {SEARCH_LIMIT_DEFAULT})."},
    },
    "required": ["query"],
    "additionalProperties": False,
}
ENABLE_TOOLS_SCHEMA = {
    "type": "object",
    "properties": {
        "names": {"type": "array", "minItems": 1, "maxItems": ENABLE_MAX, "uniqueItems": True,
                  "items": {"type": "string", "minLength": 1, "maxLength": NAME_MAX},
                  "description": "The tools' names, as search_tools returned them."},
    },
    "required": ["names"],
    "additionalProperties": False,
}


def _search_tools(catalog: CatalogSnapshot) -> list[ExposedTool]:
    return [
        ExposedTool(name=META_SEARCH_TOOLS, description=SEARCH_TOOLS_DESCRIPTION, schema=SEARCH_TOOLS_SCHEMA,
                    catalog=catalog, annotations={"readOnlyHint": True, "destructiveHint": False,
                                                  "idempotentHint": True}),
        ExposedTool(name=META_ENABLE_TOOLS, description=ENABLE_TOOLS_DESCRIPTION, schema=ENABLE_TOOLS_SCHEMA,
                    catalog=catalog, annotations={"readOnlyHint": False, "destructiveHint": False,
                                                  "idempotentHint": True}),
    ]


def meta_tools(catalog: CatalogSnapshot, session: AgentSession) -> list[ExposedTool]:
    """The meta tools this session sees, after its catalog tools."""
    switchable = switchable_groups(catalog.groups, session.agent)
    exposed = [ExposedTool(
        name=META_RESET_TOOLS, description=RESET_TOOLS_DESCRIPTION, schema=reset_tools_schema(switchable),
        catalog=catalog, annotations={"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True},
    )] if switchable else []
    if search_surface(session):
        exposed += _search_tools(catalog)
    for provider in meta_providers():
        provided = provider.exposed(session, catalog)
        if provided is not None:
            exposed.append(provided)
    return exposed


def meta_tool(catalog: CatalogSnapshot, session: AgentSession, name: str) -> ExposedTool | None:
    return next((exposed for exposed in meta_tools(catalog, session) if exposed.name == name), None)
