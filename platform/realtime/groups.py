"""Channels group names (docs/notes/realtime.md). The server decides who receives what."""


def calls_group(tenant_id: int) -> str:
    return f"t{tenant_id}.calls"


def settled_group(tenant_id: int) -> str:
    """The status events that settle a tenant's calls, and nothing else: what a server process's waits listen to
    in the distributed mode, so a call wakes them once, not at each of its moves."""
    return f"t{tenant_id}.settled"


def session_group(tenant_id: int, session_id) -> str:
    return f"t{tenant_id}.s{session_id}"


def inbox_group(tenant_id: int) -> str:
    return f"t{tenant_id}.inbox"


def surface_group(tenant_id: int) -> str:
    """What a tenant's sessions may see changed (its catalog, its rules, one session's groups): the MCP
    notification streams of its sessions listen here (docs/mcp.md, "Notifications")."""
    return f"t{tenant_id}.surface"
