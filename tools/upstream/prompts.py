"""The prompts of a tenant's MCP servers on `/mcp/` (docs/mcp.md#prompts): a `PromptProvider` over the prompts
each server's last sync stored (`tools.upstream.servers.mcp_prompts_reconcile`).

- **Who sees them.** A session is offered a server's prompts when it sees at least one of the server's tools
  (they are on its listed surface: in an active group, enabled, the server enabled, not hidden by a deny rule).
  Adding a server's tools to a group is how an operator offers the server; a prompt needs no group of its own.
  The gateway then hides the prompts an exposure filter hides by name (a deny rule that always refuses it).
- **Getting one, completing its arguments.** Upstream with the server's own credential, as a call of its tools
  goes: the tenant's stored headers or environment, or, where each person connects their own account, the
  session's person's token (never the caller's Authorization, which never leaves the gateway).
"""
from common.secrets import SecretUnreadable
from tools.accounts import vault
from tools.accounts.oauth import OAuthFailed
from tools.catalog.registry import OfferedPrompt, PromptUnavailable
from tools.catalog.selectors import visible_tools
from tools.models import AccountMode, AgentSession, McpServer, UpstreamPrompt
from tools.upstream.client import UpstreamToolError, UpstreamUnavailable, endpoint_of, mcp_complete, mcp_get_prompt


def _servers_seen(session: AgentSession) -> set[int]:
    """The MCP servers with at least one tool on the session's listed surface."""
    return {exposed.tool.mcp_server_id for exposed in visible_tools(session)
            if exposed.tool is not None and exposed.tool.mcp_server_id is not None}


def _offered(row: UpstreamPrompt, fetch=None, complete=None) -> OfferedPrompt:
    return OfferedPrompt(name=row.name, description=row.description, title=row.title,
                         arguments=tuple(row.arguments or ()), target=f"mcp_server:{row.mcp_server.name}",
                         fetch=fetch, complete=complete)


def _endpoint(server: McpServer, session: AgentSession):
    """How this session reaches the server (as a call of its tools would); PromptUnavailable in plain words."""
    try:
        if server.accounts != AccountMode.PERSON:
            return endpoint_of(server)
        token = vault.call_token(upstream=server, session=session)
        return endpoint_of(server, bearer=token, account=f"user:{session.person_id}")
    except vault.AccountNeeded as exc:
        raise PromptUnavailable(str(exc)) from None
    except OAuthFailed as exc:
        raise PromptUnavailable(f"your account at {server.name!r} could not be refreshed: {exc}") from None
    except SecretUnreadable:
        raise PromptUnavailable(f"the stored credentials of MCP server {server.name} cannot be read") from None
    except UpstreamUnavailable as exc:  # a stdio entry the platform admin no longer allows, and the like
        raise PromptUnavailable(str(exc)) from None


class UpstreamPrompts:
    """The `PromptProvider` of tenants' MCP servers."""

    def prompts(self, session: AgentSession) -> list[OfferedPrompt]:
        servers = _servers_seen(session)
        if not servers:
            return []
        rows = (UpstreamPrompt.objects.for_tenant(session.tenant_id).select_related("mcp_server")
                .filter(mcp_server_id__in=servers, mcp_server__enabled=True).order_by("name"))
        return [_offered(row) for row in rows]

    def prompt(self, session: AgentSession, name: str) -> OfferedPrompt | None:
        row = (UpstreamPrompt.objects.for_tenant(session.tenant_id).select_related("mcp_server")
               .filter(name=name, mcp_server__enabled=True).first())
        if row is None or row.mcp_server_id not in _servers_seen(session):
            return None
        try:
            endpoint = _endpoint(row.mcp_server, session)
        except PromptUnavailable as exc:
            refusal = str(exc)

            def refuse(*args) -> dict:
                raise PromptUnavailable(refusal)

            return _offered(row, refuse, refuse)
        upstream_name = row.upstream_name

        def fetch(arguments: dict) -> dict:
            try:
                return mcp_get_prompt(endpoint, upstream_name, arguments)
            except (UpstreamToolError, UpstreamUnavailable) as exc:
                raise PromptUnavailable(str(exc)) from None

        def complete(argument: dict, context: dict) -> list[str]:
            try:
                return mcp_complete(endpoint, upstream_name, argument, context)
            except (UpstreamToolError, UpstreamUnavailable) as exc:
                raise PromptUnavailable(str(exc)) from None

        return _offered(row, fetch, complete)
