"""A tenant's MCP servers: registering them (credentials write-only) and putting their tools in the catalog.

- **Names.** An upstream tool `t` of the server `s` is the catalog's `mcp__s__t` (`mcp_tool_name`): the
  catalog takes `[a-zA-Z0-9_-]{1,64}`, MCP names may hold dots and run to 128 characters. A name that had
  to change (a character replaced, cut to length) ends in `_` and 8 hex digits of the SHA-256 of the upstream
  name, so two upstream names never share a catalog name and the mapping is the same at every sync.
  `Tool.source_ref` keeps the upstream name: that is what a call sends upstream. Server names have no
  underscore, so the first `__` after `mcp__` ends the server's name.
- **Reconcile** (`mcp_tools_reconcile`): the listed tools (after `include`/`exclude`) are created or updated;
  a tool that is no longer offered is disabled and detached from the server (`mcp_server` null), never
  deleted, so its groups, bindings and calls stay; when it is offered again the detached row is taken back
  and enabled. A tool an operator disabled stays attached and stays disabled: the sync never overrides
  that choice. A tool whose schema fails the catalog's checks, or whose name is taken by a tool from another
  source, is skipped and reported; the sync goes on. New tools join no group: nothing an upstream server
  adds is visible to a model until an operator puts it in a group.
- **Trust.** Annotations (readOnlyHint, destructiveHint, idempotentHint) become the tool's flags only for a
  server marked `trusted`. Otherwise the tool is taken as not read-only, destructive and not idempotent
  (the safe reading: read-only auto-allow does not apply, and a call is never re-run after a lost worker).
  A tool runs one call at a time per session (`concurrency_safe`) unless it is trusted read-only.
- **Credentials** (HTTP headers, a command's environment) are write-only: answers, pages and audit data
  name them, never show them; an update without them keeps them, `{}` clears them; and they are never sent
  to another host than the one they were entered for (changing the URL's origin, or the command, needs
  them sent again).
"""
import hashlib
import logging
import re

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.services import audit_record
from common.errors import ServiceError
from common.json_values import flags_check, json_problem, seconds_check
from common.outbound import OutboundRefused, check_url
from common.secrets import SecretUnreadable, secret_readable
from tools.accounts import oauth, vault
from tools.accounts.oauth import OAuthFailed
from tools.accounts.vault import AccountNeeded
from tools.catalog.schemas import SchemaProblem, schema_check, tool_name_reserved
from tools.catalog.services import group_tools_add
from tools.models import AccountMode, McpServer, McpStatus, McpTransport, Tool, ToolSource, UpstreamPrompt
from tools.upstream import client as mcp_client
from tools.upstream.client import ListedPrompt, UpstreamTool, UpstreamUnavailable
from tools.upstream.definitions import (
    definition_hash,
    definition_values,
    pin,
    propose,
    tool_flags,
    upstream_definition,
)

logger = logging.getLogger(__name__)

SERVER_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,22}[a-z0-9])?")
SERVER_NAME_RULE = "1-24 lowercase letters, digits or '-', starting and ending with a letter or digit"
TOOL_NAME_MAX = 64
_OUTSIDE_CHARSET = re.compile(r"[^a-zA-Z0-9_-]")
HASH_LENGTH = 8
UPSTREAM_NAME_MAX = 255  # Tool.source_ref
DESCRIPTION_MAX = 16_000
HTTP_TRANSPORTS = (McpTransport.STREAMABLE_HTTP, McpTransport.SSE)
TIMEOUT_RANGE = (0.1, 3600.0)
NAMES_MAX, NAME_LENGTH_MAX = 500, UPSTREAM_NAME_MAX  # include / exclude lists
HEADERS_MAX, HEADER_VALUE_MAX = 32, 8192
ENV_VALUE_MAX = 8192
HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,128}")  # an HTTP token (RFC 9110)
HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")  # visible ASCII, space and tab: no CR/LF (no header injection)
# Headers the transport owns: hop-by-hop ones, those that frame the message, and the MCP session's own.
REFUSED_HEADERS = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length", "mcp-session-id", "mcp-protocol-version",
})
FIELDS = ("name", "transport", "url", "headers", "command", "env", "enabled", "timeout_s", "include", "exclude",
          "trusted", "accept_changes", "accounts", "oauth_client", "oauth_scopes")
SECRET_FIELDS = ("headers", "env", "oauth_client")
SECRET_WORDS = {"headers": "headers", "env": "environment", "oauth_client": "OAuth client"}
ERROR_MAX = 500
UNEXPECTED = "the server's answer could not be used"  # a failure the client did not report as such
SKIPPED_IN_AUDIT = 50
# A prompt's stored definition: what a client is shown and what `prompts/get` checks its arguments against.
PROMPT_DESCRIPTION_MAX = 4000
PROMPT_TITLE_MAX = 200
PROMPT_ARGUMENTS_MAX = 32
PROMPT_ARGUMENT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
PROMPT_ARGUMENT_DESCRIPTION_MAX = 1000


