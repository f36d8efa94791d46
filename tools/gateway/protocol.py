"""The governed MCP endpoint's protocol side (`/mcp/`, docs/mcp.md): an MCP client gets one agent session's
tool surface, and its calls go through the same pipeline as the REST API's.

The `mcp` SDK's low-level server answers the protocol, in its stateless mode: the SDK keeps nothing between
requests, so any server process answers any request. Which agent session a request speaks for comes with
the request, and the session itself (its active groups, its calls) lives in the database (`mcp_session`):

- a client of the 2025 protocol era opens with `initialize`; the answer opens a session of its own for the
  connection and names it in `Mcp-Session-Id`, which the client sends back with every later request;
- a client may name a session its app created through the REST API (`X-Toolkeeper-Session` or `?session=`);
- otherwise (the 2026 era has no connection at all) the request speaks for the key's MCP session of that
  agent, opened on first use.

The HTTP side (the API key, Host and Origin, routing) is `tools.gateway.entry`; it resolves the session
and hands it to the handlers here in the request's scope (`CALLER_SCOPE`).
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import math
import time
import warnings
from dataclasses import dataclass
from importlib import metadata

from channels.layers import get_channel_layer
from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.http import Http404
from django.utils import timezone
from mcp import types
from mcp.server import Server
from mcp.server.lowlevel.server import NotificationOptions
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError, UrlElicitationRequiredError
from mcp_types import CLIENT_CAPABILITIES_META_KEY, LOG_LEVEL_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from common.errors import Conflict, ServiceError
from common.tracing import TRACEPARENT
from realtime.groups import session_group
from tenancy.fastread import fetch_one
from tenancy.grants import grant_of_key
from tenancy.models import ApiKey
from tenancy.selectors import access_row, key_sees_agent, person_name
from tools.accounts.vault import connect_url
from tools.calls.events import call_failure
from tools.calls.questions import public_question
from tools.calls.runtime import runtime
from tools.calls.statements import session_calls_awaiting_approval
from tools.calls.submit import call_cancel, calls_submit
from tools.calls.waiting import WaitPlan, run_db
from tools.catalog.registry import META_SEARCH_TOOLS, RESERVED_TOOL_NAMES, resource_providers
from tools.catalog.selectors import (
    MCP_PRESENCE_S,
    mcp_presence_key,
    session_prompt,
    session_tools,
    visible_tool,
    withheld_from,
)
from tools.catalog.services import session_create
from tools.catalog.snapshot import ExposedTool
from tools.gateway import prompts as gateway_prompts
from tools.gateway.elicitation import (
    FORM_ELICITATION,
    answered_call,
    ask_on_stream,
    client_elicits_forms,
    input_required,
    input_responses_apply,
)
from tools.models import TERMINAL_STATUSES, AgentSession, CallStatus, HttpEndpoint, Tool, ToolCall

logger = logging.getLogger("toolkeeper.mcp")

CALLER_SCOPE = "toolkeeper.mcp_caller"
STREAM_SCOPE = "toolkeeper.mcp_stream"  # a resumable tools/call's event store (`tools.gateway.streams.CallStream`)
SESSION_HEADER = "X-Toolkeeper-Session"
AGENT_HEADER = "X-Toolkeeper-Agent"
CONNECTION_SESSION = "connection"  # a session opened by a 2025-era `initialize`
URL_ELICITATION = "mcp_url_elicitation"  # in its context: the connection's client can open a URL for its person
KEY_SESSION = "default"  # the key's session of an agent, for requests that name none
LOG_LEVEL = "mcp_log_level"  # in its context: the level a 2025-era connection set with `logging/setLevel`
SUBSCRIPTIONS = "mcp_resource_subscriptions"  # in its context: a 2025-era connection's {uri: stamp when subscribed}
MAX_SUBSCRIPTIONS = 100  # resource subscriptions per session
MAX_SUBSCRIBED_URI_CHARS = 1000
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")  # MCP's, rising
MAX_INSTRUCTIONS_CHARS = 8000  # of the `instructions` an `initialize` answers with
MAX_OUTPUT_PROBLEM_CHARS = 1000
ASKING_UNTIL = TERMINAL_STATUSES | {CallStatus.AWAITING_USER}  # a tools/call waits for these, then answers or asks
SETTLED_FOR_MCP = ASKING_UNTIL
QUESTION_POLL_S = 0.25


@dataclass(frozen=True)
class McpCaller:
    """Who an MCP request comes from and which agent session it speaks for."""
    api_key: ApiKey
    session: AgentSession
    opened: bool  # the session was opened by this request: its id goes back in `Mcp-Session-Id`


# When this process last noted each session's presence: a busy client is noted about every PRESENCE_EVERY_S,
# not on each request.
PRESENCE_EVERY_S = 15
_presence_noted: dict = {}


def mcp_presence_note(caller: McpCaller, *, force: bool = False) -> None:
    """Note that the session is being served over /mcp/ (the console shows it;
    `tools.catalog.selectors.mcp_presence`)."""
    session = caller.session
    now = time.monotonic()
    if not force and now - _presence_noted.get(session.pk, -PRESENCE_EVERY_S) < PRESENCE_EVERY_S:
        return
    if len(_presence_noted) > 10_000:
        _presence_noted.clear()
    _presence_noted[session.pk] = now
    kind = session.context.get("mcp") if isinstance(session.context, dict) else None
    how = {CONNECTION_SESSION: "connection", KEY_SESSION: "key"}.get(kind, "attached")
    try:
        cache.set(mcp_presence_key(session.pk), {"at": timezone.now().isoformat(), "how": how}, MCP_PRESENCE_S)
    except Exception:  # the console's hint is not worth failing a request for
        logger.warning("cannot note the MCP presence of session %s", session.pk, exc_info=True)


async def _presence_kept(caller: McpCaller) -> None:
    """While a call is waited for, the client is still there: its presence is noted again now and then."""
    while True:
        await asyncio.sleep(PRESENCE_EVERY_S * 2)
        await run_db(mcp_presence_note, caller, force=True)


class McpAccessError(Exception):
    """The request cannot be served before the protocol starts: answered with this HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _named_session(api_key: ApiKey, session_id: str) -> AgentSession:
    # A client acting for a person (an OAuth grant's key) reaches only its own sessions: another's, of the same
    # agent, would make its calls in that person's name.
    acts_for_a_person = getattr(api_key, "acting_for", None) is not None
    try:
        session = access_row(AgentSession, api_key.tenant, session_id,
                             allowed=lambda row: key_sees_agent(api_key, row.agent)
                             and (not acts_for_a_person or row.api_key_id == api_key.pk))
    except Http404:
        raise McpAccessError(404, "no such session for this API key") from None
    session.tenant = api_key.tenant
    return session


