"""`/mcp/`: the HTTP side of the governed MCP endpoint (the protocol side is `tools.gateway.protocol`).

Before the protocol starts, a request must come for one of the deployment's hosts (`ALLOWED_HOSTS`), from
no browser origin or one of those hosts or `CSRF_TRUSTED_ORIGINS` (DNS-rebinding protection), and
present an API key with the agent scope: refusals are real HTTP answers (403, 401) in the API's error
envelope. Then the agent session the request speaks for is resolved and the SDK's session manager
answers. Daphne runs no ASGI lifespan, so the manager starts with the first request, once per process,
in a task that lives as long as the event loop.

Every request is admitted as every entry's are (`tenancy.entry.admission.admit`): its key, the requests-per-minute
limits, and the JSON values of the message it posts. A request past a limit is answered 429 with `Retry-After`
and a JSON-RPC error (RATE_LIMITED) for the message's id; a message with a value no entry takes (a NUL,
nesting past 64 levels, a lone surrogate, NaN) 400 with JSON-RPC's invalid params (-32602), before the protocol
starts, so nothing of it is stored.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, replace
from urllib.parse import parse_qs, urlsplit

from django.conf import settings
from django.http.request import split_domain_port, validate_host
from mcp.server import Server
from mcp.server import _streamable_http_modern as single_exchange
from mcp.server.connection import Connection
from mcp.server.runner import serve_one
from mcp.server.streamable_http_manager import DEFAULT_MAX_REQUEST_BODY_SIZE, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.inbound import InboundModernRoute, classify_inbound_request, find_duplicated_routing_header
from mcp.shared.message import ServerMessageMetadata
from mcp.shared.transport_context import TransportContext
from mcp_types import JSONRPCRequest
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import Request

from common.errors import NotPermitted, RateLimited
from common.json_values import MAX_JSON_DEPTH
from tenancy.entry.admission import NO_VALUE, Entry, NotAuthenticated, ValueRefused, admit
from tenancy.entry.authentication import bearer_token
from tenancy.entry.bodies import NOT_AUTHENTICATED, Refusal, header_map
from tenancy.models import Scope
from tenancy.oauth.external import ExternalTokenRefused, apikey_from_external_token
from tools.calls.waiting import run_db
from tools.gateway.elicitation import answer_apply, elicits_forms, is_answer
from tools.gateway.oauth import challenge
from tools.gateway.protocol import (
    AGENT_HEADER,
    CALLER_SCOPE,
    SESSION_HEADER,
    STREAM_SCOPE,
    McpAccessError,
    McpCaller,
    answers_alone,
    elicits_urls,
    mcp_presence_note,
    mcp_protocol_server,
    mcp_request_cancelled,
    mcp_session,
)
from tools.gateway.streams import (
    GatewaySessionManager,
    StreamIdRefused,
    event_of,
    notification_stream,
    resumable_call,
    resume_call,
    surface_listen,
)

logger = logging.getLogger("toolkeeper.mcp")

MCP_PATHS = frozenset({"/mcp", "/mcp/"})
SESSION_ID_HEADER = b"mcp-session-id"
SESSION_KEY, AGENT_KEY = SESSION_HEADER.lower().encode(), AGENT_HEADER.lower().encode()  # as `header_map` has them
TENANT_KEY = b"x-toolkeeper-tenant"  # the tenant an external authorization server's token acts in
REASONS = {400: ("Bad Request", "invalid"), 403: ("Forbidden", "permission_denied"), 404: ("Not Found", "not_found")}
NOT_AN_AGENT_KEY = Refusal(403, "Forbidden", "permission_denied", "MCP needs an API key with the agent scope.")
FOREIGN_HOST = Refusal(403, "Forbidden", "forbidden_host", "This host or origin may not reach the MCP endpoint.")
UNAVAILABLE = Refusal(503, "Service Unavailable", "unavailable", "The MCP endpoint cannot serve requests now; retry.")
NOT_SSE = Refusal(406, "Not Acceptable", "not_acceptable",
                  "GET /mcp/ answers with an event stream: accept text/event-stream.")
NO_SUCH_EVENT = Refusal(404, "Not Found", "not_found",
                        "Last-Event-ID names no event of this session's streams that can still be resumed.")
LAST_EVENT_ID = b"last-event-id"
MAX_LAST_EVENT_ID = 2048
CANCELLED = b"notifications/cancelled"
# JSON-RPC leaves -32000 to -32099 to the server; MCP names no code for a rate limit.
RATE_LIMITED = -32029
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
PARSE_ERROR = -32700
NO_MESSAGE = object()


@dataclass(frozen=True)
class RpcRefusal:
    """A request refused before the protocol starts, answered as JSON-RPC errors are: an HTTP status and the
    error for the message's id (a client of the SDK reports the error, not the status)."""

    status: int
    code: int
    message: str
    retry_after: int | None = None

    async def send(self, send, request_id) -> None:
        body = json.dumps({"jsonrpc": "2.0", "id": request_id,
                           "error": {"code": self.code, "message": self.message}}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if self.retry_after is not None:
            headers.append((b"retry-after", str(self.retry_after).encode()))
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


INVALID_MESSAGE = RpcRefusal(400, INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 message object")


def is_mcp(scope) -> bool:
    return scope["path"] in MCP_PATHS


def _host_allowed(host: str) -> bool:
    domain, _ = split_domain_port(host)
    return bool(domain) and validate_host(domain, settings.ALLOWED_HOSTS)


def _origin_allowed(origin: str) -> bool:
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and _host_allowed(parts.netloc.rpartition("@")[2])


def host_refusal(headers: dict[bytes, bytes]) -> Refusal | None:
    """A request for a host the deployment does not serve, or from a foreign page, is refused: a page of
    another site whose name was re-pointed at this machine cannot drive a local client's tools."""
    if not _host_allowed(headers.get(b"host", b"").decode("latin-1")):
        return FOREIGN_HOST
    origin = headers.get(b"origin")
    if origin is not None and not _origin_allowed(origin.decode("latin-1")):
        return FOREIGN_HOST
    return None


def _naming_session(send, session_id):
    """The answer to a connection's opening request names its session, which the client sends back."""
    value = str(session_id).encode()

    async def naming(message):
        if message["type"] == "http.response.start" and message["status"] < 300:
            headers = [(name, v) for name, v in message.get("headers", []) if name.lower() != SESSION_ID_HEADER]
            message = {**message, "headers": [*headers, (SESSION_ID_HEADER, value)]}
        await send(message)

    return naming


async def _whole_body(receive):
    """The request's body, and a `receive` that hands it on as if it had not been read."""
    chunks, message = [], {}
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = b"".join(chunks)
    first = {"type": "http.request", "body": body, "more_body": False} if message["type"] == "http.request" \
        else message
    handed = False

    async def replay():
        nonlocal handed
        if handed:
            return await receive()
        handed = True
        return first

    return body, replay


def _an_id(value):
    """`value` if it can be a JSON-RPC request id (a string or an integer), else None."""
    return value if isinstance(value, str | int) and not isinstance(value, bool) else None


def _request_id(message):
    """The id of a JSON-RPC request, or None (a notification, a batch, no message)."""
    return _an_id(message.get("id")) if isinstance(message, dict) else None


def cancelled_request_id(message):
    """The request id a `notifications/cancelled` message names, or None when the message is not one."""
    if not isinstance(message, dict) or message.get("method") != CANCELLED.decode() or "id" in message:
        return None
    params = message.get("params")
    return _an_id(params.get("requestId")) if isinstance(params, dict) else None


def _shape_refusal(message) -> RpcRefusal | None:
    """Invalid Request (-32600) in a few words unless `message` is one JSON-RPC 2.0 object of the kinds MCP
    sends (a request, a notification, a result, an error): the SDK would answer with its validator's whole
    report, class names and input included."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return INVALID_MESSAGE
    if "id" in message and _an_id(message["id"]) is None and not (message["id"] is None and "error" in message):
        return INVALID_MESSAGE
    if "method" in message:
        well_formed = isinstance(message["method"], str) and isinstance(message.get("params", {}), dict)
    elif "result" in message:
        well_formed = "id" in message and isinstance(message["result"], dict)
    else:
        error = message.get("error")
        code = error.get("code") if isinstance(error, dict) else None
        well_formed = "id" in message and isinstance(code, int) and not isinstance(code, bool) \
            and isinstance(error.get("message"), str)
    return None if well_formed else INVALID_MESSAGE


def _external_key(authorization: str, *, tenant: str, agent: str):
    """The grant key an external authorization server's token stands for (`TOOLKEEPER_MCP_OAUTH=external`), or
    None for a credential of Toolkeeper's own (an API key, its own access token)."""
    token = bearer_token(authorization)
    if settings.TOOLKEEPER_MCP_OAUTH != "external" or token is None or token.startswith(("tk_", "tko_")):
        return None
    return apikey_from_external_token(token, tenant_slug=tenant, agent=agent)


def _caller_of(authorization: str, *, named: str, agent: str, opening: bool, message=NO_MESSAGE,
               cancelling=None, tenant: str = "") -> McpCaller | Refusal | RpcRefusal:
    """The request admitted, and its key and session, found in one trip to the database pool; or what to answer
    instead. `message`: the JSON the request posts (or the RpcRefusal of its unreadable body). A request that
    cancels another (`cancelling`, its id) cancels that request's call here too."""
    value = NO_VALUE if message is NO_MESSAGE or isinstance(message, RpcRefusal) else message
    try:
        external = _external_key(authorization, tenant=tenant, agent=agent)
        api_key = admit(entry=Entry.MCP, authorization=None if external else authorization, api_key=external,
                        scope=Scope.AGENT, value=value).api_key
    except ExternalTokenRefused as exc:
        return Refusal(401, "Unauthorized", "authentication_failed", exc.message, challenge(token_refused=True))
    except NotAuthenticated as exc:
        return Refusal(401, "Unauthorized", "authentication_failed", exc.message, challenge(token_refused=True))
    except NotPermitted:
        return NOT_AN_AGENT_KEY
    except RateLimited as exc:
        return RpcRefusal(429, RATE_LIMITED, exc.message, exc.retry_after)
    except ValueRefused as exc:
        return RpcRefusal(400, INVALID_PARAMS, exc.message)
    if isinstance(message, RpcRefusal):
        return message
    if message is not NO_MESSAGE and (refusal := _shape_refusal(message)):
        return refusal
    try:
        caller = mcp_session(api_key=api_key, named=named, agent=agent, opening=opening,
                             url_elicitation=opening and elicits_urls(message),
                             form_elicitation=opening and elicits_forms(message))
    except McpAccessError as exc:
        reason, code = REASONS.get(exc.status, REASONS[400])
        return Refusal(exc.status, reason, code, exc.message)
    mcp_presence_note(caller)
    if cancelling is not None:
        mcp_request_cancelled(caller, cancelling)
    return caller


def _message_of(body: bytes):
    """The JSON value a POST carries, or the RpcRefusal of a body that is no JSON (or too deep to read)."""
    try:  # strict UTF-8: json.loads of bytes would take encoded surrogates ("surrogatepass")
        return json.loads(body.decode("utf-8"))
    except RecursionError:
        return RpcRefusal(400, INVALID_PARAMS, f"JSON may be nested at most {MAX_JSON_DEPTH} levels deep")
    except ValueError:  # not JSON, or not UTF-8
        return RpcRefusal(400, PARSE_ERROR, "Parse error: the body is not a JSON message")


# --- the lean reader ------------------------------------------------------------------------------------------------
# A 2026-era POST carrying one `tools/call`, `tools/list` or `ping` that can be answered by one JSON reply
# (`protocol.answers_alone`) is answered here, the way the SDK's single-exchange entry answers it, without its
# ASGI request, its task group and memory stream, or its manager: the SDK's own checks of the message
# (`JSONRPCRequest`, the duplicated routing headers, `classify_inbound_request`), its `serve_one` with our
# handlers, and its writer, so the answer is the SDK's byte for byte (tests/mcp/test_lean.py holds them equal).
# Whatever would make the SDK answer otherwise (a content type or Accept it refuses, a body past its bound, a
# rejected envelope) goes the SDK's way and gets its answer. TOOLKEEPER_MCP_LEAN=0 sends everything that way.

def _accepts_both(accept: str) -> bool:
    """The SDK's Accept check for its SSE mode (`check_accept_headers`): JSON and an event stream."""
    types = {part.strip().split(";")[0].strip().lower() for part in accept.split(",")}
    return "*/*" in types or (bool(types & {"application/json", "application/*"})
                              and bool(types & {"text/event-stream", "text/*"}))


def lean_request(scope, headers: dict[bytes, bytes], message, body_size: int) \
        -> tuple[JSONRPCRequest, InboundModernRoute] | None:
    """The request and its envelope when the lean reader may answer this POST; None: the SDK answers it."""
    version = headers.get(b"mcp-protocol-version", b"").decode("latin-1")
    if not settings.TOOLKEEPER_MCP_LEAN or version not in MODERN_PROTOCOL_VERSIONS \
            or b"mcp-method" not in headers or not isinstance(message, dict) or "id" not in message \
            or not answers_alone(message.get("method"), message.get("params", {})):
        return None
    if body_size > DEFAULT_MAX_REQUEST_BODY_SIZE \
            or not headers.get(b"content-type", b"").decode("latin-1").lower().startswith("application/json") \
            or not _accepts_both(headers.get(b"accept", b"").decode("latin-1")):
        return None
    raw = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"]]
    if find_duplicated_routing_header(raw) is not None:
        return None
    try:
        request = JSONRPCRequest.model_validate(message)
    except ValidationError:
        return None
    verdict = classify_inbound_request(message, headers=dict(reversed(raw)))  # the first of a repeated header
    return (request, verdict) if isinstance(verdict, InboundModernRoute) else None


class _Sink:
    """Where the handler's notifications would go (none are expected: `answers_alone`); one commits the answer
    to an event stream, as in the SDK's entry."""

    def __init__(self):
        self.events: asyncio.Queue[bytes] = asyncio.Queue()

    async def send(self, event: bytes) -> None:
        self.events.put_nowait(event)


async def _disconnected(receive) -> None:
    while (await receive()).get("type") != "http.disconnect":
        pass


async def lean_answer(server: Server, request: JSONRPCRequest, verdict: InboundModernRoute, scope, receive,
                      send) -> None:
    """Answer as the SDK's single-exchange entry does: JSON when the handler ends within its ping interval without
    a notification, else an event stream with keep-alive pings and the reply last; a client that goes away
    cancels the handler."""
    http_request = Request(scope, receive)
    sink = _Sink()
    dctx = single_exchange._SingleExchangeDispatchContext(
        transport=TransportContext(kind="streamable-http", can_send_request=False, headers=http_request.headers),
        request_id=request.id, message_metadata=ServerMessageMetadata(request_context=http_request), sink=sink)
    connection = Connection.from_envelope(verdict.protocol_version, verdict.client_info, verdict.client_capabilities)
    handler = asyncio.ensure_future(single_exchange._to_jsonrpc_response(request.id, serve_one(
        server, dctx, request.method, request.params, connection=connection, lifespan_state={})))
    gone = asyncio.ensure_future(_disconnected(receive))
    event: asyncio.Future | None = None
    committed = False

    async def commit() -> None:
        nonlocal committed
        if not committed:
            await send({"type": "http.response.start", "status": 200, "headers": single_exchange._SSE_HEADERS})
            committed = True

    try:
        while True:
            event = event or asyncio.ensure_future(sink.events.get())
            done, _ = await asyncio.wait({handler, gone, event}, timeout=single_exchange._SSE_PING_INTERVAL,
                                         return_when=asyncio.FIRST_COMPLETED)
            if gone in done:
                return
            if event in done:
                body, event = event.result(), None
            elif handler in done:
                break
            else:
                body = b": ping\r\n\r\n"
            await commit()
            await send({"type": "http.response.body", "body": body, "more_body": True})
        event.cancel()
        if not committed and sink.events.empty():
            await single_exchange._write(handler.result(), scope, receive, send)
            return
        await commit()
        while not sink.events.empty():
            await send({"type": "http.response.body", "body": sink.events.get_nowait(), "more_body": True})
        await send({"type": "http.response.body", "body": single_exchange._sse_event(handler.result()),
                    "more_body": False})
    finally:
        for task in (handler, gone, event):
            if task is not None and not task.done():
                task.cancel()
        await asyncio.gather(handler, return_exceptions=True)  # a cancelled handler records what it must


class McpEndpoint:
    """The ASGI application behind `/mcp/`."""

    def __init__(self):
        self.manager: StreamableHTTPSessionManager | None = None
        self._server: Server | None = None
        self._ready: asyncio.Future | None = None
        self._task: asyncio.Task | None = None
        self.lean_answered = 0  # requests the lean reader answered

    @property
    def server(self) -> Server:
        """The protocol server, of both ways in (the SDK's manager and the lean reader)."""
        if self._server is None:
            self._server = mcp_protocol_server(on_listen=surface_listen)
        return self._server

    async def _started(self) -> StreamableHTTPSessionManager:
        if self._ready is None:
            loop = asyncio.get_running_loop()
            self._ready = loop.create_future()
            # Host and Origin are checked here, against the deployment's own settings, before the SDK runs.
            self.manager = GatewaySessionManager(
                app=self.server, stateless=True,
                retry_interval=settings.TOOLKEEPER_MCP_RETRY_MS,
                security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False))
            self._task = loop.create_task(self._run(self.manager, self._ready))
        await asyncio.shield(self._ready)
        return self.manager

    @staticmethod
    async def _run(manager: StreamableHTTPSessionManager, ready: asyncio.Future) -> None:
        try:
            async with manager.run():
                ready.set_result(None)
                await asyncio.Event().wait()  # as long as the event loop
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    async def __call__(self, scope, receive, send):
        path = scope["path"]
        headers = header_map(scope["headers"])
        refusal = host_refusal(headers)
        authorization = headers.get(b"authorization")
        if refusal is None and authorization is None:
            # the way to a token without a pasted key: the resource's metadata names the authorization server
            refusal = replace(NOT_AUTHENTICATED, challenge=challenge(token_refused=False))
        if refusal is not None:
            await refusal.send(send, path)
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        named = (headers.get(SESSION_ID_HEADER) or headers.get(SESSION_KEY) or b"").decode("latin-1") \
            or query.get("session", [""])[0]
        agent = headers.get(AGENT_KEY, b"").decode("latin-1") or query.get("agent", [""])[0]
        tenant = headers.get(TENANT_KEY, b"").decode("latin-1") or query.get("tenant", [""])[0]
        message, cancelling, body = NO_MESSAGE, None, b""
        if scope["method"] == "POST":  # its body is within the size limit (`bodies.BodyGuard`)
            body, receive = await _whole_body(receive)
            message = _message_of(body)
            if named and b"mcp-method" not in headers:
                # A 2025-era client's message on its connection: it may cancel one of its requests.
                cancelling = cancelled_request_id(message)
        # A 2025-era `initialize`, without a session and without the protocol's own headers, opens a connection.
        opening = (not named and isinstance(message, dict) and message.get("method") == "initialize"
                   and b"mcp-method" not in headers and b"mcp-protocol-version" not in headers)
        try:
            caller = await run_db(_caller_of, authorization.decode("latin-1"), named=named.strip(),
                                  agent=agent.strip(), opening=opening, message=message, cancelling=cancelling,
                                  tenant=tenant.strip())
        except Exception:  # a database that fails now is no reason to answer with a trace
            logger.exception("an MCP request could not be resolved to a session")
            caller = UNAVAILABLE
        if isinstance(caller, Refusal):
            await caller.send(send, path)
            return
        if isinstance(caller, RpcRefusal):
            await caller.send(send, _request_id(message))
            return
        if scope["method"] == "POST" and named and is_answer(message):
            # A 2025-era client's answer to a question asked on one of its streams (tools.gateway.elicitation),
            # applied by whichever process receives it.
            try:
                await run_db(answer_apply, caller, message["id"], message.get("result"),
                             actor=f"apikey:{caller.api_key.name}")
            except Exception:
                logger.exception("an MCP client's answer could not be applied")
            await send({"type": "http.response.start", "status": 202, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        version = headers.get(b"mcp-protocol-version", b"").decode("latin-1")
        handshake_era = b"mcp-method" not in headers and (not version or version in HANDSHAKE_PROTOCOL_VERSIONS)
        if scope["method"] == "GET" and handshake_era:
            await self._stream(caller, headers, path, receive, send)
            return
        if not handshake_era and (lean := lean_request(scope, headers, message, len(body))) is not None:
            self.lean_answered += 1
            await lean_answer(self.server, *lean, {**scope, CALLER_SCOPE: caller, STREAM_SCOPE: None}, receive, send)
            return
        manager = await self._started()
        if opening or (handshake_era and isinstance(message, dict) and message.get("method") == "initialize"):
            # the answer names the session, opened or named: the client sends it back, and opens its notifications
            send = _naming_session(send, caller.session.pk)
        stream = resumable_call(caller, message) if handshake_era else None
        await manager.handle_request({**scope, CALLER_SCOPE: caller, STREAM_SCOPE: stream}, receive, send)

    @staticmethod
    async def _stream(caller: McpCaller, headers: dict[bytes, bytes], path: str, receive, send) -> None:
        """A 2025-era GET: the session's notification stream, or the resumption of a stream that dropped."""
        accept = headers.get(b"accept", b"").decode("latin-1").lower()
        if "text/event-stream" not in accept and "*/*" not in accept and "text/*" not in accept:
            await NOT_SSE.send(send, path)
            return
        last = headers.get(LAST_EVENT_ID, b"").decode("latin-1").strip()
        if not last:
            await notification_stream(caller, receive, send)
            return
        try:
            if len(last) > MAX_LAST_EVENT_ID:
                raise StreamIdRefused("Last-Event-ID is longer than any event id of this endpoint")
            payload = event_of(caller, last)
        except StreamIdRefused as exc:
            await Refusal(400, "Bad Request", "invalid", str(exc)).send(send, path)
            return
        if payload and payload[0] == "n" and len(payload) in (2, 4, 5):
            await notification_stream(caller, receive, send, known=payload[1:])
            return
        try:
            resumed = bool(payload) and payload[0] == "c" and len(payload) == 7 \
                and await resume_call(caller, payload, receive, send)
        except Exception:  # its call could not be read: the stream has not started
            logger.exception("an MCP stream could not be resumed")
            await UNAVAILABLE.send(send, path)
            return
        if not resumed:
            await NO_SUCH_EVENT.send(send, path)