# --- names -------------------------------------------------------------------------------------

def mcp_tool_name(server_name: str, upstream_name: str) -> str:
    """The catalog name of an upstream tool: `mcp__{server}__{tool}`, in `[a-zA-Z0-9_-]`, at most 64 characters.
    A name that had to be changed ends in `_` and a hash of the upstream name (stable, distinct per name)."""
    prefix = f"mcp__{server_name}__"
    clean = _OUTSIDE_CHARSET.sub("_", upstream_name)
    if clean and clean == upstream_name and len(prefix) + len(clean) <= TOOL_NAME_MAX:
        return prefix + clean
    digest = hashlib.sha256(upstream_name.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_LENGTH]
    room = TOOL_NAME_MAX - len(prefix) - HASH_LENGTH - 1
    return f"{prefix}{clean[:room]}_{digest}"


def server_tools(server: McpServer):
    """The tools that bear the server's name: its own, and those detached from it (disabled)."""
    prefix = f"mcp__{server.name}__"
    return Tool.objects.for_tenant(server.tenant_id).filter(
        Q(mcp_server=server) | Q(source=ToolSource.MCP, mcp_server__isnull=True, name__startswith=prefix))


def mcp_tools_by_server(tenant, servers) -> dict[int, list[Tool]]:
    """The tools of each server (`server_tools`), in one query for a whole list of servers."""
    servers = list(servers)
    by_name = {server.name: server.pk for server in servers}
    found: dict[int, list[Tool]] = {server.pk: [] for server in servers}
    if not servers:
        return found
    tools = Tool.objects.for_tenant(tenant).filter(
        Q(mcp_server__in=[server.pk for server in servers]) | Q(source=ToolSource.MCP, mcp_server__isnull=True)
    ).defer("input_schema", "output_schema").order_by("name")
    for tool in tools:
        if tool.mcp_server_id is not None:
            found[tool.mcp_server_id].append(tool)
        elif tool.name.startswith("mcp__") and (owner := by_name.get(tool.name[5:].split("__", 1)[0])):
            found[owner].append(tool)
    return found


# --- reconcile ---------------------------------------------------------------------------------

ANNOTATION_FLAGS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")
ANNOTATION_TITLE_MAX = 200


def _annotations(annotations) -> dict:
    """The annotations worth keeping (and reviewing): MCP's hints as booleans, the title as bounded text."""
    if not isinstance(annotations, dict):
        return {}
    kept = {key: annotations[key] for key in ANNOTATION_FLAGS if isinstance(annotations.get(key), bool)}
    title = annotations.get("title")
    if isinstance(title, str) and title and not json_problem(title):
        kept["title"] = title[:ANNOTATION_TITLE_MAX]
    return kept


def _definition(server: McpServer, upstream: UpstreamTool) -> tuple[dict | None, str]:
    """The reviewed definition of an upstream tool as it would be stored (tools.upstream.definitions), or
    (None, why it cannot enter the catalog)."""
    schema = upstream.input_schema
    if not isinstance(schema, dict):
        return None, 'its input schema is not a JSON Schema of type "object"'
    if "type" not in schema:
        schema = {"type": "object", **schema}
    output = upstream.output_schema if isinstance(upstream.output_schema, dict) else None
    description = upstream.description if isinstance(upstream.description, str) else ""
    if problem := json_problem({"description": description, "input_schema": schema, "output_schema": output}):
        return None, f"it cannot be stored: {problem}"
    try:
        schema_check(schema)
    except SchemaProblem as exc:
        return None, f"its input schema {exc}"
    if output is not None and len(repr(output)) > 4 * 64 * 1024:
        output = None  # shown to operators only; a huge one is not worth storing
    return upstream_definition(name=upstream.name, description=description[:DESCRIPTION_MAX], input_schema=schema,
                               output_schema=output, annotations=_annotations(upstream.annotations)), ""


def _taken(server: McpServer, name: str) -> bool:
    include, exclude = server.include or [], server.exclude or []
    return (not include or name in include) and name not in exclude