def elicits_urls(message) -> bool:
    """Whether a 2025-era `initialize` says the client can open a URL for its person (URL-mode elicitation)."""
    params = message.get("params") if isinstance(message, dict) else None
    capabilities = params.get("capabilities") if isinstance(params, dict) else None
    elicitation = capabilities.get("elicitation") if isinstance(capabilities, dict) else None
    return isinstance(elicitation, dict) and isinstance(elicitation.get("url"), dict)


def _client_elicits_urls(ctx, session: AgentSession) -> bool:
    """A 2026-era request carries the client's capabilities; a 2025-era connection said them at `initialize`."""
    capabilities = getattr(ctx.session, "client_capabilities", None)
    elicitation = getattr(capabilities, "elicitation", None) if capabilities is not None else None
    if elicitation is not None:
        return getattr(elicitation, "url", None) is not None
    return bool(session.context.get(URL_ELICITATION))


def mcp_session(*, api_key: ApiKey, named: str = "", agent: str = "", opening: bool = False,
                url_elicitation: bool = False, form_elicitation: bool = False) -> McpCaller:
    """The session an MCP request speaks for: the one it names (`Mcp-Session-Id`, or a REST session), a new
    one for a connection that is `opening` (noting whether its client can open URLs for its person), or the
    key's session of the agent."""
    if named:
        return McpCaller(api_key, _named_session(api_key, named), opened=False)
    if api_key.agent and agent and agent != api_key.agent:
        raise McpAccessError(403, f"this API key is locked to the agent {api_key.agent!r}")
    agent = api_key.agent or agent
    if not agent:
        raise McpAccessError(400, f"name the agent: the {AGENT_HEADER} header or ?agent= in the URL")
    tenant = api_key.tenant
    # A client with an OAuth grant acts for the person who consented: they are its sessions' verified user.
    person = getattr(api_key, "acting_for", None)
    user = {"user": person_name(person), "user_verified": True, "person": person} if person is not None else {}
    try:
        if opening:
            context = {"mcp": CONNECTION_SESSION, **({URL_ELICITATION: True} if url_elicitation else {}),
                       **({FORM_ELICITATION: True} if form_elicitation else {})}
            session = session_create(tenant=tenant, agent=agent, api_key=api_key, context=context, **user)
            return McpCaller(api_key, session, opened=True)
        # Two first requests at once may both open one; the oldest is the one every later request finds.
        session = AgentSession.objects.for_tenant(tenant).filter(
            api_key=api_key, agent=agent, context__mcp=KEY_SESSION).order_by("created_at", "id").first()
        if session is None:
            session = session_create(tenant=tenant, agent=agent, api_key=api_key, context={"mcp": KEY_SESSION},
                                     **user)
    except ServiceError as exc:
        raise McpAccessError(exc.status, exc.message) from None
    session.tenant = tenant
    return McpCaller(api_key, session, opened=False)


# The messages a 2026-era POST may carry that `tools.gateway.entry`'s lean reader answers, and which of their
# parameters it reads: anything else (another method, a task, a question's answers) goes through the SDK's entry.
LEAN_PARAMS = {"tools/call": frozenset({"name", "arguments", "_meta"}), "tools/list": frozenset({"cursor", "_meta"}),
               "ping": frozenset({"_meta"})}


def answers_alone(method: str, params) -> bool:
    """Whether answering this 2026-era request can send the client nothing before its answer, so that the answer
    is one JSON reply: no progress (no `progressToken`), no log messages (no log level), no question (a client
    that cannot be asked: no elicitation capability), no changed list (not a meta tool)."""
    known = LEAN_PARAMS.get(method) if isinstance(method, str) else None
    if known is None or not isinstance(params, dict) or not known.issuperset(params):
        return False
    meta = params.get("_meta", {})
    if not isinstance(meta, dict) or "progressToken" in meta or LOG_LEVEL_META_KEY in meta:
        return False
    capabilities = meta.get(CLIENT_CAPABILITIES_META_KEY)
    if not isinstance(capabilities, dict) or "elicitation" in capabilities:
        return False
    name = params.get("name")
    return not (isinstance(name, str) and name in RESERVED_TOOL_NAMES)


def _caller(ctx) -> McpCaller:
    return ctx.request.scope[CALLER_SCOPE]


