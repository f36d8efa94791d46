"""`/mcp/`'s streams beyond one request and its answer (docs/mcp.md, "Streams", "Notifications" and "Resources
and subscriptions").

- The notification stream: a 2025-era client's `GET /mcp/` stays open, and hears
  `notifications/tools/list_changed` whenever what its session may see really changed, whatever changed it and
  in whichever process (`tools.catalog.snapshot.surface_announce`, heard on the channel layer): the stream keeps
  its session's surface fingerprint and compares it with the new one. The same way, it hears
  `notifications/resources/list_changed` when the session's resource list changed, and
  `notifications/resources/updated` when a resource the session subscribed to changed (a stamp of each,
  `tools.gateway.protocol.resource_stamps`). A 2026-era `subscriptions/listen` hears the same, as it asks.
- Resumable call streams: the SSE stream of a `tools/call` opens with a priming event and numbers every event
  with an id; a client whose stream dropped sends `GET /mcp/` with `Last-Event-ID` and receives the call's
  progress it missed (read back from the call's numbered events, `CallEvent.seq`) and its result, without the
  call running again. With TOOLKEEPER_MCP_POLL_AFTER_S the server itself ends a long call's stream after that
  long, and the client comes back for the rest (SSE polling).

The SDK's stateless transport keeps nothing between requests, and any process may serve a resumed stream, so
an event id carries what a resumption needs (the request, the call, the last call event sent), signed with the
deployment's secret and bound to the API key and session that received it: an id of another key or session, a
forged or altered one, or one older than TOOLKEEPER_MCP_RESUME_S resumes nothing.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskStatus
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.cache import cache
from django.utils.crypto import constant_time_compare, salted_hmac
from mcp import types
from mcp.server.connection import Connection
from mcp.server.runner import serve_connection
from mcp.server.streamable_http import GET_STREAM_KEY, EventStore, StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.subscriptions import (
    SUBSCRIPTION_ID_META_KEY,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ToolsListChanged,
    event_to_notification,
)
from mcp.shared.transport_context import TransportContext
from mcp_types import DEFAULT_NEGOTIATED_VERSION

from realtime.groups import surface_group
from tenancy.entry.bodies import Refusal
from tenancy.fastread import fetch_one
from tenancy.grants import grant_of_key
from tools.calls.runtime import runtime
from tools.calls.waiting import WaitPlan, run_db
from tools.catalog.selectors import call_events, session_tools
from tools.gateway.prompts import prompt_listing, session_prompts
from tools.gateway.protocol import (
    CALLER_SCOPE,
    MAX_SUBSCRIBED_URI_CHARS,
    MAX_SUBSCRIPTIONS,
    STREAM_SCOPE,
    McpCaller,
    ProgressFeed,
    call_tool_result,
    request_key,
    resource_stamps,
    resources_fingerprint,
    session_log_level,
    session_subscriptions,
)
from tools.models import TERMINAL_STATUSES, AgentSession, ToolCall

logger = logging.getLogger("toolkeeper.mcp")

ID_VERSION = "tk1"
EVENT_ID = re.compile(r"tk1\.([A-Za-z0-9_-]{1,1400})\.([0-9a-f]{32})")
MAX_ID_PART = 300  # characters of a request id or progress token an event id carries; longer: not resumable
PING_S = 15  # a comment on an idle stream this often keeps proxies and clients from closing it
COALESCE_S = 0.05  # announcements arriving together (one sync adding many tools) are compared once
LIST_CHANGED = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/tools/list_changed")
RESOURCES_LIST_CHANGED = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/resources/list_changed")
PROMPTS_LIST_CHANGED = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/prompts/list_changed")
RESOURCE_UPDATED = "notifications/resources/updated"
PROGRESS = "notifications/progress"
STREAM_UNAVAILABLE = Refusal(503, "Service Unavailable", "unavailable", "The stream cannot be served now; retry.")


class StreamIdRefused(Exception):
    """A `Last-Event-ID` that is no event id of ours at all (its status: 400)."""


# --- event ids --------------------------------------------------------------------------------------------

def _mac(caller: McpCaller, body: str) -> str:
    return salted_hmac("toolkeeper.mcp.stream", f"{caller.api_key.pk}.{caller.session.pk}.{body}",
                       algorithm="sha256").hexdigest()[:32]


def event_id(caller: McpCaller, payload: list) -> str:
    """An id for an event of one of the caller's streams: `payload` and the time, signed for its key and session."""
    raw = json.dumps([*payload, int(time.time())], separators=(",", ":")).encode()
    body = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    return f"{ID_VERSION}.{body}.{_mac(caller, body)}"