def _named(listed, skipped: list[tuple[str, str]]):
    """(item, its upstream name) for each listed tool or prompt with a usable name, each name once; the others
    are added to `skipped` with the reason."""
    seen: set[str] = set()
    for item in listed:
        upstream_name = item.name if isinstance(item.name, str) else ""
        if not upstream_name or len(upstream_name) > UPSTREAM_NAME_MAX or json_problem(upstream_name):
            shown = upstream_name[:80] if upstream_name and not json_problem(upstream_name) else "(no usable name)"
            skipped.append((shown, "the server gave it no usable name"))
            continue
        if upstream_name in seen:
            skipped.append((upstream_name, "the server listed it twice"))
            continue
        seen.add(upstream_name)
        yield item, upstream_name


@transaction.atomic
def mcp_tools_reconcile(*, server: McpServer, listed: list[UpstreamTool]) -> dict:
    """Bring the catalog in line with the tools the server lists (the rules: this module's docstring; what a
    changed definition does: tools.upstream.definitions). Returns {"added", "updated", "disabled", "held":
    counts, "skipped": [(name, reason)]}; `held`: the tools whose new or changed definition now waits for review."""
    McpServer.objects.for_tenant(server.tenant_id).select_for_update().filter(pk=server.pk).first()  # one at a time
    rows = list(server_tools(server))
    attached = {tool.source_ref: tool for tool in rows if tool.mcp_server_id == server.pk}
    detached = {tool.name: tool for tool in rows if tool.mcp_server_id is None}
    # The first listing pins what it finds, as does a server that accepts changes by itself.
    pinning = server.accept_changes or server.last_synced_at is None
    added = updated = disabled = held = 0
    skipped: list[tuple[str, str]] = []
    kept: set[int] = set()
    joining: list[Tool] = []  # the tools added, for the group the server names
    for upstream, upstream_name in _named(listed, skipped):
        if not _taken(server, upstream_name):
            continue
        definition, problem = _definition(server, upstream)
        if definition is None:
            skipped.append((upstream_name, problem))
            continue
        name = mcp_tool_name(server.name, upstream_name)
        if tool_name_reserved(name):
            skipped.append((upstream_name, f"{name} is reserved for a tool of the platform"))
            continue
        tool = attached.get(upstream_name) or detached.pop(name, None)
        if tool is None or tool.name != name:
            clash = Tool.objects.for_tenant(server.tenant_id).filter(name=name).exclude(
                pk=getattr(tool, "pk", None)).first()
            if clash is not None:
                owner = "another tool of this server" if clash.mcp_server_id == server.pk else f"a {clash.source} tool"
                skipped.append((upstream_name, f"its name {name} is taken by {owner}"))
                continue
        digest = definition_hash(definition)
        served = definition_values(server, definition)
        kept_values = {"source": ToolSource.MCP, "source_ref": upstream_name, "timeout_s": server.timeout_s}
        if tool is None:
            tool = Tool(tenant_id=server.tenant_id, name=name, mcp_server=server, enabled=True, **served,
                        **kept_values)
            if pinning:
                pin(tool, definition, digest)
            tool.save()
            if not pinning:
                held += propose(tool, definition, digest, server=server)
            added += 1
            joining.append(tool)
            kept.add(tool.pk)
            continue
        # a definition is applied when it is the accepted one, or the tool was never pinned (it was in the
        # catalog before definitions were), or the server accepts changes; otherwise it waits for review
        applied = digest == tool.pinned_hash or (tool.pinned is None and not tool.proposed_hash) or pinning
        changes = {key: value for key, value in {**kept_values, **(served if applied else {})}.items()
                   if getattr(tool, key) != value}
        if tool.name != name:
            changes["name"] = name
        if tool.mcp_server_id is None:  # offered again: taken back, enabled
            changes.update(mcp_server=server, enabled=True)
        repinned = applied and (digest != tool.pinned_hash or bool(tool.proposed_hash))
        if repinned:
            if tool.pinned is not None and digest != tool.pinned_hash:  # a change the server's setting accepted
                audit_record(tenant=server.tenant, actor=None, verb="tool.definition_accepted",
                             target=f"tool:{name}", data={"server": server.name, "hash": digest,
                                                          "previous_hash": tool.pinned_hash, "by_server": True})
            pin(tool, definition, digest)  # also drops a proposal the server has gone back on
        if changes or repinned:
            for key, value in changes.items():
                setattr(tool, key, value)
            tool.save()
            updated += 1
        if not applied:
            held += propose(tool, definition, digest, server=server)
        kept.add(tool.pk)
    for tool in attached.values():
        if tool.pk not in kept and tool.enabled:
            _detach(tool)
            disabled += 1
    if joining and server.join_group_id:
        group_tools_add(group=server.join_group, tools=joining)
    return {"added": added, "updated": updated, "disabled": disabled, "held": held, "skipped": skipped}


def _text(value, limit: int) -> str:
    """An upstream text as stored: a string, one that the database can hold, bounded."""
    if not isinstance(value, str) or json_problem(value):
        return ""
    return value[:limit]