async def _list_tools(ctx, params) -> types.ListToolsResult:
    caller = _caller(ctx)
    listed = await run_db(session_tools, caller.session, "mcp")
    return types.ListToolsResult(tools=[types.Tool.model_validate(tool) for tool in listed])


def call_tool_result(call: ToolCall, exposed: ExposedTool | None = None) -> types.CallToolResult:
    """A call as it ended up, as MCP's tool result: the tool's content and structure when it succeeded, an
    error result with the structured error otherwise, and `pending_approval` while a reviewer has it. A tool
    that declares an output schema (`exposed`) must have succeeded with structured content that matches it
    (MCP clients check it): a result that does not is an error result saying why, never a result that breaks
    the client."""
    if call.status == CallStatus.SUCCEEDED:
        result = call.result or {}
        structured = result.get("structured")
        problems = exposed.output_problems(structured) if exposed is not None else []
        if problems:
            why = "; ".join(problems[:5])[:MAX_OUTPUT_PROBLEM_CHARS]
            error = call_failure(call, error_type="InvalidOutput",
                                 message=f"the result does not match the tool's output schema: {why}")[0]["error"]
            said = {"type": "text", "text": f"InvalidOutput: {error['error']}"}
            return types.CallToolResult.model_validate({
                "content": [*(result.get("content") or []), said], "structuredContent": error, "isError": True})
        return types.CallToolResult.model_validate({
            "content": result.get("content") or [],
            **({"structuredContent": structured} if isinstance(structured, dict) else {}),
        })
    if call.status == CallStatus.AWAITING_USER:
        question = public_question(call) or {}
        text = (f"The call {call.call_id} waits for the user's answer until {question.get('expires_at')}: "
                f"{question.get('message', '')} The app answers it (POST /api/v1/calls/{call.pk}/answer); call "
                f"{call.tool_name} again with the same arguments to wait for it.")
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True,
                                    structured_content={"status": "awaiting_user", "call_id": call.call_id,
                                                        "id": str(call.pk), "expires_at": question.get("expires_at"),
                                                        "question": question})
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
    twin = next((pk for pk, call_input in session_calls_awaiting_approval(session, tool_name)
                 if call_input == arguments), None)
    return None if twin is None else fetch_one(ToolCall, tenant=session.tenant_id, pk=twin)


def _submitted(caller: McpCaller, spec: dict, cancel_key: str | None, traceparent: str | None = None,
               answered=None) -> tuple[ExposedTool | None, list[ToolCall]]:
    """The tool as the session sees it and the call: the one still awaiting approval for the same arguments,
    or a new one; (None, []) when the session has no such tool. One trip to the database pool. With a
    `cancel_key`, the call is remembered under it for a cancel of the request that may come (and a resumption of
    its stream, `tools.gateway.streams`)."""
    exposed = visible_tool(caller.session, spec["name"])
    if exposed is None:  # a tool withheld for review gets a call, which fails saying so (ToolDefinitionChanged)
        if not withheld_from(caller.session, spec["name"]):
            return None, []
        return None, calls_submit(session=caller.session, calls=[spec], api_key=caller.api_key,
                                  traceparent=traceparent)
    twin = _answered_call(caller, spec, answered) if answered else None
    twin = twin or pending_approval_twin(caller.session, spec["name"], spec["input"])
    calls = [twin] if twin is not None else calls_submit(session=caller.session, calls=[spec],
                                                         api_key=caller.api_key, traceparent=traceparent)
    if cancel_key is not None:
        cache.set(cancel_key, str(calls[0].pk), settings.TOOLKEEPER_MCP_MAX_WAIT_S + 60)
    return exposed, calls


def _answered_call(caller: McpCaller, spec: dict, answered) -> ToolCall | None:
    """A 2026-era retry that brings the answers to its call's question (`inputResponses`): the answers applied,
    the call they answer, when it is this session's call of this tool with these arguments."""
    input_responses_apply(caller, answered, actor=_actor(caller))
    for key in answered:
        call = answered_call(caller, key)
        if call is not None and call.tool_name == spec["name"] and call.input == spec["input"]:
            return call
    return None


async def _question_left(call: ToolCall, ends: float) -> ToolCall | None:
    """The call once its question is answered (or gone), read again every POLL_S; None at `ends`. A short read
    every so often, while the person answers on the client that waits here."""
    asked = (call.question or {}).get("expires_at")
    while time.monotonic() < ends:
        await asyncio.sleep(QUESTION_POLL_S)
        now = await run_db(fetch_one, ToolCall, tenant=call.tenant_id, pk=call.pk)
        if now is None:
            return None
        if now.status != CallStatus.AWAITING_USER or (now.question or {}).get("expires_at") != asked:
            return now
    return None


# How a client stops a call it asked for. A 2025-era client sends `notifications/cancelled` naming its
# request; in the stateless transport that comes in another HTTP request, maybe to another server process,
# so the call each request started is kept in the cache (shared by the processes) under the request's id,
# for as long as a request can wait. A 2026-era client sends no such message: closing the request's
# response stream is its cancel. A call waiting for a reviewer outlives a closed stream, though: that is
# what a dropped connection looks like too, and a retry attaches to the call.

def request_key(session_id, request_id) -> str:
    return f"mcp:request:{session_id}:{json.dumps(request_id)}"


def _actor(caller: McpCaller) -> str:
    return f"apikey:{caller.api_key.name}"