def event_of(caller: McpCaller, value: str) -> list | None:
    """The payload of an event id minted for this caller's key and session within TOOLKEEPER_MCP_RESUME_S, or
    None (another's, altered, expired). StreamIdRefused when `value` is not shaped as our ids are."""
    found = EVENT_ID.fullmatch(value)
    if found is None:
        raise StreamIdRefused("Last-Event-ID is not an event id of this endpoint")
    body, mac = found.groups()
    if not constant_time_compare(mac, _mac(caller, body)):
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (binascii.Error, ValueError):
        return None
    if not isinstance(payload, list) or not payload or not isinstance(payload[-1], int):
        return None
    if time.time() - payload[-1] > settings.TOOLKEEPER_MCP_RESUME_S:
        return None
    return payload[:-1]


# --- what a session sees ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class SessionView:
    """What a session sees, as its streams compare it: digests of its tool list, of its resource list and of its
    prompt list, the resources its connection subscribed to (with their stamps when it did), and the watched
    resources' stamps now (`tools.gateway.protocol.resource_stamps`)."""
    tools: str
    resources: str
    prompts: str = ""
    subscribed: dict[str, str | None] = field(default_factory=dict)
    stamps: dict[str, str | None] = field(default_factory=dict)


def session_view(tenant_id: int, session_id, *, uris: list[str] | None = None) -> SessionView | None:
    """The session's view now, None when the session is gone. `uris`: the resources a 2026-era listen stream
    watches; without them, the ones the session subscribed to."""
    session = AgentSession.objects.for_tenant(tenant_id).select_related("tenant").filter(pk=session_id).first()
    if session is None:
        return None
    listed = json.dumps(session_tools(session, "mcp"), sort_keys=True, separators=(",", ":"), default=str)
    tools = hashlib.sha256(listed.encode()).hexdigest()[:24]
    subscribed = session_subscriptions(session) if uris is None else dict.fromkeys(uris)
    prompts = json.dumps([prompt_listing(p).model_dump(mode="json") for p in session_prompts(session)],
                         sort_keys=True, separators=(",", ":"))
    return SessionView(tools=tools, resources=resources_fingerprint(session),
                       prompts=hashlib.sha256(prompts.encode()).hexdigest()[:24], subscribed=subscribed,
                       stamps=resource_stamps(session, list(subscribed)) if subscribed else {})


def stamps_digest(stamps: dict[str, str | None]) -> str:
    listed = json.dumps(sorted(stamps.items()), separators=(",", ":"))
    return hashlib.sha256(listed.encode()).hexdigest()[:24]


@dataclass
class Changes:
    """What changed for a session since its stream last said: its tools, its resources, its prompts, which watched
    resources."""
    tools: bool = False
    resources: bool = False
    updated: list[str] = field(default_factory=list)
    ended: bool = False  # the session is gone
    prompts: bool = False

    def __bool__(self) -> bool:
        return self.tools or self.resources or self.prompts or bool(self.updated) or self.ended


