"""The governed MCP endpoint's protocol side (`/mcp/`, DESIGN §8): an MCP client gets one agent session's
tool surface, and its calls go through the same pipeline as the REST API's.

The `mcp` SDK's low-level server answers the protocol, in its stateless mode: the SDK keeps nothing between
requests, so any server process answers any request. Which agent session a request speaks for comes with
the request, and the session itself (its active groups, its calls) lives in the database (`mcp_session`):

- a client of the 2025 protocol era opens with `initialize`; the answer opens a session of its own for the
  connection and names it in `Mcp-Session-Id`, which the client sends back with every later request;
- a client may name a session its app created through the REST API (`X-Toolkeeper-Session` or `?session=`);
- otherwise (the 2026 era has no connection at all) the request speaks for the key's MCP session of that
  agent, opened on first use.

The HTTP side (the API key, Host and Origin, routing) is `toolkeeper.mcp_http`; it resolves the session
and hands it to the handlers here in the request's scope (`CALLER_SCOPE`).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from django.conf import settings
from django.http import Http404
from mcp import types
from mcp.server import Server
from mcp.shared.exceptions import MCPError

from tenancy.grants import grant_of_key
from tenancy.models import ApiKey
from tenancy.selectors import access_row, key_sees_agent
from toolkeeper.errors import ServiceError

from .calls import calls_submit
from .models import TERMINAL_STATUSES, AgentSession, CallStatus, ToolCall
from .runtime import runtime
from .selectors import session_tools, visible_tool
from .services import session_create
from .waiting import WaitPlan, run_db

CALLER_SCOPE = "toolkeeper.mcp_caller"
SESSION_HEADER = "x-toolkeeper-session"
AGENT_HEADER = "x-toolkeeper-agent"
CONNECTION_SESSION = "connection"  # a session opened by a 2025-era `initialize`
KEY_SESSION = "default"  # the key's session of an agent, for requests that name none


@dataclass(frozen=True)
class McpCaller:
    """Who an MCP request comes from and which agent session it speaks for."""
    api_key: ApiKey
    session: AgentSession
    opened: bool  # the session was opened by this request: its id goes back in `Mcp-Session-Id`


class McpAccessError(Exception):
    """The request cannot be served before the protocol starts: answered with this HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _named_session(api_key: ApiKey, session_id: str) -> AgentSession:
    try:
        session = access_row(AgentSession, api_key.tenant, session_id,
                             allowed=lambda row: key_sees_agent(api_key, row.agent))
    except Http404:
        raise McpAccessError(404, "no such session for this API key") from None
    session.tenant = api_key.tenant
    return session


def mcp_session(*, api_key: ApiKey, named: str = "", agent: str = "", opening: bool = False) -> McpCaller:
    """The session an MCP request speaks for: the one it names (`Mcp-Session-Id`, or a REST session), a new
    one for a connection that is `opening`, or the key's session of the agent."""
    if named:
        return McpCaller(api_key, _named_session(api_key, named), opened=False)
    if api_key.agent and agent and agent != api_key.agent:
        raise McpAccessError(403, f"this API key is locked to the agent {api_key.agent!r}")
    agent = api_key.agent or agent
    if not agent:
        raise McpAccessError(400, f"name the agent: the {AGENT_HEADER} header or ?agent= in the URL")
    tenant = api_key.tenant
    try:
        if opening:
            session = session_create(tenant=tenant, agent=agent, api_key=api_key, context={"mcp": CONNECTION_SESSION})
            return McpCaller(api_key, session, opened=True)
        # Two first requests at once may both open one; the oldest is the one every later request finds.
        session = AgentSession.objects.for_tenant(tenant).filter(
            api_key=api_key, agent=agent, context__mcp=KEY_SESSION).order_by("created_at", "id").first()
        if session is None:
            session = session_create(tenant=tenant, agent=agent, api_key=api_key, context={"mcp": KEY_SESSION})
    except ServiceError as exc:
        raise McpAccessError(exc.status, exc.message) from None
    session.tenant = tenant
    return McpCaller(api_key, session, opened=False)


def _caller(ctx) -> McpCaller:
    return ctx.request.scope[CALLER_SCOPE]


