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
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

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


class McpEndpoint:
    """The ASGI application behind `/mcp/`."""

    def __init__(self):
        self.manager: StreamableHTTPSessionManager | None = None
        self._ready: asyncio.Future | None = None
        self._task: asyncio.Task | None = None

    async def _started(self) -> StreamableHTTPSessionManager:
        if self._ready is None:
            loop = asyncio.get_running_loop()
            self._ready = loop.create_future()
            # Host and Origin are checked here, against the deployment's own settings, before the SDK runs.
            self.manager = GatewaySessionManager(
                app=mcp_protocol_server(on_listen=surface_listen), stateless=True,
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
        message, cancelling = NO_MESSAGE, None
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