def _prompt_definition(prompt: ListedPrompt) -> tuple[dict | None, str]:
    """The stored values of an upstream prompt, or (None, why it is left out)."""
    arguments = prompt.arguments if isinstance(prompt.arguments, list) else []
    if len(arguments) > PROMPT_ARGUMENTS_MAX:
        return None, f"it takes more than {PROMPT_ARGUMENTS_MAX} arguments"
    kept, names = [], set()
    for argument in arguments:
        name = argument.get("name") if isinstance(argument, dict) else None
        if not isinstance(name, str) or not PROMPT_ARGUMENT_NAME.fullmatch(name):
            return None, "an argument's name is not 1-64 letters, digits, '_', '.' or '-'"
        if name in names:
            return None, f"it names the argument {name} twice"
        names.add(name)
        kept.append({"name": name, "description": _text(argument.get("description"), PROMPT_ARGUMENT_DESCRIPTION_MAX),
                     "required": argument.get("required") is True})
    return {"title": _text(prompt.title, PROMPT_TITLE_MAX),
            "description": _text(prompt.description, PROMPT_DESCRIPTION_MAX), "arguments": kept}, ""


@transaction.atomic
def mcp_prompts_reconcile(*, server: McpServer, listed: list[ListedPrompt] | None) -> dict:
    """Keep the server's prompts as it lists them (`None`: it offers none): new ones added, changed ones
    updated, those no longer offered deleted. Each is named as a tool would be (`mcp_tool_name`). A prompt
    without a usable name or arguments is skipped and reported. Returns {"added", "updated", "removed",
    "skipped": [(name, reason)]}."""
    McpServer.objects.for_tenant(server.tenant_id).select_for_update().filter(pk=server.pk).first()
    stored = {prompt.upstream_name: prompt for prompt in
              UpstreamPrompt.objects.for_tenant(server.tenant_id).filter(mcp_server=server)}
    added = updated = 0
    skipped: list[tuple[str, str]] = []
    kept: set[str] = set()
    for prompt, upstream_name in _named(listed or [], skipped):
        values, problem = _prompt_definition(prompt)
        if values is None:
            skipped.append((upstream_name, problem))
            continue
        name = mcp_tool_name(server.name, upstream_name)
        row = stored.get(upstream_name)
        if row is None:
            UpstreamPrompt.objects.create(tenant_id=server.tenant_id, mcp_server=server, name=name,
                                          upstream_name=upstream_name, **values)
            added += 1
        elif any(getattr(row, key) != value for key, value in values.items()) or row.name != name:
            for key, value in values.items():
                setattr(row, key, value)
            row.name = name
            row.save()
            updated += 1
        kept.add(upstream_name)
    # no longer offered, or skipped now (a definition that became unusable is not kept as it was)
    gone = [row.pk for upstream_name, row in stored.items() if upstream_name not in kept]
    if gone:
        UpstreamPrompt.objects.for_tenant(server.tenant_id).filter(pk__in=gone).delete()
    return {"added": added, "updated": updated, "removed": len(gone), "skipped": skipped}


def _detach(tool: Tool) -> None:
    """Disabled by the platform (no longer offered): detached from its server, kept with its history."""
    tool.enabled, tool.mcp_server = False, None
    tool.save(update_fields=["enabled", "mcp_server", "updated_at"])


def _detach_all(server: McpServer) -> int:
    """Disable the server's enabled tools (a disabled or deleted server offers none); those an operator
    disabled stay attached, as they are."""
    tools = list(Tool.objects.for_tenant(server.tenant_id).filter(mcp_server=server, enabled=True))
    for tool in tools:
        _detach(tool)
    return len(tools)


# --- sync and probe ----------------------------------------------------------------------------

def _plain(exc: Exception, server: McpServer, fallback: str) -> str:
    """An upstream failure in plain words for the tenant: one line, bounded, with no stored secret in it."""
    text = str(exc).encode("utf-8", "replace").decode("utf-8")  # no lone surrogate
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split()) or fallback  # one line, no NUL
    for secrets in (server.headers, server.env):
        for value in (secrets or {}).values():
            if isinstance(value, str) and len(value) >= 4:
                text = text.replace(value, "[hidden]")
    return text if len(text) <= ERROR_MAX else text[:ERROR_MAX - 1] + "…"


def _upstream_failure(exc: Exception, server: McpServer) -> str:
    if isinstance(exc, SecretUnreadable):
        return "the stored credentials cannot be read with the platform's keys; enter them again"
    if isinstance(exc, OAuthFailed | AccountNeeded):
        return _plain(exc, server, "no account to list the tools with")
    if isinstance(exc, UpstreamUnavailable | OutboundRefused):
        return _plain(exc, server, "the server could not be reached")
    logger.error("MCP server %s of tenant %s: unexpected failure %s: %s", server.pk, server.tenant_id,
                 type(exc).__name__, _plain(exc, server, ""))
    return UNEXPECTED