async def _list_tools(ctx, params) -> types.ListToolsResult:
    caller = _caller(ctx)
    listed = await run_db(session_tools, caller.session, "mcp")
    return types.ListToolsResult(tools=[types.Tool.model_validate(tool) for tool in listed])


def call_tool_result(call: ToolCall) -> types.CallToolResult:
    """A call as it ended up, as MCP's tool result: the tool's content and structure when it succeeded, an
    error result with the structured error otherwise, and `pending_approval` while a reviewer has it."""
    if call.status == CallStatus.SUCCEEDED:
        result = call.result or {}
        structured = result.get("structured")
        return types.CallToolResult.model_validate({
            "content": result.get("content") or [],
            **({"structuredContent": structured} if isinstance(structured, dict) else {}),
        })
    if call.status not in TERMINAL_STATUSES:
        waiting = "pending_approval" if call.status == CallStatus.AWAITING_APPROVAL else call.status
        text = (f"The call {call.call_id} is waiting for a reviewer's approval; call {call.tool_name} again with "
                "the same arguments to wait for it." if waiting == "pending_approval"
                else f"The call {call.call_id} is still {call.status}.")
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True,
                                    structured_content={"status": waiting, "call_id": call.call_id})
    result = call.result or {}
    structured = call.error if isinstance(call.error, dict) else {"status": call.status, "call_id": call.call_id}
    return types.CallToolResult.model_validate({
        "content": result.get("content") or [{"type": "text", "text": f"The call ended {call.status}."}],
        "structuredContent": structured, "isError": True,
    })


def pending_approval_twin(session: AgentSession, tool_name: str, arguments: dict) -> ToolCall | None:
    """The session's call of this tool with these arguments that waits for a reviewer, if there is one: a
    client that gave up waiting and calls again attaches to it instead of asking the reviewers twice."""
    waiting = ToolCall.objects.for_tenant(session.tenant_id).filter(
        session=session, tool_name=tool_name, status=CallStatus.AWAITING_APPROVAL).order_by("created_at")
    return next((call for call in waiting if call.input == arguments), None)


async def _call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    caller = _caller(ctx)
    session = caller.session
    if await run_db(visible_tool, session, params.name) is None:
        raise MCPError(code=types.INVALID_PARAMS, message=f"no tool named {params.name!r} is available in this session")
    waiter = runtime().waiter
    spec = {"name": params.name, "input": params.arguments or {}}
    with waiter.watching(session.pk) as watch:  # armed first: a twin settling meanwhile is not missed
        twin = await run_db(pending_approval_twin, session, spec["name"], spec["input"])
        calls = [twin] if twin is not None else await run_db(
            calls_submit, session=session, calls=[spec], api_key=caller.api_key)
        plan = WaitPlan(tenant_id=session.tenant_id, session_ids={session.pk}, calls=calls,
                        timeout=settings.TOOLKEEPER_MCP_MAX_WAIT_S, until=TERMINAL_STATUSES,
                        grant=grant_of_key(caller.api_key), render=list, offline=lambda calls: True)
        if plan.waits():
            heartbeat = asyncio.ensure_future(_heartbeat(ctx, calls[0]))
            try:
                answer = await waiter.answer(plan, watch)
            finally:
                heartbeat.cancel()
            if answer.refused:
                raise MCPError(code=types.INVALID_REQUEST, message="the API key of this request was revoked")
            calls = answer.payload
    return call_tool_result(calls[0])


async def _heartbeat(ctx, call: ToolCall) -> None:
    """Progress while a call waits (for a reviewer, mostly): many clients give up on a request that shows
    nothing for 60 s. Nothing is sent to a client that asked for no progress."""
    beats = 0
    while True:
        await asyncio.sleep(settings.TOOLKEEPER_MCP_HEARTBEAT_S)
        beats += 1
        await ctx.session.report_progress(beats, None, f"call {call.call_id} is waiting")


def mcp_protocol_server() -> Server:
    # A schema of ours never names an `x-mcp-header`: without this, a 2026-era tools/call lists tools again.
    return Server("toolkeeper", on_list_tools=_list_tools, on_call_tool=_call_tool,
                  get_tool_input_schema=lambda name: None)