class SurfaceWatch:
    """Announcements of the session's tenant on the channel layer, and what they changed of what the session
    sees. `uris`: the resources a 2026-era listen stream watches; without them (a 2025-era notification stream)
    the watched resources are the session's subscriptions, read again each time, so that subscribing and
    unsubscribing, in any process, take effect on every stream of the session."""

    def __init__(self, session: AgentSession, *, uris: list[str] | None = None):
        self.tenant_id = session.tenant_id
        self.session_id = str(session.pk)
        self.group = surface_group(session.tenant_id)
        self.uris = uris
        self.layer = None
        self.channel = ""
        self.fingerprint: str | None = None  # of the tool list
        self.resources = ""  # of the resource list
        self.prompts = ""  # of the prompt list
        self.stamps: dict[str, str | None] = {}  # of the watched resources, as last said

    def _view(self) -> SessionView | None:
        return session_view(self.tenant_id, self.session_id, uris=self.uris)

    async def __aenter__(self) -> SurfaceWatch:
        self.layer = get_channel_layer()
        self.channel = await self.layer.new_channel()
        await self.layer.group_add(self.group, self.channel)  # before the first look: no change falls between
        view = await run_db(self._view)
        if view is not None:
            self.fingerprint, self.resources, self.prompts, self.stamps = (view.tools, view.resources, view.prompts,
                                                                           view.stamps)
        return self

    async def __aexit__(self, *exc) -> None:
        with contextlib.suppress(Exception):
            await self.layer.group_discard(self.group, self.channel)

    def state(self) -> list:
        """What a resumed stream compares with (in its event ids): the digests of what was last said."""
        return [self.fingerprint, self.resources, stamps_digest(self.stamps), self.prompts]

    def _concerns(self, message: dict) -> bool:
        return message.get("type") == "surface.changed" and message.get("session", "") in ("", self.session_id)

    def compare(self, view: SessionView | None) -> Changes:
        """What differs in `view` from what was last said; `view` is then what was said."""
        if view is None:
            self.fingerprint = None
            return Changes(ended=True)
        changes = Changes(tools=view.tools != self.fingerprint, resources=view.resources != self.resources,
                          prompts=view.prompts != self.prompts)
        # a resource subscribed since the last look is compared with its stamp when it was subscribed
        changes.updated = [uri for uri, stamp in view.stamps.items()
                           if stamp != self.stamps.get(uri, view.subscribed.get(uri))]
        self.fingerprint, self.resources, self.prompts, self.stamps = (view.tools, view.resources, view.prompts,
                                                                       view.stamps)
        return changes

    async def changes(self) -> Changes:
        """Wait for an announcement that concerns the session, and say what it changed (maybe nothing)."""
        while not self._concerns(await self.layer.receive(self.channel)):
            pass
        with contextlib.suppress(TimeoutError):
            while True:  # the rest of a burst
                await asyncio.wait_for(self.layer.receive(self.channel), COALESCE_S)
        return self.compare(await run_db(self._view))


# --- SSE on the wire ----------------------------------------------------------------------------------------

class Sse:
    """An SSE response written straight to the ASGI `send`."""

    def __init__(self, send, caller: McpCaller):
        self.send = send
        self.caller = caller
        self.started = False

    async def failed(self) -> None:
        """Something failed (the database, the channel layer): a clear 503 if nothing was sent yet, else the end."""
        logger.exception("an MCP stream failed")
        with contextlib.suppress(Exception):
            if self.started:
                await self.end()
            else:
                await STREAM_UNAVAILABLE.send(self.send, "/mcp/")

    async def start(self) -> None:
        self.started = True
        await self.send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache, no-transform"),
            (b"x-accel-buffering", b"no"), (b"mcp-session-id", str(self.caller.session.pk).encode())]})

    async def event(self, *, event: str, data: str = "", retry: int | None = None) -> None:
        frame = f"id: {event}\n" + (f"retry: {retry}\n" if retry is not None else "") \
            + (f"event: message\ndata: {data}\n\n" if data else "data: \n\n")
        await self.send({"type": "http.response.body", "body": frame.encode(), "more_body": True})

    async def message(self, message: types.JSONRPCMessage | dict, *, event: str) -> None:
        data = message if isinstance(message, dict) else message.model_dump(by_alias=True, exclude_unset=True,
                                                                             mode="json")
        await self.event(event=event, data=json.dumps(data, separators=(",", ":")))

    async def ping(self) -> None:
        await self.send({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})

    async def end(self) -> None:
        await self.send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