def mcp_request_cancelled(caller: McpCaller, request_id) -> ToolCall | None:
    """A 2025-era client cancelled its request `request_id`: the call it started is cancelled, if it is still
    open (a call waiting for a reviewer too: its request is withdrawn)."""
    call_pk = cache.get(request_key(caller.session.pk, request_id))
    call = fetch_one(ToolCall, tenant=caller.session.tenant_id, pk=call_pk) if call_pk else None
    if call is None or call.session_id != caller.session.pk or call.status in TERMINAL_STATUSES:
        return None
    try:
        return call_cancel(call=call, actor=_actor(caller))
    except Conflict:  # it settled meanwhile
        return None


def _call_abandoned(caller: McpCaller, call_pk) -> None:
    """A 2026-era client closed the stream of its call: the call stops, unless people have it."""
    call = fetch_one(ToolCall, tenant=caller.session.tenant_id, pk=call_pk)
    if call is not None and call.status not in TERMINAL_STATUSES:
        with contextlib.suppress(Conflict):
            call_cancel(call=call, actor=_actor(caller), sparing_people=True)


_abandoning: set[asyncio.Future] = set()  # cancels under way after their request's task ended


def _is_modern(ctx) -> bool:
    return ctx.request.headers.get("mcp-protocol-version") in MODERN_PROTOCOL_VERSIONS


async def _call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    caller = _caller(ctx)
    session = caller.session
    waiter = runtime().waiter
    spec = {"name": params.name, "input": params.arguments or {}}
    modern = _is_modern(ctx)
    cancel_key = None if modern else request_key(session.pk, ctx.request_id)
    stream = None if modern else ctx.request.scope.get(STREAM_SCOPE)  # its events' ids let the client resume
    polls = stream is not None and 0 < settings.TOOLKEEPER_MCP_POLL_AFTER_S < settings.TOOLKEEPER_MCP_MAX_WAIT_S
    # Both armed before the call exists: its settling and its first progress are not missed.
    async with ProgressFeed(session, progress=_progress_token(ctx) is not None, log_level=_log_level(ctx, session),
                            stream=stream) as feed:
        with waiter.watching(session.pk) as watch:
            answered = params.input_responses if modern else None
            exposed, calls = await run_db(_submitted, caller, spec, cancel_key, _traceparent(ctx), answered)
            if not calls:
                raise MCPError(code=types.INVALID_PARAMS,
                               message=f"no tool named {params.name!r} is available in this session")
            if stream is not None:
                stream.call_pk = str(calls[0].pk)
            timeout = settings.TOOLKEEPER_MCP_POLL_AFTER_S if polls else settings.TOOLKEEPER_MCP_MAX_WAIT_S
            ends = time.monotonic() + timeout
            while True:
                plan = WaitPlan(tenant_id=session.tenant_id, session_ids={session.pk}, calls=calls,
                                timeout=max(0.0, ends - time.monotonic()), until=ASKING_UNTIL,
                                grant=grant_of_key(caller.api_key), render=list, offline=lambda calls: True)
                if plan.waits():
                    relay = asyncio.ensure_future(feed.relay(ctx, calls[0])) if feed.wanted else None
                    present = asyncio.ensure_future(_presence_kept(caller))
                    try:
                        answer = await waiter.answer(plan, watch)
                    except asyncio.CancelledError:
                        if modern:  # this task is done for: the cancel runs on without it
                            abandoning = asyncio.ensure_future(run_db(_call_abandoned, caller, calls[0].pk))
                            _abandoning.add(abandoning)
                            abandoning.add_done_callback(_abandoning.discard)
                        raise
                    finally:
                        present.cancel()
                        if relay is not None:
                            await feed.stop(relay)
                    await feed.flush(ctx, calls[0])
                    if answer.refused:
                        raise MCPError(code=types.INVALID_REQUEST, message="the API key of this request was revoked")
                    calls = answer.payload
                asking = calls[0].status == CallStatus.AWAITING_USER and client_elicits_forms(ctx, session)
                if not asking or modern or not await ask_on_stream(ctx, calls[0]):
                    break
                # A 2025-era client answers with a POST of its own (`answer_apply`): wait for the question to go.
                moved = await _question_left(calls[0], ends)
                if moved is None:
                    break
                calls = [moved]
            if asking and modern:
                return input_required(calls[0])
            if polls and calls[0].status not in SETTLED_FOR_MCP:
                # SSE polling: the stream ends here, the call goes on; the client resumes with Last-Event-ID
                stream.hang_up()
                await asyncio.Event().wait()  # until the transport, its stream ended, cancels this handler
    if exposed is not None and exposed.is_meta and exposed.name != META_SEARCH_TOOLS \
            and calls[0].status == CallStatus.SUCCEEDED:
        await _surface_changed(ctx)  # the search only reads
    if (calls[0].status == CallStatus.FAILED and (calls[0].error or {}).get("errorType") == "AccountNotConnected"
            and _client_elicits_urls(ctx, session)
            and (asked := await run_db(_account_to_connect, calls[0])) is not None):
        raise UrlElicitationRequiredError([asked], message=calls[0].error.get("error", ""))
    return call_tool_result(calls[0], exposed)


def _account_to_connect(call: ToolCall) -> types.ElicitRequestURLParams | None:
    """The person's own account a call that failed `AccountNotConnected` needs (tools.accounts), as a URL for the
    client to open; the call made again after they connected it runs."""
    tool = Tool.objects.for_tenant(call.tenant_id).select_related("mcp_server__tenant").filter(pk=call.tool_id).first()
    if tool is None:
        return None
    upstream = tool.mcp_server
    if upstream is None:  # an HTTP tool of an OAuth provider
        endpoint = (HttpEndpoint.objects.for_tenant(call.tenant_id).select_related("oauth_provider__tenant")
                    .filter(tool_id=tool.pk).first())
        upstream = endpoint.oauth_provider if endpoint is not None else None
    if upstream is None:
        return None
    return types.ElicitRequestURLParams(
        message=f"{tool.name} acts as your own account at {upstream.name}: connect it, then call again.",
        url=connect_url(upstream), elicitation_id=str(call.pk))