def _listing_endpoint(server: McpServer) -> mcp_client.McpEndpoint:
    """How a sync or a test reaches the server: with the tenant's credential, or, where each person connects their
    own account, with the listing account's token (an operator's connection, docs/accounts.md)."""
    if server.accounts != AccountMode.PERSON:
        return mcp_client.endpoint_of(server)
    return mcp_client.endpoint_of(server, bearer=vault.listing_token(server),
                                  account=f"listing:{server.listing_account_id}")


def _target(server: McpServer) -> str:
    return f"mcp_server:{server.name}"


def mcp_server_sync(*, server: McpServer, actor=None) -> dict:
    """List the server's tools and reconcile the catalog. An unreachable server is recorded (status `error`,
    `last_error` in plain words) and its tools stay as they were. Returns the counts with "status" and "error"."""
    if not server.enabled:
        raise ServiceError("the server is disabled: enable it to sync its tools")
    try:
        endpoint = _listing_endpoint(server)
        listed = mcp_client.mcp_list_tools(endpoint)
        prompts = mcp_client.mcp_list_prompts(endpoint)
    except Exception as exc:  # every failure is recorded on the server; none reaches the tenant raw
        error = _upstream_failure(exc, server)
        with transaction.atomic():
            McpServer.objects.for_tenant(server.tenant_id).filter(pk=server.pk).update(
                status=McpStatus.ERROR, last_error=error)
            server.status, server.last_error = McpStatus.ERROR, error
            audit_record(tenant=server.tenant, actor=actor, verb="mcp_server.synced", target=_target(server),
                         data={"status": McpStatus.ERROR, "error": error})
        logger.info("MCP server %s of tenant %s not synced: %s", server.pk, server.tenant_id, error)
        return {"status": McpStatus.ERROR, "error": error, "added": 0, "updated": 0, "disabled": 0, "held": 0,
                "skipped": [], "prompts": {"added": 0, "updated": 0, "removed": 0, "skipped": []}}
    with transaction.atomic():
        counts = mcp_tools_reconcile(server=server, listed=listed)
        counts["prompts"] = mcp_prompts_reconcile(server=server, listed=prompts)
        now = timezone.now()
        McpServer.objects.for_tenant(server.tenant_id).filter(pk=server.pk).update(
            status=McpStatus.OK, last_error="", last_synced_at=now)
        server.status, server.last_error, server.last_synced_at = McpStatus.OK, "", now
        audit_record(tenant=server.tenant, actor=actor, verb="mcp_server.synced", target=_target(server),
                     data={"status": McpStatus.OK, "added": counts["added"], "updated": counts["updated"],
                           "disabled": counts["disabled"], "held": counts["held"],
                           "skipped": [name for name, _ in counts["skipped"][:SKIPPED_IN_AUDIT]],
                           "prompts": {key: value if key != "skipped" else
                                       [name for name, _ in value[:SKIPPED_IN_AUDIT]]
                                       for key, value in counts["prompts"].items()}})
    return {"status": McpStatus.OK, "error": "", **counts}


def mcp_server_probe(*, server: McpServer, actor=None) -> dict:
    """Connect and say whether the server answers (ServiceError in plain words when it does not). Changes
    nothing but the audit trail, which records that the platform reached out on someone's request. A disabled
    server is not contacted at all."""
    if not server.enabled:
        raise ServiceError("the server is disabled: enable it to test the connection")
    try:
        info = mcp_client.mcp_probe(_listing_endpoint(server))
    except Exception as exc:  # as in mcp_server_sync
        error = _upstream_failure(exc, server)
        audit_record(tenant=server.tenant, actor=actor, verb="mcp_server.tested", target=_target(server),
                     data={"ok": False, "error": error})
        raise ServiceError(f"the connection test failed: {error}") from None
    audit_record(tenant=server.tenant, actor=actor, verb="mcp_server.tested", target=_target(server),
                 data={"ok": True})
    return {"ok": True, "info": info if isinstance(info, dict) else {}}


# --- create, update, delete --------------------------------------------------------------------

def stdio_servers() -> dict:
    """The platform admin's allow-list of stdio servers (settings.TOOLKEEPER_MCP_STDIO_SERVERS)."""
    servers = getattr(settings, "TOOLKEEPER_MCP_STDIO_SERVERS", None)
    return servers if isinstance(servers, dict) else {}