# --- the notification stream ----------------------------------------------------------------------------------

def _updated(uri: str) -> dict:
    return {"jsonrpc": "2.0", "method": RESOURCE_UPDATED, "params": {"uri": uri}}


async def notification_stream(caller: McpCaller, receive, send, *, known: list | None = None) -> None:
    """`GET /mcp/`: the session's notifications until the client goes. `known`: what the client last heard of (a
    resumed stream: the digests of its tool list, and maybe of its resource list and subscribed resources); a
    change it missed is announced at once (for subscribed resources: each of them, since which one is not
    known)."""
    sse = Sse(send, caller)
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        async with SurfaceWatch(caller.session) as watch:
            await sse.start()
            await sse.event(event=event_id(caller, ["n", *watch.state()]), retry=settings.TOOLKEEPER_MCP_RETRY_MS)
            if known is not None:
                tools, resources, stamps, prompts = (*known, None, None, None)[:4]
                missed = Changes(tools=tools != watch.fingerprint,
                                 resources=resources is not None and resources != watch.resources,
                                 prompts=prompts is not None and prompts != watch.prompts,
                                 updated=list(watch.stamps) if stamps is not None
                                 and stamps != stamps_digest(watch.stamps) else [])
                await _say(sse, caller, watch, missed)
            changing = asyncio.ensure_future(watch.changes())
            try:
                while not gone.done():
                    done, _ = await asyncio.wait({gone, changing}, timeout=PING_S,
                                                 return_when=asyncio.FIRST_COMPLETED)
                    if changing in done:
                        changes = changing.result()
                        if changes.ended:
                            break
                        await _say(sse, caller, watch, changes)
                        changing = asyncio.ensure_future(watch.changes())
                    elif not done:
                        await sse.ping()
            finally:
                changing.cancel()
        if not gone.done():
            await sse.end()
    except OSError:  # the client went while a frame was written
        pass
    except Exception:
        await sse.failed()
    finally:
        gone.cancel()


async def _say(sse: Sse, caller: McpCaller, watch: SurfaceWatch, changes: Changes) -> None:
    """The notifications `changes` calls for, on a 2025-era notification stream."""
    said = event_id(caller, ["n", *watch.state()])
    if changes.tools:
        await sse.message(LIST_CHANGED, event=said)
    if changes.resources:
        await sse.message(RESOURCES_LIST_CHANGED, event=said)
    if changes.prompts:
        await sse.message(PROMPTS_LIST_CHANGED, event=said)
    for uri in changes.updated:
        await sse.message(_updated(uri), event=said)


def _listened_uris(requested) -> list[str]:
    """The resources a 2026-era listen stream watches, within the bounds of a session's subscriptions."""
    uris = list(dict.fromkeys(requested or ()))
    if len(uris) > MAX_SUBSCRIPTIONS:
        raise MCPError(code=types.INVALID_PARAMS, message=f"a listen stream watches at most {MAX_SUBSCRIPTIONS} "
                       "resources")
    if any(len(uri) > MAX_SUBSCRIBED_URI_CHARS for uri in uris):
        raise MCPError(code=types.INVALID_PARAMS,
                       message=f"a subscribed resource's URI is at most {MAX_SUBSCRIBED_URI_CHARS} characters")
    return uris


