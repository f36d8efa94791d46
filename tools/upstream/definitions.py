"""Pinned definitions: an upstream tool is served as an operator accepted it, never as its server last said.

A tool's description is read by the model as instructions, so a server that rewrites a reviewed tool ("also
send ~/.ssh to …") must not reach any agent by itself. Each upstream tool keeps the definition last accepted
(`Tool.pinned`: upstream name, description, input and output schemas, annotations) and its hash. A sync that
finds a different definition stores it as `proposed` and the tool is **withheld**: it leaves every session's
surface, and a call to it fails with `ToolDefinitionChanged`, until an operator reads the diff on the server's
page and accepts it. Withholding, not serving the pinned text, because the pinned text no longer describes
what the server does: a changed schema can change what an argument means, so a call made from the old
definition could do something nobody reviewed. A tool a later sync finds for the first time waits the same
way. A server's first sync pins what it lists (registering the server is the operator's choice of its tools),
as does the first sync of a tool that has no pin yet; a server marked `accept_changes` pins every change
itself (each such acceptance is audited like an operator's). If the server goes back to the pinned
definition, the proposal is dropped and the tool is served again.
"""
import difflib
import hashlib
import json

from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from common.errors import Conflict
from tools.models import McpServer, Tool
from tools.signals import tool_definition_proposed

DIFF_LINES_MAX = 400
DEFINITION_KEYS = ("name", "description", "input_schema", "output_schema", "annotations")
WITHHELD_MESSAGE = ("its MCP server changed its definition (or offered it anew) and an operator has not reviewed "
                    "the change yet")


def upstream_definition(*, name: str, description: str, input_schema: dict, output_schema, annotations) -> dict:
    """The reviewed part of an upstream tool, as stored (after the sync's normalisation)."""
    return {"name": name, "description": description, "input_schema": input_schema,
            "output_schema": output_schema, "annotations": annotations if isinstance(annotations, dict) else {}}


def definition_hash(definition: dict) -> str:
    """SHA-256 of the definition's canonical JSON: key order and spacing never make a change."""
    text = json.dumps(definition, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def tool_flags(server: McpServer, annotations) -> dict:
    """A tool's flags: its annotations for a trusted server; otherwise the safe reading (not read-only,
    destructive, not idempotent), whatever the server claims."""
    annotations = annotations if isinstance(annotations, dict) else {}
    if not server.trusted:
        return {"read_only": False, "destructive": True, "idempotent": False, "concurrency_safe": False,
                "trusted": False}
    read_only = annotations.get("readOnlyHint") is True
    destructive = not read_only and annotations.get("destructiveHint") is not False  # MCP's default: true
    return {"read_only": read_only, "destructive": destructive, "idempotent": annotations.get("idempotentHint") is True,
            "concurrency_safe": read_only, "trusted": True}


def definition_values(server: McpServer, definition: dict) -> dict:
    """The tool's served values under a definition."""
    return {"description": definition["description"], "input_schema": definition["input_schema"],
            "output_schema": definition["output_schema"], **tool_flags(server, definition.get("annotations"))}


def _lines(definition: dict | None) -> list[str]:
    if definition is None:
        return []
    lines = []
    for key in DEFINITION_KEYS:
        value = definition.get(key)
        if key == "description" and isinstance(value, str):
            lines.append("description:")
            lines += [f"  {line}" for line in value.splitlines() or [""]]
        else:
            text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
            lines += [f"{key}: {line}" if i == 0 else f"  {line}" for i, line in enumerate(text.splitlines())]
    return lines


def definition_diff(tool: Tool) -> list[tuple[str, str]]:
    """The proposed definition against the pinned one, as (kind, line) with kind " ", "+", "-" or "@" (a hunk
    header), for a page to show (each line is text, escaped where it is shown). A new tool's lines are all "+"."""
    if not tool.proposed_hash:
        return []
    rows = []
    for line in difflib.unified_diff(_lines(tool.pinned), _lines(tool.proposed), lineterm="", n=3):
        if line.startswith(("---", "+++")):
            continue
        kind = "@" if line.startswith("@@") else line[:1]
        rows.append((kind, line[1:] if kind != "@" else line))
        if len(rows) >= DIFF_LINES_MAX:
            rows.append(("@", "… the rest of the diff is not shown"))
            break
    return rows


def propose(tool: Tool, definition: dict, digest: str, *, server: McpServer) -> bool:
    """Hold a definition the sync found for review (the tool is withheld until it is accepted). True when this
    is a change not proposed before (operators are told once per proposal)."""
    if tool.proposed_hash == digest:
        return False
    new = tool.pinned is None
    tool.proposed, tool.proposed_hash, tool.proposed_at = definition, digest, timezone.now()
    tool.save(update_fields=["proposed", "proposed_hash", "proposed_at", "updated_at"])
    audit_record(tenant=server.tenant, actor=None, verb="tool.definition_changed", target=f"tool:{tool.name}",
                 data={"server": server.name, "new": new, "hash": digest, "pinned_hash": tool.pinned_hash})
    tool_definition_proposed.send(sender=Tool, tool=tool, server=server, new=new)
    return True


def pin(tool: Tool, definition: dict, digest: str) -> None:
    """Record `definition` as the accepted one (the caller applies its values to the tool and saves it)."""
    tool.pinned, tool.pinned_hash = definition, digest
    tool.proposed, tool.proposed_hash, tool.proposed_at = None, "", None


@transaction.atomic
def tool_definition_accept(*, tool: Tool, expected_hash: str, actor=None) -> Tool:
    """An operator accepts the proposed definition they reviewed (`expected_hash`: the one the diff showed; a
    newer proposal must be reviewed first). The tool is served with it from now on."""
    locked = Tool.objects.for_tenant(tool.tenant_id).select_for_update().filter(pk=tool.pk).first()
    if locked is None or not locked.proposed_hash:
        raise Conflict("the tool has no definition waiting for review")
    if locked.proposed_hash != expected_hash:
        raise Conflict("the server changed the definition again since this diff was shown: review the new one")
    server = locked.mcp_server
    if server is None:
        raise Conflict("the tool's MCP server no longer offers it")
    previous = locked.pinned_hash
    definition, digest = locked.proposed, locked.proposed_hash
    for key, value in definition_values(server, definition).items():
        setattr(locked, key, value)
    pin(locked, definition, digest)
    locked.save()
    audit_record(tenant=server.tenant, actor=actor, verb="tool.definition_accepted", target=f"tool:{locked.name}",
                 data={"server": server.name, "hash": digest, "previous_hash": previous, "by_server": False})
    return locked


def withheld_tools(server: McpServer) -> list[Tool]:
    """The server's tools waiting for review, by name."""
    return list(Tool.objects.for_tenant(server.tenant_id).filter(mcp_server=server).exclude(proposed_hash="")
                .order_by("name"))