def _stdio_entry(command: str) -> dict | None:
    entry = stdio_servers().get(command)
    return entry if isinstance(entry, dict) and isinstance(entry.get("command"), str) else None


def _origin(url: str) -> str:
    match = re.match(r"(?i)([a-z][a-z0-9+.-]*://[^/?#]*)", url or "")
    return match.group(1).lower() if match else ""


def _check_name(tenant, name, errors: dict, instance=None) -> None:
    if not isinstance(name, str) or not SERVER_NAME.fullmatch(name):
        errors["name"] = [SERVER_NAME_RULE]
        return
    if instance is not None and name != instance.name:
        errors["name"] = ["the name is part of its tools' names and cannot change; add the server again instead"]
        return
    if instance is None and McpServer.objects.for_tenant(tenant).filter(name=name).exists():
        errors["name"] = [f"a server named {name!r} exists"]


def check_headers(headers, errors: dict) -> dict | None:
    if not isinstance(headers, dict):
        errors["headers"] = ["a JSON object of header names and values"]
        return None
    problems, seen = [], set()
    if len(headers) > HEADERS_MAX:
        problems.append(f"at most {HEADERS_MAX} headers")
    for name, value in headers.items():
        if not isinstance(name, str) or not HEADER_NAME.fullmatch(name):
            problems.append(f"{str(name)[:60]!r} is not a header name")
            continue
        if name.lower() in REFUSED_HEADERS:
            problems.append(f"{name} is set by the connection itself and cannot be given")
        elif name.lower() in seen:
            problems.append(f"{name} is given twice")
        seen.add(name.lower())
        if not isinstance(value, str):
            problems.append(f"the value of {name} must be a string")
        elif len(value) > HEADER_VALUE_MAX or not HEADER_VALUE.fullmatch(value):
            # never echo the value: it is a credential
            problems.append(f"the value of {name} must be at most {HEADER_VALUE_MAX} visible ASCII characters, "
                            "without line breaks")
    if problems:
        errors["headers"] = problems
        return None
    return dict(headers)


def _check_env(env, entry: dict | None, command: str, errors: dict) -> dict | None:
    if not isinstance(env, dict):
        errors["env"] = ["a JSON object of environment variable names and values"]
        return None
    problems = []
    for name, value in env.items():
        # the check the client makes before it starts the command: what is saved here is what it gets
        if refusal := mcp_client.tenant_env_refusal(name, entry, command):
            problems.append(refusal)
        elif not isinstance(value, str) or len(value) > ENV_VALUE_MAX:
            problems.append(f"the value of {name} must be text of at most {ENV_VALUE_MAX} characters")
        elif "\x00" in value:  # a process's environment cannot hold it (never echo the value: a credential)
            problems.append(f"the value of {name} may not contain the NUL character (\\u0000)")
    if problems:
        errors["env"] = problems
        return None
    return dict(env)


def _check_names(value, field: str, errors: dict) -> list | None:
    if (not isinstance(value, list) or len(value) > NAMES_MAX
            or not all(isinstance(v, str) and 0 < len(v) <= NAME_LENGTH_MAX and not json_problem(v) for v in value)):
        errors[field] = [f"a list of at most {NAMES_MAX} upstream tool names (1-{NAME_LENGTH_MAX} characters each)"]
        return None
    return list(dict.fromkeys(value))


def mcp_server_check(tenant, changes: dict, instance: McpServer | None = None) -> dict:
    """The server's fields after `changes`, checked whole; ServiceError naming each refused field (for the
    services below, and the Django admin's form)."""
    unknown = set(changes) - set(FIELDS)
    if unknown:
        raise ServiceError({name: ["not a field of an MCP server"] for name in sorted(unknown)})
    unreadable = []  # stored credentials no configured key opens: they must be sent again, or go
    if instance is None:
        current = {"name": "", "transport": "", "url": "", "headers": None, "command": "", "env": None,
                   "enabled": True, "timeout_s": 30.0, "include": [], "exclude": [], "trusted": False,
                   "accept_changes": False, "accounts": AccountMode.TENANT, "oauth_client": None, "oauth_scopes": ""}
    else:
        current = {}
        for name in FIELDS:
            try:
                current[name] = getattr(instance, name)
            except SecretUnreadable:
                current[name] = None
                unreadable.append(name)
    values = {**current, **changes}
    errors: dict = {}
    _check_name(tenant, values["name"], errors, instance)
    transport = values["transport"]
    if transport not in McpTransport.values:
        errors["transport"] = [f"one of: {', '.join(McpTransport.values)}"]
    elif instance is not None and transport != instance.transport:
        # what belonged to the other kind of transport goes, unless it was sent again (then it is refused below)
        for name in (("command", "env") if transport in HTTP_TRANSPORTS else ("url", "headers")):
            if name not in changes:
                values[name] = None if name in SECRET_FIELDS else ""
                if name in unreadable:
                    unreadable.remove(name)  # it goes with its transport
    for name in unreadable:
        if name not in changes:
            errors[name] = [f"the stored {SECRET_WORDS[name]} cannot be read with the platform's keys: send it "
                            "again, or {} for none"]
    flags_check(values, ("enabled", "trusted", "accept_changes"), errors)
    seconds_check(values, "timeout_s", TIMEOUT_RANGE, errors)
    for name in ("include", "exclude"):
        values[name] = _check_names(values[name], name, errors)
    for name in SECRET_FIELDS:
        if name in changes and values[name] == {}:
            values[name] = None  # `{}` clears the stored credentials
    if transport in HTTP_TRANSPORTS:
        _check_http(values, changes, instance, errors)
    elif transport == McpTransport.STDIO:
        _check_stdio(values, changes, instance, errors)
    _check_accounts(values, changes, instance, errors)
    if errors:
        raise ServiceError(errors)
    return values