async def surface_listen(ctx, params: types.SubscriptionsListenRequestParams) -> types.SubscriptionsListenResult:
    """A 2026-era `subscriptions/listen`: the era's notification stream, on the request's own response stream.
    Honored: `toolsListChanged`, `resourcesListChanged` and `resourceSubscriptions` (every URI asked for, as a
    subscription is honored whether or not its resource exists: a change is said only of what the session may
    read, or could read and no longer can) and `promptsListChanged`, sent as the GET stream's are."""
    caller: McpCaller = ctx.request.scope[CALLER_SCOPE]
    meta = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
    asked = params.notifications
    uris = _listened_uris(asked.resource_subscriptions)
    honored = types.SubscriptionFilter(tools_list_changed=True if asked.tools_list_changed else None,
                                       prompts_list_changed=True if asked.prompts_list_changed else None,
                                       resources_list_changed=True if asked.resources_list_changed else None,
                                       resource_subscriptions=uris or None)
    async with SurfaceWatch(caller.session, uris=uris) as watch:
        await ctx.session.send_notification(types.SubscriptionsAcknowledgedNotification(
            params=types.SubscriptionsAcknowledgedNotificationParams(notifications=honored, _meta=meta)),
            related_request_id=ctx.request_id)
        if not (honored.tools_list_changed or honored.prompts_list_changed or honored.resources_list_changed or uris):
            await asyncio.Event().wait()  # nothing to send until the client closes the stream
        while True:
            changes = await watch.changes()
            if changes.ended:
                break
            events = [*([ToolsListChanged()] if changes.tools and honored.tools_list_changed else []),
                      *([ResourcesListChanged()] if changes.resources and honored.resources_list_changed else []),
                      *([PromptsListChanged()] if changes.prompts and honored.prompts_list_changed else []),
                      *(ResourceUpdated(uri=uri) for uri in changes.updated)]
            for event in events:
                await ctx.session.send_notification(event_to_notification(event, meta),
                                                    related_request_id=ctx.request_id)
    return types.SubscriptionsListenResult(_meta=meta)


# --- resumable call streams ------------------------------------------------------------------------------------

class CallStream(EventStore):
    """The event store of one `tools/call` request's stream: it keeps nothing, it names each event with an id that
    says how far the client got (`event_id`). The protocol side tells it the call (`call_pk`), which call event
    each progress notification relayed (`relayed`), and may end the stream early (`hang_up`)."""

    def __init__(self, caller: McpCaller, request_id, progress_token):
        self.caller = caller
        self.request_id = request_id
        self.progress_token = progress_token
        self.call_pk = ""
        # progress value sent → (how many notifications were sent by then, the last call event seq relayed by
        # then): values rise on a stream, so each names one notification, which may be written out later
        self.seq_of: dict[float, tuple[int, int]] = {}
        self.latest: tuple[int, int, float | None] = (0, 0, None)  # (number, seq, value) of the last one relayed
        self.transport: StreamableHTTPServerTransport | None = None

    def relayed(self, value: float, number: int, seq: int) -> None:
        self.seq_of[value] = (number, seq)
        self.latest = (number, seq, value)

    def _payload(self, number: int, seq: int, last: float | None) -> list:
        return ["c", self.request_id, self.progress_token, self.call_pk, seq, number, last]

    def payload_now(self) -> list:
        number, seq, last = self.latest
        return self._payload(number, seq, last)

    async def store_event(self, stream_id, message) -> str:
        if stream_id == GET_STREAM_KEY:
            return ""
        params = getattr(message, "params", None) if message is not None else None
        if getattr(message, "method", None) == PROGRESS and isinstance(params, dict) \
                and params.get("progress") in self.seq_of:
            value = params["progress"]
            number, seq = self.seq_of[value]
            return event_id(self.caller, self._payload(number, seq, value))
        return event_id(self.caller, self.payload_now())

    async def replay_events_after(self, last_event_id, send_callback):  # resumption is `resume_call`'s
        return None

    def hang_up(self) -> None:
        """End the request's stream without its answer: the client comes back with Last-Event-ID."""
        if self.transport is not None:
            self.transport.close_sse_stream(str(self.request_id))


