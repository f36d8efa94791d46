"""Meta tools: the platform's own tools on a session's surface, which change the session itself.

`reset_tools` (docs/governance.md) is on the surface whenever the tenant has switchable groups; its schema has
one boolean per such group. Other apps provide meta tools of their own through `tools.catalog.registry`
(`load_skill_through_path`, from skills). Meta tools are no rows of the catalog (`ExposedTool.tool` is None) and
their names are reserved (`tools.catalog.registry.RESERVED_TOOL_NAMES`). This module is where they appear on
the surface (`meta_tools`); `tools.calls.meta` runs them.
"""
from tools.catalog.registry import META_RESET_TOOLS, meta_providers
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