def _check_http(values: dict, changes: dict, instance, errors: dict) -> None:
    url = values["url"]
    if not isinstance(url, str) or not url:
        errors["url"] = ["an HTTP server needs its URL"]
    elif len(url) > 2000:
        errors["url"] = ["at most 2000 characters"]
    else:
        try:
            check_url(url, resolve=True)
        except OutboundRefused as exc:
            errors["url"] = [str(exc)]
    if values["command"]:
        errors["command"] = ["only a stdio server names a command"]
    if values["env"]:
        errors["env"] = ["only a stdio server takes environment variables"]
    if values["headers"] is not None:
        values["headers"] = check_headers(values["headers"], errors)
    if (instance is not None and "headers" not in changes and secret_readable(instance, "headers")
            and "url" not in errors and _origin(url) != _origin(instance.url)):
        errors["headers"] = ["the URL now points at another server: send the headers again (stored credentials "
                             "are only sent where they were entered for), or {} to send none"]


SERVER_ACCOUNT_MODES = (AccountMode.TENANT, AccountMode.PERSON)  # a service account is an HTTP tools' provider's


def _check_accounts(values: dict, changes: dict, instance, errors: dict) -> None:
    """Whose account the calls act as, and the OAuth client and scopes for each person's own (docs/accounts.md)."""
    if values["accounts"] not in SERVER_ACCOUNT_MODES:
        errors["accounts"] = [f"one of: {', '.join(SERVER_ACCOUNT_MODES)}"]
        return
    person = values["accounts"] == AccountMode.PERSON
    if person and values["transport"] not in HTTP_TRANSPORTS:
        errors["accounts"] = ["only an HTTP server can take each person's own account"]
    if person and any(str(name).lower() == "authorization" for name in (values["headers"] or {})):
        errors["headers"] = ["each person's own token is the Authorization header: leave it out of the headers"]
    client = values["oauth_client"]
    if client is not None:
        if not person:
            errors["oauth_client"] = ["only a server where each person connects their own account has an OAuth "
                                      "client"]
        # "issuer" marks Toolkeeper's own registration, stored; an operator sends client_id and client_secret only
        elif problem := oauth.client_problem(
                client, stored_keys=frozenset() if "oauth_client" in changes else frozenset({"issuer"})):
            errors["oauth_client"] = [problem]
    if problem := oauth.scopes_problem(values["oauth_scopes"]):
        errors["oauth_scopes"] = [problem]
    if (instance is not None and "oauth_client" not in changes and client and "issuer" in client
            and "url" in changes and _origin(values["url"]) != _origin(instance.url)):
        values["oauth_client"] = None  # a registration at the old server's authorization server: made again
    elif (instance is not None and "oauth_client" not in changes and client and "url" not in errors
          and _origin(values["url"]) != _origin(instance.url)):
        errors["oauth_client"] = ["the URL now points at another server: send the OAuth client again, or {} for "
                                  "none"]


def _check_stdio(values: dict, changes: dict, instance, errors: dict) -> None:
    command = values["command"]
    entry = _stdio_entry(command) if isinstance(command, str) and command else None
    if entry is None:
        names = ", ".join(sorted(stdio_servers())) or "none are configured"
        errors["command"] = [f"not an allowed stdio server (the platform allows: {names})"]
    if values["url"]:
        errors["url"] = ["a stdio server has no URL"]
    if values["headers"]:
        errors["headers"] = ["a stdio server takes no headers"]
    if values["env"] is not None:
        values["env"] = _check_env(values["env"], entry, command, errors)
    if (instance is not None and "env" not in changes and secret_readable(instance, "env") and entry is not None
            and command != instance.command):
        errors["env"] = ["the command changed: send the environment again (stored values are only given to the "
                         "command they were entered for), or {} to give none"]