async def _surface_changed(ctx) -> None:
    """A meta tool changed the session's surface: the client hears `tools/list_changed`, and
    `prompts/list_changed` (the prompts of the servers whose tools it sees follow its tools), on the stream of
    the call that changed it (in the stateless transport there is no other stream to send it on)."""
    try:
        await ctx.session.send_notification(types.ToolListChangedNotification(), related_request_id=ctx.request_id)
        await ctx.session.send_notification(types.PromptListChangedNotification(), related_request_id=ctx.request_id)
    except Exception:  # a client that cannot take it lists the tools again when it next needs them
        logger.info("tools/list_changed could not be sent", exc_info=True)


class ProgressFeed:
    """The session's call events, heard on the channel layer while a call is waited for, so the tool's own
    progress (`ctx.emit`, `ctx.progress`, upstream MCP progress) reaches the client as MCP progress, in order,
    and its log messages (`ctx.log`, an upstream server's, the platform's notes on the call) as MCP log messages
    at or above the client's level. When nothing comes for TOOLKEEPER_MCP_HEARTBEAT_S (a call with a reviewer,
    mostly), a heartbeat keeps the request alive: many clients give up after 60 s without progress. A client
    that asked for no progress is sent none, and one that asked for no log messages none of those.

    MCP wants every progress value above the one before: the tool's own numbers (`completed` of `total`) are
    sent as they are while they rise; an event without them (a text, a heartbeat) counts one up, or, once a
    total is known, moves up by the smallest step, so the numbers the tool gave stay what the client shows.

    `sent` counts the progress notifications sent, `after` is the last call event relayed and `last` the last
    progress value; a resumed stream (`tools.gateway.streams`) starts from all three, and `stream` learns which
    call event each progress value relayed, for the ids of its events."""

    FLUSH_S = 0.05  # after the call settled, how long to look for its last events still on their way

    def __init__(self, session: AgentSession, *, progress: bool = False, log_level: str | None = None, stream=None,
                 sent: int = 0, after: int = 0, last: float | None = None):
        self.group = session_group(session.tenant_id, session.pk)
        self.progress = progress
        self.log_level = log_level if log_level in LOG_LEVELS else None
        self.wanted = progress or self.log_level is not None
        self.stream = stream
        self.layer = None
        self.channel = ""
        self.sent = sent
        self.after = after
        self.last = last  # the last progress value sent
        self.total: float | None = None  # the last total the tool gave
        self._held: dict | None = None  # an event the relay received as it was stopped
        self._stopping = asyncio.Event()

    async def __aenter__(self) -> ProgressFeed:
        if not self.wanted:
            return self
        try:
            self.layer = get_channel_layer()
            # the process's one real channel (one receive loop): another prefix would be a second real channel,
            # and the layer's blocking read of either holds up the other's messages
            self.channel = await self.layer.new_channel()
            await self.layer.group_add(self.group, self.channel)
        except Exception:  # heartbeats alone, then
            logger.warning("cannot hear call progress on the channel layer", exc_info=True)
            self.layer = None
        return self

    async def __aexit__(self, *exc) -> None:
        if self.layer is not None:
            with contextlib.suppress(Exception):
                await self.layer.group_discard(self.group, self.channel)

    def _event(self, message: dict, call: ToolCall) -> tuple[int | None, str, dict] | None:
        """(seq, kind, data) of the call's event not relayed yet; None for another call's, or one sent already."""
        if message.get("call") != str(call.pk) or message.get("kind") not in ("progress", "output", "log", "status"):
            return None
        seq = message.get("seq")
        seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else None
        if seq is not None and seq <= self.after:  # sent already (a resumed stream read it back)
            return None
        data = message.get("data")
        return seq, message["kind"], data if isinstance(data, dict) else {}

    def _next_value(self, data: dict) -> tuple[float, float | None]:
        completed, total = data.get("completed"), data.get("total")
        if isinstance(completed, int | float) and not isinstance(completed, bool) and math.isfinite(completed) \
                and (self.last is None or completed > self.last):
            self.total = total if isinstance(total, int | float) and not isinstance(total, bool) and total > 0 \
                and math.isfinite(total) else None
            return float(completed), self.total
        if self.last is None:
            return 1.0, None
        if self.total is None:
            return float(math.floor(self.last) + 1), None
        return math.nextafter(self.last, math.inf), self.total

    async def _progress(self, ctx, text: str, data: dict | None = None) -> None:
        value, total = self._next_value(data or {})
        self.last = value
        self.sent += 1
        if self.stream is not None:
            self.stream.relayed(value, self.sent, self.after)
        await ctx.session.report_progress(value, total, text or None)

    async def _log(self, ctx, call: ToolCall, level: str, text: str) -> None:
        if self.log_level is None or LOG_LEVELS.index(level) < LOG_LEVELS.index(self.log_level) or not text:
            return
        await ctx.session.send_log_message(level, text[:MAX_LOG_MESSAGE_CHARS], logger=call.tool_name[:100],
                                           related_request_id=ctx.request_id)

    async def send(self, ctx, call: ToolCall, seq: int | None, kind: str, data: dict) -> bool:
        """Send what the call's event says to the client (a resumed stream replays the ones it missed through
        this too); whether anything was sent."""
        if seq is not None:
            self.after = max(self.after, seq)
        if kind == "log":
            level = data.get("level") if data.get("level") in LOG_LEVELS else "info"
            text = data.get("text")
            if isinstance(text, str) and text and self.log_level is not None:
                await self._log(ctx, call, level, text)
                return True
            return False
        if kind == "status":
            status = data.get("status")
            if self.log_level is None or not isinstance(status, str):
                return False
            level, text = STATUS_NOTES.get(status, ("debug", "call {call}: {status}"))
            await self._log(ctx, call, level, text.format(call=call.call_id, status=status))
            return True
        if not self.progress:
            return False
        await self._progress(ctx, str(data.get("text", "")), data)
        return True

    async def flush(self, ctx, call: ToolCall) -> None:
        """The call's events that arrived after the wait ended (its last progress, published just before it
        settled), so the client has them all, in order, before the result."""
        if self.layer is None:
            return
        if self._held is not None:
            held, self._held = self._held, None
            if (event := self._event(held, call)) is not None:
                await self.send(ctx, call, *event)
        while True:
            try:
                message = await asyncio.wait_for(self.layer.receive(self.channel), self.FLUSH_S)
            except TimeoutError:
                return
            if (event := self._event(message, call)) is not None:
                await self.send(ctx, call, *event)

    async def stop(self, relay: asyncio.Future) -> None:
        """End the relay once it has sent what it is sending: a progress notification cut off mid-way is lost."""
        self._stopping.set()
        try:
            await relay
        except asyncio.CancelledError:
            relay.cancel()
            raise

    async def relay(self, ctx, call: ToolCall) -> None:
        receiving: asyncio.Future | None = None
        stopping = asyncio.ensure_future(self._stopping.wait())
        loop = asyncio.get_running_loop()
        beat_s = settings.TOOLKEEPER_MCP_HEARTBEAT_S if self.progress else None
        beat_at = loop.time() + beat_s if beat_s is not None else math.inf
        try:
            while not self._stopping.is_set():
                if self.layer is not None and receiving is None:
                    receiving = asyncio.ensure_future(self.layer.receive(self.channel))
                wait = max(0.0, beat_at - loop.time()) if beat_s is not None else None
                done, _ = await asyncio.wait({stopping} | ({receiving} if receiving else set()), timeout=wait,
                                             return_when=asyncio.FIRST_COMPLETED)
                if receiving is not None and receiving in done:
                    message, receiving = receiving.result(), None
                elif self._stopping.is_set():
                    break
                else:
                    message = None
                if message is None:
                    if loop.time() < beat_at:
                        continue
                    await self._progress(ctx, f"call {call.call_id} is waiting")
                elif (event := self._event(message, call)) is None or not await self.send(ctx, call, *event) \
                        or event[1] not in ("progress", "output"):
                    continue  # not progress: the heartbeat's clock runs on
                if beat_s is not None:
                    beat_at = loop.time() + beat_s
        finally:
            stopping.cancel()
            if receiving is not None and receiving.done() and not receiving.cancelled() \
                    and receiving.exception() is None:
                self._held = receiving.result()
            elif receiving is not None:
                receiving.cancel()


