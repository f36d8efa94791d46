"""What the console shows about the governed MCP endpoint `/mcp/` (docs/mcp.md): whether a session is being
served over it, and the configuration an operator pastes into an MCP client for an API key.

The endpoint is stateless: there is no connection to watch, so "connected" means heard from over `/mcp/`
lately (`tools.catalog.selectors.mcp_presence`, noted by the endpoint at most every few seconds per session).
A key's secret is write-only: a configuration carries it only on the page right after the key was made;
everywhere else it names the key by its prefix in a placeholder.
"""
import json
import logging
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from tenancy.models import KEY_PREFIX, ApiKey, Scope
from tenancy.web import duration_text
from tools.catalog.selectors import MCP_PRESENCE_S, mcp_presence
from tools.gateway.protocol import AGENT_HEADER, CONNECTION_SESSION, KEY_SESSION

logger = logging.getLogger("toolkeeper.console")

MCP_PATH = "/mcp/"
SERVER_NAME = "toolkeeper"  # the name the client configuration gives the server
AGENT_PLACEHOLDER = "<agent name>"

# How the endpoint last heard from a session (`mcp_presence(...)["how"]`).
PRESENCE_KINDS = {
    "connection": "a client connection's own session",
    "key": "the API key's MCP session for this agent",
    "attached": "an MCP client attached to this session",
}


# --- a session's presence ----------------------------------------------------------------------------

@dataclass(frozen=True)
class McpPresence:
    """A session's MCP status as its page shows it."""
    connected: bool
    unknown: bool = False  # the shared cache could not be read
    last_at: datetime | None = None
    how: str = ""  # PRESENCE_KINDS
    opened_by: str = ""  # set when an MCP client opened the session (not the REST API)

    @property
    def window(self) -> str:
        """How recent a request must be for the session to count as connected."""
        return duration_text(MCP_PRESENCE_S)


def _opened_by(session) -> str:
    kind = session.context.get("mcp") if isinstance(session.context, dict) else None
    if kind == CONNECTION_SESSION:
        return "Opened by an MCP client's initialize: the session of one client connection."
    if kind == KEY_SESSION:
        return ("Opened over MCP as the API key's session for this agent: MCP clients that name no session "
                "share it.")
    return ""


def session_mcp_presence(session, *, now: datetime | None = None) -> McpPresence:
    """Whether the session was heard from over `/mcp/` within `MCP_PRESENCE_S`, when, and by which kind of
    client; and whether an MCP client opened it."""
    opened_by = _opened_by(session)
    try:
        seen = mcp_presence(session.pk)
    except Exception:  # a cache outage costs the hint, not the page
        logger.warning("cannot read the MCP presence of session %s", session.pk, exc_info=True)
        return McpPresence(connected=False, unknown=True, opened_by=opened_by)
    if not seen:
        return McpPresence(connected=False, opened_by=opened_by)
    at = seen["at"]
    age = ((now or timezone.now()) - at).total_seconds()
    return McpPresence(
        connected=age <= MCP_PRESENCE_S, last_at=at,
        how=PRESENCE_KINDS.get(seen.get("how"), PRESENCE_KINDS["attached"]), opened_by=opened_by,
    )


# --- an API key's client configuration ---------------------------------------------------------------

@dataclass(frozen=True)
class McpClientSetup:
    """What an API key's MCP section shows: a configuration, or why the key cannot be used over MCP."""
    key: ApiKey
    config: str = ""  # JSON, indented, ready to paste
    refusal: str = ""  # set instead of a config
    with_secret: bool = False  # the config carries the key's real secret

    @property
    def placeholder(self) -> str:
        return key_placeholder(self.key)


def mcp_url(request) -> str:
    """The endpoint's absolute URL as the operator's browser reached this deployment."""
    return request.build_absolute_uri(MCP_PATH)


def key_placeholder(api_key: ApiKey) -> str:
    return f"<your API key {KEY_PREFIX}{api_key.prefix}_…>"


def mcp_refusal(api_key: ApiKey) -> str:
    """Why the key cannot be used over MCP, or "" when it can."""
    if not api_key.is_active:
        return "Revoked: it no longer authenticates."
    if not api_key.has_scope(Scope.AGENT):
        return "Not usable over MCP: the MCP endpoint needs a key with the agent scope."
    return ""


def mcp_client_config(*, url: str, api_key: ApiKey, secret: str = "") -> dict:
    """The generic `mcpServers` block that common MCP clients read. The agent header is there only when the
    key is not locked to an agent (a locked key speaks for its own agent)."""
    headers = {"Authorization": f"Bearer {secret or key_placeholder(api_key)}"}
    if not api_key.agent:
        headers[AGENT_HEADER] = AGENT_PLACEHOLDER
    return {"mcpServers": {SERVER_NAME: {"type": "http", "url": url, "headers": headers}}}


def mcp_client_setup(*, url: str, api_key: ApiKey, secret: str = "") -> McpClientSetup:
    refusal = mcp_refusal(api_key)
    if refusal:
        return McpClientSetup(key=api_key, refusal=refusal)
    config = mcp_client_config(url=url, api_key=api_key, secret=secret)
    return McpClientSetup(key=api_key, config=json.dumps(config, indent=2, ensure_ascii=False),
                          with_secret=bool(secret))