def _described(values: dict) -> dict:
    """What the audit log may hold of a server's fields: never a credential's value."""
    return {"transport": values["transport"], "header_names": sorted(values["headers"] or {}),
            "env_names": sorted(values["env"] or {}), "command": values["command"], "enabled": values["enabled"],
            "trusted": values["trusted"], "accept_changes": values["accept_changes"], "accounts": values["accounts"],
            "oauth_client": bool(values["oauth_client"]), "oauth_scopes": values["oauth_scopes"]}


def _join_group_checked(tenant, group):
    if group is not None and group.tenant_id != tenant.pk:
        raise ServiceError({"join_group": ["a group of another tenant"]})
    return group


@transaction.atomic
def mcp_server_create(*, tenant, actor=None, join_group=None, **fields) -> McpServer:
    """`join_group`: the group each tool a sync adds joins (none: the tools join no group)."""
    values = mcp_server_check(tenant, fields)
    server = McpServer.objects.create(tenant=tenant, join_group=_join_group_checked(tenant, join_group), **values)
    audit_record(tenant=tenant, actor=actor, verb="mcp_server.created", target=_target(server),
                 data={**_described(values), "join_group": join_group.name if join_group else None})
    return server


_UNSET = object()


@transaction.atomic
def mcp_server_update(*, server: McpServer, actor=None, join_group=_UNSET, **changes) -> McpServer:
    values = mcp_server_check(server.tenant, changes, instance=server)
    changed = sorted(name for name in FIELDS if _differs(server, name, values[name]))
    if join_group is not _UNSET and _join_group_checked(server.tenant, join_group) != server.join_group:
        server.join_group = join_group
        changed.append("join_group")
    if not changed:
        return server
    for name in changed:
        if name != "join_group":
            setattr(server, name, values[name])
    if {"url", "headers", "command", "env", "transport"} & set(changed):
        server.status, server.last_error = McpStatus.NEW, ""  # what was learnt of the old connection is moot
    if {"url", "accounts", "oauth_client"} & set(changed):  # the people's grants were for what it was
        # ended before the change is saved: a revocation after the commit uses the client they were made with
        vault.upstream_accounts_end(upstream=server, reason="server_changed")
        server.listing_account = None
    server.save()
    disabled = _detach_all(server) if "enabled" in changed and not server.enabled else 0
    if {"timeout_s", "trusted"} & set(changed):
        _restamp_tools(server)
    joins = {"join_group": server.join_group.name if server.join_group else None} if "join_group" in changed else {}
    audit_record(tenant=server.tenant, actor=actor, verb="mcp_server.updated", target=_target(server),
                 data={"fields": changed, **_described(values), **joins,
                       **({"tools_disabled": disabled} if disabled else {})})
    return server


def mcp_servers_trust_set(*, tenant, trusted, actor=None) -> list[McpServer]:
    """Trust exactly the `trusted` servers of the tenant (the settings page's list); the servers whose trust
    changed, each updated and audited as one edit would be."""
    wanted = {server.pk for server in trusted}
    changed = [server for server in McpServer.objects.for_tenant(tenant).order_by("name")
               if server.trusted != (server.pk in wanted)]
    return [mcp_server_update(server=server, actor=actor, trusted=server.pk in wanted) for server in changed]


def _differs(server: McpServer, name: str, value) -> bool:
    try:
        return value != getattr(server, name)
    except SecretUnreadable:
        return True  # what no key opens is replaced (mcp_server_check let it through only so)


def _restamp_tools(server: McpServer) -> None:
    """A new timeout applies to the server's tools at once, and so does a change of trust: the flags are read again
    from the accepted annotations (a tool pinned before they were kept gets them at the next sync)."""
    for tool in Tool.objects.for_tenant(server.tenant_id).filter(mcp_server=server):
        tool.timeout_s = server.timeout_s
        if tool.pinned is not None or not server.trusted:
            for key, value in tool_flags(server, (tool.pinned or {}).get("annotations")).items():
                setattr(tool, key, value)
        tool.save()


@transaction.atomic
def mcp_server_delete(*, server: McpServer, actor=None) -> None:
    """The server goes; its tools stay in the catalog, disabled and detached (a server of the same name takes
    them back at its first sync)."""
    disabled = _detach_all(server)
    audit_record(tenant=server.tenant, actor=actor, verb="mcp_server.deleted", target=_target(server),
                 data={"tools_disabled": disabled})
    vault.upstream_accounts_end(upstream=server, reason="server_deleted")
    server.delete()