# The platform's own notes on a call's moves, sent as log messages (level, text); other moves are debug notes.
STATUS_NOTES = {
    CallStatus.AWAITING_APPROVAL: ("notice", "call {call} is waiting for a reviewer's approval"),
    CallStatus.AWAITING_EXTERNAL: ("notice", "call {call} is waiting for its result from outside"),
    CallStatus.REJECTED: ("warning", "call {call} was rejected by a reviewer"),
    CallStatus.DENIED: ("warning", "call {call} was denied by a rule"),
    CallStatus.EXPIRED: ("warning", "call {call} expired before a reviewer decided"),
}
MAX_LOG_MESSAGE_CHARS = 2000


def _log_level(ctx, session: AgentSession) -> str | None:
    """The lowest level of log messages the client wants for this request: a 2026-era request says it in its
    `_meta`, a 2025-era connection set it with `logging/setLevel`; None: no log messages."""
    if _is_modern(ctx):
        level = _meta_value(ctx, LOG_LEVEL_META_KEY)
        return level if level in LOG_LEVELS else None
    return session_log_level(session)


def session_log_level(session: AgentSession) -> str | None:
    """The level a 2025-era connection set for its session with `logging/setLevel` (None: no log messages)."""
    level = session.context.get(LOG_LEVEL) if isinstance(session.context, dict) else None
    return level if level in LOG_LEVELS else None


def _meta_value(ctx, key: str):
    meta = ctx.meta
    if isinstance(meta, dict):
        return meta.get(key)
    return getattr(meta, "model_extra", None) and meta.model_extra.get(key)


def session_context_changed(session: AgentSession, change) -> None:
    """`change(context)` on the session's stored context, a copy, under the session's row lock: the MCP state a
    connection keeps in its session (its log level, its subscriptions), which any server process reads. `change`
    returns the new context, or None to leave it as it is."""
    with transaction.atomic():
        row = (AgentSession.objects.for_tenant(session.tenant_id).select_for_update()
               .filter(pk=session.pk).only("id", "context").first())
        if row is None:
            return
        changed = change(dict(row.context) if isinstance(row.context, dict) else {})
        if changed is not None:
            row.context = changed
            row.save(update_fields=["context"])


def mcp_log_level_set(session: AgentSession, level: str) -> None:
    """A 2025-era connection's `logging/setLevel`: kept in its session, where every later request (whichever
    server process answers it) reads it."""
    session_context_changed(session, lambda context: None if context.get(LOG_LEVEL) == level
                            else {**context, LOG_LEVEL: level})