def resumable_call(caller: McpCaller, message) -> CallStream | None:
    """The event store for a POST that carries a `tools/call` request, when its stream can be resumed."""
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return None
    request_id = message.get("id")
    params = message.get("params") if isinstance(message.get("params"), dict) else {}
    meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
    token = meta.get("progressToken")
    well_typed = isinstance(request_id, str | int) and isinstance(token, str | int | None) \
        and not isinstance(request_id, bool) and not isinstance(token, bool)
    if not well_typed or len(json.dumps([request_id, token])) > MAX_ID_PART:
        return None
    return CallStream(caller, request_id, token)


class _ProgressWriter:
    """What `ProgressFeed` sends progress through (`ctx.session.report_progress`), on a resumed stream."""

    def __init__(self, sse: Sse, stream: CallStream):
        self.session = self
        self.sse = sse
        self.stream = stream

    async def report_progress(self, progress, total, message) -> None:
        params = {"progressToken": self.stream.progress_token, "progress": progress,
                  **({"total": total} if total is not None else {}), **({"message": message} if message else {})}
        number, seq = self.stream.seq_of.get(progress, self.stream.latest[:2])
        await self.sse.message({"jsonrpc": "2.0", "method": PROGRESS, "params": params},
                               event=event_id(self.stream.caller, self.stream._payload(number, seq, progress)))

    async def send_log_message(self, level, data, logger=None, related_request_id=None) -> None:
        params = {"level": level, "data": data, **({"logger": logger} if logger else {})}
        await self.sse.message({"jsonrpc": "2.0", "method": "notifications/message", "params": params},
                               event=event_id(self.stream.caller, self.stream.payload_now()))


def _call_of(caller: McpCaller, stream: CallStream) -> ToolCall | None:
    call_pk = stream.call_pk or cache.get(request_key(caller.session.pk, stream.request_id))
    if not call_pk:
        return None
    call = fetch_one(ToolCall, tenant=caller.session.tenant_id, pk=call_pk)
    return call if call is not None and call.session_id == caller.session.pk else None


def _missed(call: ToolCall, after: int) -> list[tuple[int, str, dict]]:
    return [(e.seq, e.kind, e.data if isinstance(e.data, dict) else {}) for e in call_events(call, after)
            if e.kind in ("progress", "output", "log", "status")]


