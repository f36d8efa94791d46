"""Channels group names (docs/notes/realtime.md). The server decides who receives what."""


def calls_group(tenant_id: int) -> str:
    return f"t{tenant_id}.calls"


def session_group(tenant_id: int, session_id) -> str:
    return f"t{tenant_id}.s{session_id}"


def inbox_group(tenant_id: int) -> str:
    return f"t{tenant_id}.inbox"