async def _set_log_level(ctx, params: types.SetLevelRequestParams) -> types.EmptyResult:
    await run_db(mcp_log_level_set, _caller(ctx).session, params.level)
    return types.EmptyResult()


def _traceparent(ctx):
    """The client's trace context for a call (OpenTelemetry's MCP conventions): `params._meta.traceparent`, else the
    request's `traceparent` header. Whatever it is, a call's trace continues a valid one and ignores the rest."""
    found = _meta_value(ctx, TRACEPARENT)
    return found if isinstance(found, str) else ctx.request.headers.get(TRACEPARENT)


def _progress_token(ctx):
    meta = ctx.meta
    return meta.get("progress_token") if isinstance(meta, dict) else getattr(meta, "progress_token", None)


def _resources(session: AgentSession) -> tuple[list[dict], list[dict]]:
    resources, templates = [], []
    for provider in resource_providers():
        resources += provider.resources(session)
        templates += provider.templates(session)
    return resources, templates


async def _list_resources(ctx, params) -> types.ListResourcesResult:
    resources, _ = await run_db(_resources, _caller(ctx).session)
    return types.ListResourcesResult(resources=[types.Resource.model_validate(r) for r in resources])


async def _list_resource_templates(ctx, params) -> types.ListResourceTemplatesResult:
    _, templates = await run_db(_resources, _caller(ctx).session)
    return types.ListResourceTemplatesResult(
        resource_templates=[types.ResourceTemplate.model_validate(t) for t in templates])


def _read(session: AgentSession, uri: str) -> list[dict] | None:
    for provider in resource_providers():
        contents = provider.read(session, uri)
        if contents is not None:
            return contents
    return None


async def _read_resource(ctx, params) -> types.ReadResourceResult:
    uri = str(params.uri)
    contents = await run_db(_read, _caller(ctx).session, uri)
    if contents is None:
        raise MCPError(code=types.INVALID_PARAMS, message=f"no resource {uri[:300]!r} is available in this session")
    return types.ReadResourceResult.model_validate({"contents": contents})


async def _list_prompts(ctx, params) -> types.ListPromptsResult:
    return await gateway_prompts.list_prompts(_caller(ctx).session)