async def resume_call(caller: McpCaller, payload: list, receive, send) -> bool:
    """Resume a call's stream from the event the client last had: the progress it missed, then the result (or, with
    SSE polling, an end to come back after). False when the payload names no call of this session."""
    _, request_id, token, call_pk, seq, number, last = payload
    stream = CallStream(caller, request_id, token)
    stream.call_pk = call_pk
    if last is not None:
        stream.relayed(last, number, seq)
    call = await run_db(_call_of, caller, stream)
    if call is None:
        return False
    stream.call_pk = str(call.pk)
    sse = Sse(send, caller)
    writer = _ProgressWriter(sse, stream)
    session = caller.session
    waiter = runtime().waiter
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await sse.start()
        await sse.event(event=event_id(caller, stream._payload(number, seq, last)),
                        retry=settings.TOOLKEEPER_MCP_RETRY_MS)
        async with ProgressFeed(session, progress=token is not None, log_level=session_log_level(session),
                                stream=stream, sent=number, after=seq, last=last) as feed:
            with waiter.watching(session.pk) as watch:
                call = await run_db(fetch_one, ToolCall, tenant=session.tenant_id, pk=call.pk)
                if feed.wanted:
                    for event_seq, kind, data in await run_db(_missed, call, seq):
                        await feed.send(writer, call, event_seq, kind, data)
                wait_s = _wait_s()
                plan = WaitPlan(tenant_id=session.tenant_id, session_ids={session.pk}, calls=[call], timeout=wait_s,
                                until=TERMINAL_STATUSES, grant=grant_of_key(caller.api_key), render=list,
                                offline=lambda calls: True)
                if plan.waits():
                    relay = asyncio.ensure_future(feed.relay(writer, call)) if feed.wanted else None
                    waiting = asyncio.ensure_future(waiter.answer(plan, watch))
                    try:
                        await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        if relay is not None:
                            await feed.stop(relay)
                    if not waiting.done():  # the client went again; the call goes on
                        waiting.cancel()
                        return True
                    answer = waiting.result()
                    await feed.flush(writer, call)
                    if answer.refused:
                        error = {"code": types.INVALID_REQUEST, "message": "the API key of this request was revoked"}
                        await sse.message({"jsonrpc": "2.0", "id": request_id, "error": error},
                                          event=event_id(caller, stream.payload_now()))
                        await sse.end()
                        return True
                    call = answer.payload[0]
                    if call.status not in TERMINAL_STATUSES and _polling():  # come back again later
                        await sse.end()
                        return True
        result = call_tool_result(call).model_dump(by_alias=True, exclude_none=True, mode="json")
        await sse.message({"jsonrpc": "2.0", "id": request_id, "result": result},
                          event=event_id(caller, stream.payload_now()))
        await sse.end()
    except OSError:
        pass
    except Exception:
        await sse.failed()
    finally:
        gone.cancel()
    return True


def _polling() -> bool:
    return 0 < settings.TOOLKEEPER_MCP_POLL_AFTER_S < settings.TOOLKEEPER_MCP_MAX_WAIT_S


def _wait_s() -> float:
    return settings.TOOLKEEPER_MCP_POLL_AFTER_S if _polling() else settings.TOOLKEEPER_MCP_MAX_WAIT_S


# --- the session manager ------------------------------------------------------------------------------------

class _PrimedTransport(StreamableHTTPServerTransport):
    """Every resumable stream opens with its priming event, whatever 2025-era version its client speaks: the
    version only says whether the SDK may end a stream early, which this endpoint does itself (`hang_up`)."""

    async def _mint_priming_event(self, stream_id, protocol_version):
        return await super()._mint_priming_event(stream_id, max(protocol_version, "2025-11-25"))


class GatewaySessionManager(StreamableHTTPSessionManager):
    """The SDK's stateless session manager, with the event store of each `tools/call` request (`CallStream`, in
    the request's scope under STREAM_SCOPE) on that request's transport: the SDK's own stateless mode has none."""

    async def _handle_stateless_request(self, protocol_version_hint, scope, receive, send) -> None:
        stream: CallStream | None = scope.get(STREAM_SCOPE)
        if stream is None:
            await super()._handle_stateless_request(protocol_version_hint, scope, receive, send)
            return
        transport = _PrimedTransport(mcp_session_id=None, is_json_response_enabled=self.json_response,
                                     event_store=stream, security_settings=self.security_settings,
                                     retry_interval=self.retry_interval)
        stream.transport = transport

        async def run_stateless_server(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED):
            async with transport.connect() as (read_stream, write_stream):
                task_status.started()
                dispatcher: JSONRPCDispatcher[TransportContext] = JSONRPCDispatcher(
                    read_stream, write_stream, inline_methods=frozenset({"initialize"}),
                    transport_builder=lambda _md: TransportContext(kind="streamable-http", can_send_request=False))
                connection = Connection.from_envelope(protocol_version_hint or DEFAULT_NEGOTIATED_VERSION, None, None)
                try:
                    await serve_connection(self.app, dispatcher, connection=connection,
                                           lifespan_state=self._lifespan_state)
                except Exception:
                    logger.exception("a stateless MCP request's server failed")

        try:
            await self._task_group.start(run_stateless_server)
            await transport.handle_request(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await transport.terminate()