async def _get_prompt(ctx, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    caller = _caller(ctx)
    return await gateway_prompts.get_prompt(caller.session, _actor(caller), params)


async def _complete(ctx, params: types.CompleteRequestParams) -> types.CompleteResult:
    """`completion/complete`: a prompt's argument (governed as its get is, tools.gateway.prompts), or a resource
    template's variable, which nothing completes (an empty answer for a template the session is offered)."""
    session = _caller(ctx).session
    argument = params.argument.model_dump()
    context = params.context.arguments if params.context is not None and params.context.arguments else {}
    if isinstance(params.ref, types.PromptReference):
        return await gateway_prompts.complete_prompt_argument(session, params.ref.name, argument, context)
    _, templates = await run_db(_resources, session)
    if not any(template.get("uriTemplate") == params.ref.uri for template in templates):
        raise MCPError(code=types.INVALID_PARAMS, message="no such resource template is available in this session")
    return types.CompleteResult(completion=types.Completion(values=[]))


# --- resource subscriptions -------------------------------------------------------------------------------------
# A 2025-era connection subscribes with `resources/subscribe`; its subscriptions are kept in its session (any
# server process may serve its next request, or its notification stream), each with the resource's stamp when
# subscribed, so a change made before the stream next looks is not missed. The notification stream
# (`tools.gateway.streams`) compares the stamps whenever the tenant's surface may have changed. A 2026-era
# client names its resources in `subscriptions/listen` instead, for that stream alone.

def resource_stamps(session: AgentSession, uris: list[str]) -> dict[str, str | None]:
    """For each URI, a short text that changes whenever the resource's contents change for the session, or None
    when the session may not read it: a provider's own `stamps`, else a digest of what it reads."""
    stamps: dict[str, str | None] = dict.fromkeys(uris)
    for provider in resource_providers():
        missing = [uri for uri in uris if stamps[uri] is None]
        if not missing:
            break
        stamper = getattr(provider, "stamps", None)
        if stamper is not None:
            found = stamper(session, missing)
        else:
            found = {}
            for uri in missing:
                if (contents := provider.read(session, uri)) is not None:
                    listed = json.dumps(contents, sort_keys=True, separators=(",", ":"), default=str)
                    found[uri] = "digest:" + hashlib.sha256(listed.encode()).hexdigest()[:24]
        for uri in missing:
            if isinstance(found.get(uri), str):
                stamps[uri] = found[uri]
    return stamps


def session_subscriptions(session: AgentSession) -> dict[str, str | None]:
    """The resources a 2025-era connection subscribed to, with their stamps when it did."""
    return _subscriptions_in(session.context)


def _subscriptions_in(context) -> dict[str, str | None]:
    subscribed = context.get(SUBSCRIPTIONS) if isinstance(context, dict) else None
    if not isinstance(subscribed, dict):
        return {}
    return {uri: stamp for uri, stamp in subscribed.items() if isinstance(uri, str) and isinstance(stamp, str | None)}


def _subscriptions_changed(session: AgentSession, change) -> None:
    """`change(subscriptions)` on the session's subscriptions, kept under the session's row lock (False: nothing
    changed)."""
    def changed(context: dict) -> dict | None:
        subscribed = _subscriptions_in(context)
        if change(subscribed) is False:
            return None
        context[SUBSCRIPTIONS] = subscribed
        if not subscribed:
            del context[SUBSCRIPTIONS]
        return context

    session_context_changed(session, changed)


def mcp_resource_subscribe(session: AgentSession, uri: str) -> None:
    """`resources/subscribe`: a resource the session may read is remembered for it (at most MAX_SUBSCRIPTIONS).
    Anything else is JSON-RPC -32602, which says no more of a resource the session may not see than of one that
    does not exist."""
    if len(uri) > MAX_SUBSCRIBED_URI_CHARS:
        raise MCPError(code=types.INVALID_PARAMS,
                       message=f"a subscribed resource's URI is at most {MAX_SUBSCRIBED_URI_CHARS} characters")
    stamp = resource_stamps(session, [uri])[uri]
    if stamp is None:
        raise MCPError(code=types.INVALID_PARAMS, message=f"no resource {uri[:300]!r} is available in this session")

    def add(subscribed: dict) -> None:
        if uri not in subscribed and len(subscribed) >= MAX_SUBSCRIPTIONS:
            raise MCPError(code=types.INVALID_PARAMS, message=f"a session subscribes to at most {MAX_SUBSCRIPTIONS} "
                           "resources; unsubscribe from one first")
        subscribed[uri] = stamp

    _subscriptions_changed(session, add)


def mcp_resource_unsubscribe(session: AgentSession, uri: str) -> None:
    """`resources/unsubscribe`: forgotten, if it was subscribed."""
    _subscriptions_changed(session, lambda subscribed: subscribed.pop(uri, None) is not None)


async def _subscribe(ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
    await run_db(mcp_resource_subscribe, _caller(ctx).session, params.uri)
    return types.EmptyResult()


async def _unsubscribe(ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    await run_db(mcp_resource_unsubscribe, _caller(ctx).session, params.uri)
    return types.EmptyResult()


def resources_fingerprint(session: AgentSession) -> str:
    """A short digest of the resources and templates the session may list."""
    listed = json.dumps(_resources(session), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(listed.encode()).hexdigest()[:24]


class _GovernedServer(Server):
    def create_initialization_options(self, notification_options=None, *args, **kwargs):
        # The handshake says what the notification stream does (`tools.gateway.streams`): a changed tool list or
        # resource list is announced.
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True, prompts_changed=True,
                                                        resources_changed=True), *args, **kwargs)


def _version() -> str:
    try:
        return metadata.version("toolkeeper")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return ""


def _guarded(handler):
    """`handler`, whose unexpected failure reaches the client as JSON-RPC's internal error without its text: the
    SDK would send the exception's own words (a database's message, a fragment of SQL). The log has it whole."""
    @functools.wraps(handler)
    async def guarded(ctx, params):
        try:
            return await handler(ctx, params)
        except MCPError:
            raise
        except Exception:
            logger.exception("the MCP handler %s failed", handler.__name__)
            raise MCPError(code=types.INTERNAL_ERROR, message="Internal error; the server logged it.") from None

    return guarded


def mcp_instructions(session: AgentSession) -> str:
    """What an MCP client is told at `initialize` (and a 2026-era client by `server/discover`): the session's
    system-prompt fragment, the one `GET /api/v1/sessions/{id}/prompt` gives an app (the active groups' notes,
    the optional groups, the skills), at most MAX_INSTRUCTIONS_CHARS."""
    text = session_prompt(session)
    if len(text) <= MAX_INSTRUCTIONS_CHARS:
        return text
    note = "\n\n[shortened: the whole text is at GET /api/v1/sessions/<id>/prompt]"
    kept = text[:MAX_INSTRUCTIONS_CHARS - len(note)]
    return kept[:kept.rfind("\n")] + note if "\n" in kept else kept + note


async def _instructions_added(ctx, call_next):
    """Middleware of the SDK's server: the answer to `initialize` and `server/discover` carries the instructions
    of the session the request speaks for, built now (the SDK's own are one text for every client)."""
    result = await call_next(ctx)
    if ctx.method not in ("initialize", "server/discover") or not isinstance(result, dict):
        return result
    caller = ctx.request.scope.get(CALLER_SCOPE) if ctx.request is not None else None
    if caller is None:
        return result
    try:
        text = await run_db(mcp_instructions, caller.session)
    except Exception:  # the handshake goes on without them
        logger.exception("the instructions of session %s could not be built", caller.session.pk)
        return result
    return {**result, "instructions": text} if text else result


def mcp_protocol_server(*, on_listen=None) -> Server:
    """The protocol server. `on_listen`: the handler of a 2026-era `subscriptions/listen` (the session's change
    notifications, `tools.gateway.streams.surface_listen`)."""
    # A schema of ours never names an `x-mcp-header`: without this, a 2026-era tools/call lists tools again.
    with warnings.catch_warnings():  # logging is deprecated from the 2026 era on; 2025-era clients still use it
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        server = _GovernedServer(
            "toolkeeper", version=_version(), on_list_tools=_guarded(_list_tools), on_call_tool=_guarded(_call_tool),
            on_list_resources=_guarded(_list_resources), on_list_resource_templates=_guarded(_list_resource_templates),
            on_read_resource=_guarded(_read_resource), on_subscribe_resource=_guarded(_subscribe),
            on_unsubscribe_resource=_guarded(_unsubscribe), on_list_prompts=_guarded(_list_prompts),
            on_get_prompt=_guarded(_get_prompt), on_completion=_guarded(_complete),
            on_set_logging_level=_guarded(_set_log_level),
            get_tool_input_schema=lambda name: None,
            **({"on_subscriptions_listen": _guarded(on_listen)} if on_listen else {}))
    server.middleware.append(_instructions_added)
    return server
