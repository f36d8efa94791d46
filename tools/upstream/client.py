"""The client side of MCP (docs/mcp.md): reaching a tenant's MCP servers from sync code, over sessions kept
open per process.

- By default the sessions live in a host process of this process's own (see "the host process" at the end
  of this module), so the SDK's work runs beside the server instead of taking its interpreter lock; the
  host runs everything below. With `TOOLKEEPER_MCP_CLIENT_PROCESS` off it runs in this process.
- One event-loop thread per process (`_Loop`), started on first use, so every Celery prefork child
  starts its own after the fork (a loop thread does not survive a fork; `os.register_at_fork` drops the
  parent's). It is a daemon thread running a `BlockingPortal`: anyio's `start_blocking_portal` runs its loop
  in a non-daemon executor thread, which the interpreter joins at exit, so a process holding a session
  would never exit.
- One long-lived `mcp.Client` per endpoint key (`_Session`). The MCP SDK requires a client's context to be
  entered and left by the same task, so each session has an owner task that opens it, keeps it open until
  it is closed or dies, then leaves it; calls run in tasks of their own on the open session (its requests
  are multiplexed). A session dies when its transport ends (the read stream closes: a stdio child that
  exited, a dropped SSE stream, a failed HTTP exchange); the next use opens a new one, so a killed stdio
  server is restarted by the next call. A session whose server changed (another key for the same server)
  is closed when the new one opens; a session unused for `TOOLKEEPER_MCP_SESSION_IDLE_S` is closed. A person's
  own sessions (their token in the key, tools.accounts) are left to that: a refreshed token's new session must
  not cut a call still running on the old one.
- HTTP (streamable HTTP and SSE) goes through `common.outbound.async_http_client` only, with the
  endpoint's own stored headers: the address is checked at every connection, and nothing of the caller's
  request (its Authorization header included) is ever sent upstream.
- stdio servers are the platform admin's allow-list (`settings.TOOLKEEPER_MCP_STDIO_SERVERS`); a tenant
  names an entry. The child's stderr is logged (logger `toolkeeper.mcp.stderr`), with every value of its
  environment masked and the number of lines bounded.
- A call from sync code (`mcp_call_tool`) runs in the loop; the calling thread relays upstream progress to
  `on_progress` in order and stops the call when `cancelled` is set: the request's task is cancelled, and
  the SDK tells the server (`notifications/cancelled`, or, on the 2026 HTTP wire, the request's POST is
  aborted). The timeout is the SDK's per-request read timeout, which cancels upstream the same way.
- `notifications/tools/list_changed` or `notifications/prompts/list_changed` on an open session (the stream
  stdio and SSE keep open, the GET stream of a stateful streamable-HTTP session, or a `subscriptions/listen`
  stream on the 2026 protocol) calls the callbacks registered with `mcp_on_tools_changed(callback)` with the
  endpoint's key, in a worker thread, coalesced per key (a sync lists both).
- Prompts: `mcp_list_prompts` (None when the server declares no `prompts` capability), `mcp_get_prompt` and
  `mcp_complete` (a prompt argument's completions; none from a server without `completions`) over the same
  pooled session, within the endpoint's timeout.

Errors are plain words safe to show a tenant: `UpstreamUnavailable` (could not reach, lost the connection;
did not answer in time: `UpstreamTimedOut`; refused by the outbound guard or the allow-list:
`UpstreamRefused`), `UpstreamToolError` (the tool ran and answered isError: the upstream text, bounded),
`UpstreamCancelled` (the caller stopped the call).
No message or log line carries a header or environment value.
"""
import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

import anyio
import anyio.to_thread
import django
import httpx2
import mcp_types as types
from anyio.from_thread import BlockingPortal
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.crypto import salted_hmac
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from common import metrics
from common.children import ChildGone, ChildSide, start_child
from common.command_env import ENV_NAME, env_name_refusal
from common.outbound import OutboundRefused, ResponseTooLarge, async_http_client
from common.secrets import SecretDict
from common.tracing import TRACEPARENT, current_traceparent, remote_span, span_error, tracing_flush

logger = logging.getLogger("toolkeeper.mcp")
stderr_logger = logging.getLogger("toolkeeper.mcp.stderr")


def _stream_cut(record: logging.LogRecord) -> bool:
    """A filter of the SDK's SSE client logger: drops its traceback of an event stream that the network ended
    (the server or a proxy before it cut an idle stream, the read timed out, the connection dropped). That is
    how an idle SSE session ends; the session's own end is the one line logged for it (`_Session._ended`), and
    the next use opens a new one. Anything else the SDK logs (a message it could not send included) stays."""
    exc = record.exc_info[1] if record.exc_info else None
    return exc is None or record.funcName != "sse_reader" or not any(
        isinstance(leaf, httpx2.TransportError) for leaf in _leaves(exc))


logging.getLogger("mcp.client.sse").addFilter(_stream_cut)

MAX_TOOLS = 1000  # tools taken from one server's listing
MAX_PROMPTS = 500  # prompts taken from one server's listing
MAX_COMPLETIONS = 100  # values of one completion (MCP's own bound)
MAX_PAGES = 100  # pages of one listing
MAX_ERROR_CHARS = 2000  # of an upstream error text
MAX_LOG_CHARS = 2000  # of an upstream log message
UPSTREAM_LOG_LEVEL = "info"  # the servers' log messages asked for (2026 era; the 2025 era sends what a server sends)
MAX_STDERR_LINES = 1000  # logged per stdio session; the rest is read and dropped
MAX_STDERR_LINE_CHARS = 1000
HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)  # connect/write/pool · between two reads of a stream
SSE_CONNECT_TIMEOUT_S = 30.0
CHANGE_COALESCE_S = 0.2  # list_changed notifications of one endpoint within this window trigger one callback
LISTEN_ACK_WAIT_S = 5.0  # a new session waits this long for its listen stream before it is used anyway
REAP_EVERY_S = 30.0
RELAY_SLACK_S = 10.0  # the calling thread gives up this long after the call's own deadline (a wedged loop)
HOST_PROCESS_ENV = "TOOLKEEPER_MCP_HOST_PROCESS"  # set in the host process (see the end of this module)
HOST_READY_TIMEOUT_S = 60.0
HOST_EXIT_WAIT_S = 10.0
CLIENT_INFO = types.Implementation(name="toolkeeper", version="1")
# Header names the transport owns: a stored header may not replace them.
TRANSPORT_HEADERS = frozenset({"host", "content-length", "content-type", "transfer-encoding", "connection",
                               "accept", "mcp-session-id", "mcp-protocol-version", "last-event-id"})


@dataclass(frozen=True)
class McpEndpoint:
    """How to reach one server, credentials decrypted: built from an `McpServer` row (`endpoint_of`).
    `key` names the pooled session: it changes whenever anything that shapes the connection changes."""

    key: str
    transport: str  # McpTransport value
    url: str = ""
    headers: dict = field(default_factory=dict, repr=False)
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict = field(default_factory=dict, repr=False)
    timeout_s: float = 30.0
    server_id: int | None = None  # the McpServer row, when built from one
    name: str = ""  # the server's name, for messages and logs
    account: str = ""  # whose account the session acts as: "" the tenant's credential, else a person's
    tenant: str = ""  # the server's tenant's slug, for the metrics' labels
    # This process's number for this description (`endpoint_of` gives each one it builds its own): the host process
    # is sent a description once and then its number (`_Host.start`). 0: sent whole every time.
    ref: int = field(default=0, compare=False, repr=False)


@dataclass(frozen=True)
class UpstreamTool:
    """A tool as the server lists it."""

    name: str
    description: str
    input_schema: dict
    output_schema: dict | None = None
    annotations: dict = field(default_factory=dict)  # readOnlyHint, destructiveHint, idempotentHint, …


@dataclass(frozen=True)
class ListedPrompt:
    """A prompt as the server lists it; `arguments` as `[{"name", "description", "required"}]` (JSON)."""

    name: str
    title: str
    description: str
    arguments: list


class UpstreamUnavailable(Exception):
    """The server could not be reached, or its session broke; the message is safe to show a tenant."""


class UpstreamTimedOut(UpstreamUnavailable):
    """The server did not answer within the time given (it was told to stop)."""


class UpstreamRefused(UpstreamUnavailable):
    """The platform will not reach this server: the outbound guard refused its address, or its stdio name is
    not in the allow-list. Trying again cannot help."""


class UpstreamUnauthorized(UpstreamUnavailable):
    """The server refused the credentials (HTTP 401): it did nothing with the request. With a person's own token,
    the token is renewed and the request sent again (tools.upstream.source)."""


class UpstreamToolError(Exception):
    """The server ran the tool and answered `isError`; the message is the upstream text."""

    def __init__(self, message: str, *, content: list | None = None, structured=None):
        super().__init__(message)
        self.content = content or []
        self.structured = structured


class UpstreamCancelled(Exception):
    """The caller stopped the call (`cancelled` was set); the server was told to stop."""


# -- endpoints --------------------------------------------------------------------------------------

def stdio_allow_list() -> dict:
    """`settings.TOOLKEEPER_MCP_STDIO_SERVERS`, checked: name → {command, args, env, tenant_env}."""
    entries = getattr(settings, "TOOLKEEPER_MCP_STDIO_SERVERS", None) or {}
    if not isinstance(entries, dict):
        raise ImproperlyConfigured("TOOLKEEPER_MCP_STDIO_SERVERS must map names to {command, args, env, tenant_env}")
    for name, entry in entries.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("command"), str) or not entry["command"]:
            raise ImproperlyConfigured(f"TOOLKEEPER_MCP_STDIO_SERVERS[{name!r}] needs a command")
        if not all(isinstance(a, str) for a in entry.get("args", ())):
            raise ImproperlyConfigured(f"TOOLKEEPER_MCP_STDIO_SERVERS[{name!r}]: args are strings")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in (entry.get("env") or {}).items()):
            raise ImproperlyConfigured(f"TOOLKEEPER_MCP_STDIO_SERVERS[{name!r}]: env maps names to strings")
        if not isinstance(entry.get("tenant_env", []), list):
            raise ImproperlyConfigured(f"TOOLKEEPER_MCP_STDIO_SERVERS[{name!r}]: tenant_env lists names")
        for variable in entry.get("tenant_env", []):
            if refusal := env_name_refusal(variable):  # as the settings check it (common.command_env)
                raise ImproperlyConfigured(f"TOOLKEEPER_MCP_STDIO_SERVERS[{name!r}]: tenant_env: {refusal}")
    return entries


def tenant_env_refusal(name, entry: dict | None, server: str) -> str | None:
    """Why a tenant's stdio server may not set the environment variable `name` under this allow-list entry
    (`server` names the entry in the message), or None when it may: the one check of a save and of a start."""
    listed = (entry or {}).get("tenant_env")
    listed = listed if isinstance(listed, list) else []
    if name in listed:
        return env_name_refusal(name)  # the admin's list is the rule, the refused names its backstop
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        return env_name_refusal(name)  # not a name at all: said so, and shown escaped
    allowed = [n for n in listed if not env_name_refusal(n)]
    return (f"{name} is not a variable {server or 'this server'} lets tenants set"
            + (f" (allowed: {', '.join(allowed)})" if allowed else ""))


ENDPOINTS_KEPT = 1024  # endpoints built by `endpoint_of` kept per process, the least recently used dropped first
_endpoints: "collections.OrderedDict[tuple, McpEndpoint]" = collections.OrderedDict()
_endpoints_lock = threading.Lock()
_endpoint_refs = itertools.count(1)


def _pairs(values) -> tuple:
    return tuple(sorted((str(name), str(value)) for name, value in (values or {}).items()))


def _endpoint_shape(server, bearer: str, account: str) -> tuple | None:
    """Everything `endpoint_of` reads, as a key of the built endpoints: the server's fields (its decrypted
    headers and environment included, so a changed secret is another key), the stdio allow-list entry, the
    signing key of the endpoint key, the person. None when it cannot be read (the build then says why)."""
    try:
        transport = str(server.transport)
        entry = stdio_allow_list().get(server.command) if transport == "stdio" else None
        return (server.pk, transport, server.url, _pairs(server.headers), server.command, _pairs(server.env),
                None if entry is None else repr(entry), float(server.timeout_s), server.name, server.tenant_id,
                bearer, account, settings.SECRET_KEY)
    except Exception:
        return None


def endpoint_of(server, *, bearer: str = "", account: str = "") -> McpEndpoint:
    """The endpoint of an `McpServer` row: its credentials decrypted; for stdio, the allow-list entry its
    `command` names (refused when there is none), with the environment the entry gives plus the tenant's
    values for the names the entry lets tenants set. `bearer`: a person's own access token (tools.accounts),
    sent as the Authorization header, for the session of `account`.

    Built once per shape (`_endpoint_shape`: the fields read, the secrets' values, the settings that shape
    it) and kept: a call reads the kept one. Anything that changes makes another shape, so another endpoint."""
    shape = _endpoint_shape(server, bearer, account)
    if shape is None:
        return _endpoint_build(server, bearer=bearer, account=account)
    with _endpoints_lock:
        endpoint = _endpoints.get(shape)
        if endpoint is not None:
            _endpoints.move_to_end(shape)
            return endpoint
    endpoint = _endpoint_build(server, bearer=bearer, account=account)
    with _endpoints_lock:
        endpoint = _endpoints.setdefault(shape, endpoint)
        while len(_endpoints) > ENDPOINTS_KEPT:
            _endpoints.popitem(last=False)
    return endpoint


def _endpoint_build(server, *, bearer: str, account: str) -> McpEndpoint:
    transport = str(server.transport)
    url, headers, command, args, env = "", {}, "", (), {}
    if transport == "stdio":
        entry = stdio_allow_list().get(server.command)
        if entry is None:
            raise UpstreamRefused(f"{server.command!r} is not an allowed stdio server")
        command, args = entry["command"], tuple(entry.get("args", ()))
        env = dict(entry.get("env") or {})
        for name, value in (server.env or {}).items():
            # never dropped in silence: the server would start without what its tenant set, or with a name
            # saved before the rule, and nobody would know why it behaves so
            if refusal := tenant_env_refusal(name, entry, server.command):
                raise UpstreamRefused(f"the stored environment cannot be given to {server.command}: {refusal}; "
                                      "save the server's environment again")
            env[name] = str(value)
    elif transport in ("streamable_http", "sse"):
        url = server.url
        for name, value in (server.headers or {}).items():
            if str(name).strip().lower() in TRANSPORT_HEADERS:
                logger.warning("MCP server %s: header %s is set by the transport; not sent", server.pk, name)
                continue
            if bearer and str(name).strip().lower() == "authorization":
                continue
            headers[str(name)] = str(value)
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
    else:
        raise UpstreamUnavailable(f"unknown transport {transport!r}")
    shape = json.dumps([transport, url, sorted(headers.items()), command, list(args), sorted(env.items())])
    digest = salted_hmac("toolkeeper.mcp.endpoint", shape, algorithm="sha256").hexdigest()[:24]
    return McpEndpoint(key=f"mcp:{server.pk}:{digest}", transport=transport, url=url, headers=SecretDict(headers),
                       command=command, args=args, env=SecretDict(env), timeout_s=float(server.timeout_s),
                       server_id=server.pk, name=server.name, account=account, tenant=_tenant_of(server),
                       ref=next(_endpoint_refs))


def endpoint_server_id(key: str) -> int | None:
    """The McpServer id an endpoint key was made for (`endpoint_of`), or None."""
    parts = key.split(":")
    return int(parts[1]) if len(parts) == 3 and parts[0] == "mcp" and parts[1].isdigit() else None


# -- plain words ------------------------------------------------------------------------------------

def _leaves(exc: BaseException):
    """The exceptions inside `exc`: through exception groups and explicit causes."""
    seen = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, BaseExceptionGroup):
            stack.extend(reversed(current.exceptions))
            continue
        yield current
        if current.__cause__ is not None:
            stack.append(current.__cause__)


def describe_failure(exc: BaseException | None, endpoint: McpEndpoint, http_status: int | None = None) -> str:
    """Why a server could not be reached, in words for the tenant: never an address it resolved to, a
    header or an environment value."""
    who = f"MCP server {endpoint.name}" if endpoint.name else "the MCP server"
    leaves = list(_leaves(exc)) if exc is not None else []
    for leaf in leaves:
        if isinstance(leaf, OutboundRefused):
            return f"{who} may not be reached: {leaf}"
    if http_status is not None and http_status >= 400:
        hint = " (check its credentials)" if http_status in (401, 403) else ""
        return f"{who} answered HTTP {http_status}{hint}"
    for leaf in leaves:
        if isinstance(leaf, httpx2.HTTPStatusError):
            return f"{who} answered HTTP {leaf.response.status_code}"
        if isinstance(leaf, httpx2.TimeoutException | TimeoutError):
            return f"{who} did not answer in time"
        if isinstance(leaf, httpx2.ConnectError):
            return f"{who} could not be reached (the connection failed)"
        if isinstance(leaf, httpx2.HTTPError):
            return f"{who} could not be reached ({type(leaf).__name__})"
        if isinstance(leaf, FileNotFoundError | PermissionError):
            return f"{who} could not be started (its command is missing or not executable)"
        if isinstance(leaf, MCPError):
            return f"{who} refused the connection: {_bounded(leaf.error.message, 300)}"
    if endpoint.transport == "stdio":
        return f"{who} could not be started or ended at once (see the server log)"
    return f"{who} could not be reached"


def unavailable(exc: BaseException | None, endpoint: McpEndpoint,
                http_status: int | None = None) -> UpstreamUnavailable:
    """The exception for a server that could not be reached: UpstreamRefused when the guard refused it."""
    refused = exc is not None and any(isinstance(leaf, OutboundRefused) for leaf in _leaves(exc))
    cls = UpstreamRefused if refused else UpstreamUnauthorized if http_status == 401 else UpstreamUnavailable
    return cls(describe_failure(exc, endpoint, http_status))


def _bounded(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _error_text(content) -> str:
    texts = [block.text for block in content if isinstance(block, types.TextContent)]
    return _bounded("\n".join(texts).strip() or "the tool failed without a message")


def _content_json(block) -> dict:
    """A content block as JSON, as the model dumps it; a plain text block (most results) without the model."""
    if type(block) is types.TextContent and block.annotations is None and block.meta is None:
        return {"type": "text", "text": block.text}
    return block.model_dump(mode="json", by_alias=True, exclude_none=True)


def _upstream_tool(tool: types.Tool) -> UpstreamTool:
    annotations = tool.annotations.model_dump(mode="json", by_alias=True, exclude_none=True) if tool.annotations else {}
    return UpstreamTool(name=tool.name, description=tool.description or "", input_schema=dict(tool.input_schema),
                        output_schema=tool.output_schema, annotations=annotations)


# -- the stderr of stdio servers --------------------------------------------------------------------

class _StderrLog:
    """A pipe given to a stdio server as its stderr; a thread logs its lines, each value of the server's
    environment masked, at most MAX_STDERR_LINES of them."""

    def __init__(self, endpoint: McpEndpoint):
        read_fd, write_fd = os.pipe()
        self.file = os.fdopen(write_fd, "w")
        self._secrets = sorted((v for v in endpoint.env.values() if len(v) >= 4), key=len, reverse=True)
        self._name = endpoint.name or endpoint.key
        self._thread = threading.Thread(target=self._pump, args=(os.fdopen(read_fd, "r", errors="replace"),),
                                        name="toolkeeper-mcp-stderr", daemon=True)
        self._thread.start()

    def _pump(self, reader) -> None:
        with reader:
            for count, line in enumerate(reader):
                if count < MAX_STDERR_LINES:
                    stderr_logger.info("%s: %s", self._name, self.masked(line.rstrip("\n")))
                elif count == MAX_STDERR_LINES:
                    stderr_logger.info("%s: … (further output is not logged)", self._name)

    def masked(self, line: str) -> str:
        for secret in self._secrets:
            line = line.replace(secret, "[hidden]")
        return _bounded(line, MAX_STDERR_LINE_CHARS)

    def close(self) -> None:
        """Our end of the pipe: once the child has its copy, the reader ends when the child does."""
        if not self.file.closed:
            self.file.close()


# -- transports -------------------------------------------------------------------------------------

class _WatchedReadStream:
    """A transport's read stream that reports its end (the transport closed: the session is dead)."""

    def __init__(self, inner, on_end: Callable[[], None]):
        self._inner = inner
        self._on_end = on_end

    @property
    def last_context(self):
        return getattr(self._inner, "last_context", None)

    async def receive(self):
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise

    async def aclose(self) -> None:
        self._on_end()
        await self._inner.aclose()

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()


@asynccontextmanager
async def _watched(transport, on_end: Callable[[], None]):
    async with transport as (read_stream, write_stream):
        yield _WatchedReadStream(read_stream, on_end), write_stream


class _Connection:
    """What one connection to a server needs besides the SDK's client: the transport, the HTTP status of
    the last answer (for plain words when the handshake fails), the stdio server's stderr."""

    def __init__(self, endpoint: McpEndpoint):
        self.endpoint = endpoint
        self.http_status: int | None = None
        self.too_large: str | None = None  # why an answer was refused for its size, which ends the session
        self.stderr: _StderrLog | None = None

    async def _record_status(self, response: httpx2.Response) -> None:
        self.http_status = response.status_code

    def _record_too_large(self, exc: ResponseTooLarge) -> None:
        self.too_large = str(exc)

    def _http_client(self, **options) -> httpx2.AsyncClient:
        options.setdefault("timeout", HTTP_TIMEOUT)
        return async_http_client(event_hooks={"response": [self._record_status]},
                                 on_too_large=self._record_too_large, **options)

    async def client(self, stack: AsyncExitStack, on_end: Callable[[], None], message_handler=None,
                     logging_callback=None) -> Client:
        """An entered `mcp.Client` on a new transport; its resources are left on `stack`."""
        endpoint = self.endpoint
        mode = "auto"
        if endpoint.transport == "stdio":
            self.stderr = _StderrLog(endpoint)
            stack.callback(self.stderr.close)
            params = StdioServerParameters(command=endpoint.command, args=list(endpoint.args), env=dict(endpoint.env))
            transport = stdio_client(params, errlog=self.stderr.file)
        elif endpoint.transport == "sse":
            mode = "legacy"  # SSE is the 2024 transport: the handshake era only
            transport = sse_client(endpoint.url, headers=dict(endpoint.headers), timeout=SSE_CONNECT_TIMEOUT_S,
                                   sse_read_timeout=HTTP_TIMEOUT.read, httpx_client_factory=self._http_client)
        else:
            http = await stack.enter_async_context(self._http_client(headers=dict(endpoint.headers)))
            transport = streamable_http_client(endpoint.url, http_client=http)
        client = Client(_watched(transport, on_end), mode=mode, message_handler=message_handler, cache=None,
                        client_info=CLIENT_INFO, logging_callback=logging_callback, log_level=UPSTREAM_LOG_LEVEL)
        await stack.enter_async_context(client)
        if self.stderr is not None:
            self.stderr.close()  # the child has its copy now
        return client


# -- pooled sessions --------------------------------------------------------------------------------

class _Session:
    """One open client session, owned by the task running `run`."""

    def __init__(self, endpoint: McpEndpoint, pool: "_Pool"):
        self.endpoint = endpoint
        self.pool = pool
        self.connection = _Connection(endpoint)
        self.client: Client | None = None
        self.ready = anyio.Event()
        self.listening = anyio.Event()  # set once the listen stream is acknowledged, or known not to exist
        self.closing = anyio.Event()
        self.done = anyio.Event()
        self.scope = anyio.CancelScope()
        self.failure: BaseException | None = None
        self.dead = False
        self.died_at: float | None = None
        self.in_use = 0
        self.last_used = anyio.current_time()
        self.log_sinks: dict[int, Callable] = {}  # the calls in flight that hear the server's log messages

    def close(self) -> None:
        self.dead = True
        self.closing.set()
        if self.client is None:
            self.scope.cancel()  # still connecting

    def _ended(self) -> None:
        if not self.dead:
            self.dead = True
            self.died_at = anyio.current_time()
            logger.info("MCP session of server %s ended", self.endpoint.server_id)
        self.closing.set()

    async def _on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        """A log message of the server. MCP does not say which request it belongs to: while exactly one call is in
        flight on this session it is that call's; with several at once it cannot be told whose, and is dropped."""
        if len(self.log_sinks) != 1:
            return
        data = params.data
        text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, default=str)
        if params.logger:
            text = f"{_bounded(str(params.logger), 100)}: {text}"
        sink = next(iter(self.log_sinks.values()))
        with contextlib.suppress(Exception):
            await sink(params.level, _bounded(text, MAX_LOG_CHARS))

    async def _on_message(self, message) -> None:
        # a changed prompt list is synced as a changed tool list is: the sync lists both
        if isinstance(message, types.ToolListChangedNotification | types.PromptListChangedNotification):
            self.pool.tools_changed(self.endpoint.key)
        elif isinstance(message, Exception):
            logger.debug("MCP server %s: transport error %s", self.endpoint.server_id, type(message).__name__)

    async def run(self) -> None:
        try:
            with self.scope:
                async with AsyncExitStack() as stack:
                    client = await self.connection.client(stack, self._ended, self._on_message, self._on_log)
                    self.client = client
                    listening = await stack.enter_async_context(anyio.create_task_group())
                    capabilities = client.server_capabilities
                    tools_changing = capabilities.tools is not None and bool(capabilities.tools.list_changed)
                    prompts_changing = capabilities.prompts is not None and bool(capabilities.prompts.list_changed)
                    if client.protocol_version in MODERN_PROTOCOL_VERSIONS and (tools_changing or prompts_changing):
                        listening.start_soon(self._listen, tools_changing, prompts_changing)
                        # A change made after the session is handed out must be heard: wait for the ack.
                        with anyio.move_on_after(LISTEN_ACK_WAIT_S):
                            await self.listening.wait()
                    self.ready.set()
                    await self.closing.wait()
                    listening.cancel_scope.cancel()
        except Exception as exc:  # whatever ended the session: its waiters get it in plain words
            self.failure = exc
            if self.client is None:
                logger.info("MCP server %s could not be reached: %s", self.endpoint.server_id,
                            describe_failure(exc, self.endpoint, self.connection.http_status))
        finally:
            self.dead = True
            self.ready.set()
            self.done.set()
            self.pool.forget(self)

    async def _listen(self, tools: bool, prompts: bool) -> None:
        """On the 2026 protocol, change notifications travel on a `subscriptions/listen` stream; the SDK hands
        them to the message handler too (`_on_message`), so this only keeps one open, and reopens it. Nothing
        is replayed across a gap, so a reopened stream counts as a change (the listing is fetched again)."""
        backoff = 1.0
        reopening = False
        try:
            while not self.closing.is_set():
                try:
                    async with self.client.listen(tools_list_changed=tools,
                                                  prompts_list_changed=prompts) as subscription:
                        backoff = 1.0
                        if reopening:
                            self.pool.tools_changed(self.endpoint.key)
                        self.listening.set()
                        async for _event in subscription:
                            pass
                except ListenNotSupportedError:
                    return
                except MCPError as exc:
                    if exc.code == types.METHOD_NOT_FOUND:
                        return
                    logger.debug("MCP server %s: listen failed (%s)", self.endpoint.server_id, exc.code)
                except SubscriptionLost:
                    pass
                reopening = True
                self.listening.set()  # a first attempt that failed does not hold the session back
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 60.0)
        finally:
            self.listening.set()


class _Pool:
    """The sessions of this process, by endpoint key; lives in the loop thread."""

    def __init__(self):
        self.sessions: dict[str, _Session] = {}
        self.tg: anyio.abc.TaskGroup | None = None
        self._changed: set[str] = set()

    async def serve(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            self.tg = tg
            tg.start_soon(self._reap_idle)
            task_status.started()
            await anyio.sleep_forever()

    def forget(self, session: _Session) -> None:
        if self.sessions.get(session.endpoint.key) is session:
            del self.sessions[session.endpoint.key]

    async def _reap_idle(self) -> None:
        while True:
            await anyio.sleep(REAP_EVERY_S)
            idle_s = float(getattr(settings, "TOOLKEEPER_MCP_SESSION_IDLE_S", 900))
            now = anyio.current_time()
            for session in list(self.sessions.values()):
                if session.in_use == 0 and now - session.last_used > idle_s:
                    session.close()

    async def session(self, endpoint: McpEndpoint, deadline: float) -> _Session:
        """The open session for `endpoint`, opened (or reopened) when needed, within `deadline`."""
        session = self.sessions.get(endpoint.key)
        if session is not None and session.client is not None and not session.dead and session.ready.is_set():
            return session  # open and ready: no wait to bound (the caller marks its use)
        opened_at = anyio.current_time()
        if session is not None and session.dead:
            self.forget(session)
            session.close()
            session = None
        if session is None:
            for other in list(self.sessions.values()):
                if (endpoint.server_id is not None and not endpoint.account
                        and other.endpoint.server_id == endpoint.server_id and not other.endpoint.account):
                    other.close()  # the server changed since: its old session goes
            session = _Session(endpoint, self)
            self.sessions[endpoint.key] = session
            self.tg.start_soon(session.run)
        with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
            await session.ready.wait()
        if not session.ready.is_set():
            session.close()
            raise UpstreamTimedOut(f"{_who(endpoint)} did not answer within "
                                   f"{round(max(0.0, deadline - opened_at), 1):g} s")
        if session.client is None or (session.dead and session.failure is not None):
            raise unavailable(session.failure, endpoint, session.connection.http_status)
        session.last_used = anyio.current_time()
        return session

    def tools_changed(self, key: str) -> None:
        if key in self._changed or self.tg is None:
            return
        self._changed.add(key)
        self.tg.start_soon(self._tell_changed, key)

    async def _tell_changed(self, key: str) -> None:
        await anyio.sleep(CHANGE_COALESCE_S)
        self._changed.discard(key)
        for callback in list(_changed_callbacks):
            try:
                await anyio.to_thread.run_sync(callback, key)
            except Exception:
                logger.exception("a tools/list_changed callback failed for %s", key)

    # -- operations (each runs as a task of its own in the loop) --

    async def _request(self, endpoint: McpEndpoint, deadline: float, send):
        """`await send(session)` on the endpoint's session; sent again once, on a new session, when the server
        cannot have run it (`_retry_safely`). MCPError (other than a safe retry) is the caller's to map."""
        with metrics.upstream_request("mcp", tenant=endpoint.tenant, server=endpoint.name):
            return await self._request_once_more(endpoint, deadline, send)

    async def _request_once_more(self, endpoint: McpEndpoint, deadline: float, send):
        for attempt in (1, 2):
            session = await self.session(endpoint, deadline)
            session.in_use += 1
            sent_at = anyio.current_time()
            try:
                return await send(session)
            except MCPError as exc:
                if attempt == 1 and await _retry_safely(exc, session, sent_at):
                    continue
                if exc.code in (types.CONNECTION_CLOSED, types.INTERNAL_ERROR) or _session_lost(exc):
                    raise _unavailable(exc, session) from None
                raise
            finally:
                session.in_use -= 1
                session.last_used = anyio.current_time()

    async def list_tools(self, endpoint: McpEndpoint) -> list[UpstreamTool]:
        try:
            return await self._request(endpoint, anyio.current_time() + endpoint.timeout_s,
                                       lambda session: _list_all(session.client, endpoint))
        except TimeoutError:
            raise UpstreamTimedOut(f"{_who(endpoint)} did not list its tools within {endpoint.timeout_s:g} s") \
                from None
        except MCPError as exc:
            raise UpstreamUnavailable(f"{_who(endpoint)} refused to list its tools: "
                                      f"{_bounded(exc.error.message, 300)}") from None
        except (RuntimeError, ValueError):  # a listing the SDK cannot read (it validates each tool)
            logger.warning("MCP server %s answered tools/list with a listing that cannot be read", endpoint.server_id,
                           exc_info=True)
            raise UpstreamUnavailable(f"{_who(endpoint)} answered with a tool list that cannot be read") from None

    async def list_prompts(self, endpoint: McpEndpoint) -> list[ListedPrompt] | None:
        """The server's prompts, or None when it declares no `prompts` capability (nothing is asked then)."""
        async def send(session: _Session):
            if session.client.server_capabilities.prompts is None:
                return None
            return await _list_all_prompts(session.client, endpoint)

        try:
            return await self._request(endpoint, anyio.current_time() + endpoint.timeout_s, send)
        except TimeoutError:
            raise UpstreamTimedOut(f"{_who(endpoint)} did not list its prompts within {endpoint.timeout_s:g} s") \
                from None
        except MCPError as exc:
            raise UpstreamUnavailable(f"{_who(endpoint)} refused to list its prompts: "
                                      f"{_bounded(exc.error.message, 300)}") from None
        except (RuntimeError, ValueError):
            logger.warning("MCP server %s answered prompts/list with a listing that cannot be read",
                           endpoint.server_id, exc_info=True)
            raise UpstreamUnavailable(f"{_who(endpoint)} answered with a prompt list that cannot be read") from None

    async def get_prompt(self, endpoint: McpEndpoint, name: str, arguments: dict[str, str]) -> dict:
        """`prompts/get` upstream: `{"description"?, "messages": [...]}` as JSON. An upstream refusal is
        UpstreamToolError with its text."""
        deadline = anyio.current_time() + endpoint.timeout_s

        async def send(session: _Session):
            with anyio.fail_after(max(0.001, deadline - anyio.current_time())):
                return await session.client.get_prompt(name, arguments or None)

        try:
            result = await self._request(endpoint, deadline, send)
        except TimeoutError:
            raise UpstreamTimedOut(f"{_who(endpoint)} did not answer within {endpoint.timeout_s:g} s") from None
        except MCPError as exc:
            raise UpstreamToolError(f"{_who(endpoint)} refused the prompt: {_bounded(exc.error.message)}") from None
        except (RuntimeError, ValueError) as exc:
            raise UpstreamToolError(f"{_who(endpoint)} answered with a prompt that cannot be used: "
                                    f"{_bounded(str(exc), 300)}") from None
        return result.model_dump(mode="json", by_alias=True, exclude_none=True, include={"description", "messages"})

    async def complete(self, endpoint: McpEndpoint, name: str, argument: dict[str, str],
                       context: dict[str, str]) -> list[str]:
        """`completion/complete` of a prompt's argument upstream: the values offered (text only, at most
        MAX_COMPLETIONS); none when the server declares no `completions` capability (nothing is asked then)."""
        deadline = anyio.current_time() + endpoint.timeout_s

        async def send(session: _Session):
            if session.client.server_capabilities.completions is None:
                return None
            with anyio.fail_after(max(0.001, deadline - anyio.current_time())):
                return await session.client.complete(types.PromptReference(type="ref/prompt", name=name), argument,
                                                     context or None)

        try:
            result = await self._request(endpoint, deadline, send)
        except TimeoutError:
            raise UpstreamTimedOut(f"{_who(endpoint)} did not answer within {endpoint.timeout_s:g} s") from None
        except MCPError as exc:
            raise UpstreamToolError(f"{_who(endpoint)} refused the completion: {_bounded(exc.error.message)}") \
                from None
        except (RuntimeError, ValueError) as exc:
            raise UpstreamToolError(f"{_who(endpoint)} answered with a completion that cannot be used: "
                                    f"{_bounded(str(exc), 300)}") from None
        if result is None:
            return []
        return [value for value in result.completion.values if isinstance(value, str)][:MAX_COMPLETIONS]

    async def call_tool(self, endpoint: McpEndpoint, name: str, arguments: dict, timeout_s: float,
                        progress: Callable | None, log: Callable | None = None, traceparent: str | None = None) -> dict:
        """`traceparent`: the call's span that asked (from the calling process): the request is a span of its
        trace, and the server hears that span's context in `params._meta.traceparent` (OpenTelemetry's MCP
        conventions; per request, as the session is shared: its transport's HTTP headers are the session's)."""
        with remote_span(traceparent, f"tools/call {name}", {
                "mcp.method.name": "tools/call", "gen_ai.tool.name": name, "gen_ai.operation.name": "execute_tool",
                "toolkeeper.mcp.server": endpoint.name}) as span:
            try:
                return await self._call_tool(endpoint, name, arguments, timeout_s, progress, log,
                                             None if span is None else current_traceparent())
            except BaseException as exc:
                span_error(span, type(exc).__name__)
                raise

    async def _call_tool(self, endpoint: McpEndpoint, name: str, arguments: dict, timeout_s: float,
                         progress: Callable | None, log: Callable | None, traceparent: str | None) -> dict:
        deadline = anyio.current_time() + timeout_s
        meta = {TRACEPARENT: traceparent} if traceparent else None

        async def send(session: _Session):
            sink = object()
            if log is not None:
                session.log_sinks[id(sink)] = log
            try:
                return await session.client.call_tool(
                    name, arguments, read_timeout_seconds=max(0.001, deadline - anyio.current_time()),
                    progress_callback=progress, meta=meta)
            finally:
                session.log_sinks.pop(id(sink), None)

        try:
            result = await self._request(endpoint, deadline, send)
        except MCPError as exc:
            if exc.code == types.REQUEST_TIMEOUT:
                raise UpstreamTimedOut(f"{_who(endpoint)} did not answer within {timeout_s:g} s "
                                       "(it was told to stop)") from None
            raise UpstreamToolError(f"{_who(endpoint)} refused the call: {_bounded(exc.error.message)}") from None
        except (RuntimeError, ValueError) as exc:  # a result the SDK rejects (e.g. against the output schema)
            raise UpstreamToolError(f"{_who(endpoint)} answered with a result that cannot be used: "
                                    f"{_bounded(str(exc), 300)}") from None
        content = [_content_json(block) for block in result.content]
        if result.is_error:
            raise UpstreamToolError(_error_text(result.content), content=content,
                                    structured=result.structured_content)
        return {"state": "success", "content": content, "structured": result.structured_content}

    async def probe(self, endpoint: McpEndpoint) -> dict:
        """A connection of its own (not the pooled one): whether the server can be reached now."""
        connection = _Connection(endpoint)
        try:
            with anyio.fail_after(endpoint.timeout_s):
                async with AsyncExitStack() as stack:
                    client = await connection.client(stack, lambda: None)
                    tools = await _list_all(client, endpoint)
                    info = client.server_info
                    return {"server_name": info.name if info else "", "server_version": info.version if info else "",
                            "protocol_version": client.protocol_version, "tool_count": len(tools)}
        except TimeoutError:
            raise UpstreamTimedOut(f"{_who(endpoint)} did not answer within {endpoint.timeout_s:g} s") from None
        except Exception as exc:
            raise unavailable(exc, endpoint, connection.http_status) from None

    async def close_all(self) -> None:
        sessions = list(self.sessions.values())
        for session in sessions:
            session.close()
        for session in sessions:
            await session.done.wait()

    def status(self) -> dict:
        return {key: {"server_id": s.endpoint.server_id, "alive": not s.dead and s.client is not None,
                      "in_use": s.in_use} for key, s in self.sessions.items()}


def _who(endpoint: McpEndpoint) -> str:
    return f"MCP server {endpoint.name}" if endpoint.name else "the MCP server"


def _session_lost(exc: MCPError) -> bool:
    """The server no longer knows the session (a stateful HTTP server restarted): nothing ran."""
    return exc.code == types.INVALID_REQUEST and "session terminated" in exc.error.message.lower()


async def _retry_safely(exc: MCPError, session: _Session, sent_at: float) -> bool:
    """Whether a failed request may be sent again on a new session, knowing the server did not run it: the
    server lost our session (it refused the request); the transport had ended before the request was sent;
    or the session broke because a connection to the server could not be made and no other request was in
    flight on it (so this request's own connection failed: nothing was sent)."""
    if _session_lost(exc):
        session.close()
        return True
    if exc.code != types.CONNECTION_CLOSED:
        return False
    if session.died_at is not None and session.died_at <= sent_at:
        return True
    alone = session.in_use == 1
    with anyio.move_on_after(1.0):
        await session.done.wait()
    return alone and session.failure is not None and any(
        isinstance(leaf, httpx2.ConnectError | httpx2.ConnectTimeout | OutboundRefused)
        for leaf in _leaves(session.failure))


def _unavailable(exc: MCPError, session: _Session) -> UpstreamUnavailable:
    session.close()
    endpoint = session.endpoint
    if session.connection.too_large:
        return UpstreamUnavailable(f"{_who(endpoint)} sent an answer too large to take: {session.connection.too_large}")
    if session.connection.http_status == 401:
        return UpstreamUnauthorized(describe_failure(exc, endpoint, 401))
    if exc.code == types.CONNECTION_CLOSED:
        return UpstreamUnavailable(f"{_who(endpoint)} closed the connection during the request")
    if _session_lost(exc):
        return UpstreamUnavailable(f"{_who(endpoint)} lost the session")
    return UpstreamUnavailable(f"{_who(endpoint)} failed: {_bounded(exc.error.message, 300)}")


async def _list_all(client: Client, endpoint: McpEndpoint) -> list[UpstreamTool]:
    tools: list[UpstreamTool] = []
    cursor, seen = None, set()
    for _page in range(MAX_PAGES):
        with anyio.fail_after(endpoint.timeout_s):
            page = await client.list_tools(cursor=cursor)
        tools.extend(_upstream_tool(tool) for tool in page.tools)
        cursor = page.next_cursor
        if not cursor or cursor in seen or len(tools) >= MAX_TOOLS:
            break
        seen.add(cursor)
    if len(tools) > MAX_TOOLS or cursor:
        logger.warning("MCP server %s lists more tools than are taken (%d at most)", endpoint.server_id, MAX_TOOLS)
    return tools[:MAX_TOOLS]


def _listed_prompt(prompt: types.Prompt) -> ListedPrompt:
    arguments = [{"name": argument.name, "description": argument.description or "",
                  "required": bool(argument.required)} for argument in prompt.arguments or []]
    return ListedPrompt(name=prompt.name, title=getattr(prompt, "title", None) or "",
                        description=prompt.description or "", arguments=arguments)


async def _list_all_prompts(client: Client, endpoint: McpEndpoint) -> list[ListedPrompt]:
    prompts: list[ListedPrompt] = []
    cursor, seen = None, set()
    for _page in range(MAX_PAGES):
        with anyio.fail_after(endpoint.timeout_s):
            page = await client.list_prompts(cursor=cursor)
        prompts.extend(_listed_prompt(prompt) for prompt in page.prompts)
        cursor = page.next_cursor
        if not cursor or cursor in seen or len(prompts) >= MAX_PROMPTS:
            break
        seen.add(cursor)
    if len(prompts) > MAX_PROMPTS or cursor:
        logger.warning("MCP server %s lists more prompts than are taken (%d at most)", endpoint.server_id,
                       MAX_PROMPTS)
    return prompts[:MAX_PROMPTS]


# -- the loop thread --------------------------------------------------------------------------------

class _Loop:
    """This process's event-loop thread and its pool of sessions."""

    def __init__(self):
        started: concurrent.futures.Future = concurrent.futures.Future()
        self.pid = os.getpid()
        self.thread = threading.Thread(target=self._run, args=(started,), name="toolkeeper-mcp", daemon=True)
        self.thread.start()
        self.portal, self.pool, self.asyncio_loop = started.result(timeout=30)

    @staticmethod
    def _run(started: concurrent.futures.Future) -> None:
        async def main() -> None:
            async with BlockingPortal() as portal:
                pool = _Pool()
                async with anyio.create_task_group() as tg:
                    await tg.start(pool.serve)
                    started.set_result((portal, pool, asyncio.get_running_loop()))
                    await portal.sleep_until_stopped()
                    tg.cancel_scope.cancel()

        try:
            anyio.run(main)
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)
            raise


_loop_state: _Loop | None = None
_loop_lock = threading.Lock()
_changed_callbacks: list[Callable[[str], None]] = []


def _loop() -> _Loop:
    global _loop_state
    state = _loop_state
    if state is None or state.pid != os.getpid():
        with _loop_lock:
            if _loop_state is None or _loop_state.pid != os.getpid():
                _loop_state = _Loop()
            state = _loop_state
    return state


def _forget_loop_after_fork() -> None:
    """A forked child has no loop thread: the parent's loop and sessions are not its own."""
    global _loop_state, _loop_lock
    _loop_state = None
    _loop_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_loop_after_fork)


def _here() -> bool:
    """Whether this process holds its sessions itself (a thread of its own), rather than in its host process."""
    return settings.TOOLKEEPER_MCP_HOST_PROCESS or not settings.TOOLKEEPER_MCP_CLIENT_PROCESS


def mcp_sessions_close(timeout_s: float = 5.0) -> None:
    """Close every session of this process (tests, process exit): HTTP sessions are ended, stdio servers
    stopped."""
    host = _host_state
    if host is not None and host.pid == os.getpid() and not host.dead:
        with contextlib.suppress(UpstreamUnavailable):
            host.request({"op": "close_all"}, timeout_s=timeout_s)
    state = _loop_state
    if state is not None and state.pid == os.getpid():
        future = state.portal.start_task_soon(state.pool.close_all)
        try:
            future.result(timeout=timeout_s)
        except (concurrent.futures.TimeoutError, RuntimeError):
            future.cancel()


atexit.register(mcp_sessions_close, 2.0)


def mcp_sessions() -> dict:
    """The sessions this process holds (in its host process, or here): key → {server_id, alive, in_use}."""
    if not _here():
        host = _host_state
        if host is None or host.pid != os.getpid() or host.dead:
            return {}
        return host.request({"op": "status"}, timeout_s=10.0)
    state = _loop_state
    if state is None or state.pid != os.getpid():
        return {}
    return state.portal.call(_status, state.pool)


async def _status(pool: _Pool) -> dict:
    return pool.status()


def mcp_on_tools_changed(callback: Callable[[str], None]) -> Callable[[], None]:
    """Have `callback(endpoint_key)` called (in a worker thread) when a server with an open session says its
    tool list changed. Notifications of one endpoint close together make one call. Returns a remover."""
    if callback not in _changed_callbacks:
        _changed_callbacks.append(callback)

    def remove() -> None:
        if callback in _changed_callbacks:
            _changed_callbacks.remove(callback)

    return remove


# -- what sync code calls ---------------------------------------------------------------------------

def mcp_list_tools(endpoint: McpEndpoint) -> list[UpstreamTool]:
    """Every tool the server lists (pages followed, at most MAX_TOOLS), over the pooled session."""
    if not _here():
        listed = _host().request({"op": "list", "endpoint": endpoint},
                                 timeout_s=endpoint.timeout_s * (MAX_PAGES + 1) + RELAY_SLACK_S)
        return [UpstreamTool(**tool) for tool in listed]
    state = _loop()
    return state.portal.call(state.pool.list_tools, endpoint)


def mcp_list_prompts(endpoint: McpEndpoint) -> list[ListedPrompt] | None:
    """Every prompt the server lists (pages followed, at most MAX_PROMPTS), or None when it offers no prompts."""
    if not _here():
        listed = _host().request({"op": "prompts", "endpoint": endpoint},
                                 timeout_s=endpoint.timeout_s * (MAX_PAGES + 1) + RELAY_SLACK_S)
        return None if listed is None else [ListedPrompt(**prompt) for prompt in listed]
    state = _loop()
    return state.portal.call(state.pool.list_prompts, endpoint)


def mcp_get_prompt(endpoint: McpEndpoint, name: str, arguments: dict[str, str]) -> dict:
    """`prompts/get` over the pooled session, within the endpoint's timeout: `{"description"?, "messages"}`.
    Raises UpstreamToolError (the server refused it), UpstreamUnavailable, UpstreamTimedOut."""
    if not _here():
        return _host().request({"op": "prompt", "endpoint": endpoint, "name": name,
                                "arguments": dict(arguments)}, timeout_s=endpoint.timeout_s + RELAY_SLACK_S)
    state = _loop()
    return state.portal.call(state.pool.get_prompt, endpoint, name, dict(arguments))


def mcp_complete(endpoint: McpEndpoint, name: str, argument: dict[str, str], context: dict[str, str]) -> list[str]:
    """`completion/complete` of the prompt `name`'s argument (`{"name", "value"}`) over the pooled session, within
    the endpoint's timeout. Raises UpstreamToolError (the server refused it), UpstreamUnavailable, UpstreamTimedOut."""
    if not _here():
        return _host().request({"op": "complete", "endpoint": endpoint, "name": name,
                                "argument": dict(argument), "context": dict(context)},
                               timeout_s=endpoint.timeout_s + RELAY_SLACK_S)
    state = _loop()
    return state.portal.call(state.pool.complete, endpoint, name, dict(argument), dict(context))


def mcp_probe(endpoint: McpEndpoint) -> dict:
    """Connect now, on a connection of its own: {server_name, server_version, protocol_version, tool_count}.
    Raises UpstreamUnavailable in plain words."""
    if not _here():
        return _host().request({"op": "probe", "endpoint": endpoint},
                               timeout_s=endpoint.timeout_s + RELAY_SLACK_S)
    state = _loop()
    return state.portal.call(state.pool.probe, endpoint)


def mcp_call_tool(endpoint: McpEndpoint, upstream_name: str, arguments: dict, *, timeout_s: float,
                  on_progress: Callable[[float, float | None, str | None], None] | None = None,
                  on_log: Callable[[str, str], None] | None = None,
                  cancelled: threading.Event | None = None) -> dict:
    """Call a tool over the pooled session: `{"state": "success", "content": [blocks as JSON],
    "structured": structuredContent or None}`.

    `on_progress(progress, total, message)` is called in this thread, in the order the server sent them;
    if it raises, the call is stopped upstream and the exception raised here. `on_log(level, text)` likewise
    with the server's log messages (`notifications/message`, text bounded) while the call is the only one in
    flight on the session. When `cancelled` is set (a
    `tools.python.isolation.CallStop` runs the stop at once; another Event is looked at every 0.1 s), the request
    is cancelled upstream and UpstreamCancelled raised. `timeout_s` bounds connecting and answering; past
    it the server is told to stop and UpstreamTimedOut is raised.
    Raises UpstreamToolError (isError: the upstream text), UpstreamUnavailable, UpstreamCancelled."""
    if cancelled is not None and cancelled.is_set():
        raise UpstreamCancelled("the call was cancelled")
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    request = {"op": "call", "endpoint": endpoint, "name": upstream_name, "arguments": dict(arguments or {}),
               "timeout_s": float(timeout_s), "progress": on_progress is not None, "log": on_log is not None,
               "traceparent": current_traceparent()}  # the calling span (the execution): the request is its child
    if _here():
        state = _loop()
        stop = state.portal.start_task_soon(_operation(state.pool, request, inbox.put)).cancel
    else:
        stop = _host().start(request, inbox.put)
    on_set = getattr(cancelled, "on_set", None)
    remove = on_set(stop) if on_set is not None else None
    give_up_at = time.monotonic() + float(timeout_s) + RELAY_SLACK_S
    try:
        while True:
            try:
                kind, payload = inbox.get(timeout=0.1 if remove is None and cancelled is not None else
                                          max(0.01, give_up_at - time.monotonic()))
            except queue.Empty:
                if cancelled is not None and cancelled.is_set():
                    stop()
                elif time.monotonic() >= give_up_at:
                    stop()
                    _wait_stopped(inbox)
                    raise UpstreamTimedOut(f"{_who(endpoint)} did not answer within {timeout_s:g} s") from None
                continue
            if kind in ("progress", "log"):
                try:
                    (on_progress if kind == "progress" else on_log)(*payload)
                except BaseException:
                    stop()
                    _wait_stopped(inbox)
                    raise
                continue
            if kind == "stopped":
                raise UpstreamCancelled("the call was cancelled")
            if kind == "error":
                raise payload
            return payload
    finally:
        if remove is not None:
            remove()


def _operation(pool: _Pool, request: dict, put: Callable[[tuple], None]):
    """The loop's task for one request (its endpoint an McpEndpoint): what it yields goes to `put` as
    ("progress", (progress, total, message)) …, then ("result", value), ("error", exception) or
    ("stopped", None) when the task was cancelled."""

    async def progress(value: float, total: float | None, message: str | None) -> None:
        put(("progress", (value, total, message)))

    async def log(level: str, text: str) -> None:
        put(("log", (level, text)))

    async def run() -> None:
        op, endpoint = request["op"], request.get("endpoint")
        try:
            if op == "call":
                value = await pool.call_tool(endpoint, request["name"], request["arguments"], request["timeout_s"],
                                             progress if request["progress"] else None,
                                             log if request.get("log") else None, request.get("traceparent"))
            elif op == "list":
                value = [dataclasses.asdict(tool) for tool in await pool.list_tools(endpoint)]
            elif op == "prompts":
                listed = await pool.list_prompts(endpoint)
                value = None if listed is None else [dataclasses.asdict(prompt) for prompt in listed]
            elif op == "prompt":
                value = await pool.get_prompt(endpoint, request["name"], request["arguments"])
            elif op == "complete":
                value = await pool.complete(endpoint, request["name"], request["argument"], request["context"])
            elif op == "probe":
                value = await pool.probe(endpoint)
            elif op == "status":
                value = pool.status()
            elif op == "close_all":
                value = await pool.close_all()
            else:
                raise UpstreamUnavailable(f"unknown operation {op!r}")
        except anyio.get_cancelled_exc_class():
            put(("stopped", None))
            raise
        except BaseException as exc:
            put(("error", exc))
            return
        put(("result", value))

    return run


def _wait_stopped(inbox: queue.SimpleQueue, timeout_s: float = 5.0) -> None:
    """After a cancel, until the call's task has ended (and told the server), progress dropped."""
    give_up_at = time.monotonic() + timeout_s
    while time.monotonic() < give_up_at:
        try:
            kind, _payload = inbox.get(timeout=max(0.01, give_up_at - time.monotonic()))
        except queue.Empty:
            return
        if kind != "progress":
            return


# -- the host process ---------------------------------------------------------------------------------
#
# By default (`TOOLKEEPER_MCP_CLIENT_PROCESS`) a server or worker process keeps its sessions in a helper
# process of its own, started on first use: the SDK's work (HTTP, SSE and JSON-RPC framing, validation,
# stdio servers' pipes) then runs beside the process serving requests instead of taking its interpreter
# lock. Requests and answers are JSON frames on a socket pair; the helper runs the loop thread above and
# ends when its parent does (its socket closes), closing its sessions and stopping its stdio servers. The
# settings the client reads travel with the requests, so the helper always works with its parent's.

HOST_SETTINGS = ("TOOLKEEPER_MCP_STDIO_SERVERS", "TOOLKEEPER_MCP_SESSION_IDLE_S", "TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS",
                 "TOOLKEEPER_OUTBOUND_MAX_MESSAGE_BYTES")
HOST_MAIN = "import sys; from tools.upstream.client import host_main; host_main(int(sys.argv[1]))"
_ERRORS = {cls.__name__: cls for cls in (UpstreamUnavailable, UpstreamTimedOut, UpstreamRefused,
                                         UpstreamUnauthorized, UpstreamToolError, UpstreamCancelled)}


_tenant_slugs: dict[int, str] = {}  # a tenant's slug never changes


def _tenant_of(server) -> str:
    """The server's tenant's slug for the metrics: read once per process (this module is loaded before Django's
    apps in the host process, so it imports no model)."""
    if server.tenant_id is None:
        return ""
    slug = _tenant_slugs.get(server.tenant_id)
    if slug is None:
        if len(_tenant_slugs) >= 10_000:
            _tenant_slugs.clear()
        slug = _tenant_slugs[server.tenant_id] = server.tenant.slug
    return slug


def _endpoint_json(endpoint: McpEndpoint) -> dict:
    return {"key": endpoint.key, "transport": endpoint.transport, "url": endpoint.url,
            "headers": dict(endpoint.headers), "command": endpoint.command, "args": list(endpoint.args),
            "env": dict(endpoint.env),
            "timeout_s": endpoint.timeout_s, "server_id": endpoint.server_id, "name": endpoint.name,
            "account": endpoint.account, "tenant": endpoint.tenant, "ref": endpoint.ref}


def _endpoint_from(fields: dict) -> McpEndpoint:
    return McpEndpoint(**{**fields, "headers": SecretDict(fields["headers"]), "env": SecretDict(fields["env"]),
                          "args": tuple(fields["args"])})


def _error_json(exc: BaseException) -> dict:
    if type(exc) in _ERRORS.values():
        error = {"type": type(exc).__name__, "message": str(exc)}
        if isinstance(exc, UpstreamToolError):
            error.update(content=exc.content, structured=exc.structured)
        return error
    logger.error("the MCP client failed", exc_info=exc)
    return {"type": "UpstreamUnavailable", "message": "the MCP client failed unexpectedly"}


def _error_from(error: dict) -> Exception:
    cls = _ERRORS.get(error.get("type"), UpstreamUnavailable)
    if cls is UpstreamToolError:
        return cls(error["message"], content=error.get("content"), structured=error.get("structured"))
    return cls(error["message"])


def _host_settings() -> dict:
    return {name: getattr(settings, name, None) for name in HOST_SETTINGS}


class _Host:
    """This process's host process, and the thread reading its answers."""

    def __init__(self):
        self.pid = os.getpid()
        self.lock = threading.Lock()  # sending, and the pending table against the reader's last sweep
        self.pending: dict[int, Callable[[tuple], None]] = {}
        self.ids = itertools.count(1)
        self.sent_settings: dict | None = None
        # The endpoint descriptions the host holds, by `McpEndpoint.ref` (least recently used first): a request
        # names a held one by its number; past ENDPOINTS_KEPT the oldest is dropped there too ("forget").
        self.endpoints: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.dead = False
        self.child = start_child(HOST_MAIN, env={HOST_PROCESS_ENV: "1"})
        try:
            self.child.wait_ready(HOST_READY_TIMEOUT_S)
        except ChildGone as exc:
            self.child.close()
            raise UpstreamUnavailable("the MCP client process did not start") from exc
        threading.Thread(target=self._read, name="toolkeeper-mcp-host", daemon=True).start()

    def start(self, request: dict, put: Callable[[tuple], None]) -> Callable[[], None]:
        """Send a request; its messages go to `put` (see `_operation`). Returns what stops it."""
        number = next(self.ids)
        current = _host_settings()
        with self.lock:
            if self.dead:
                raise UpstreamUnavailable("the MCP client process stopped")
            self.pending[number] = put
            try:
                if current != self.sent_settings:
                    self.child.send({"op": "settings", "values": current})
                    self.sent_settings = current
                self.child.send({**request, **self._endpoint_fields(request.get("endpoint")), "id": number})
            except ChildGone:
                del self.pending[number]
                raise UpstreamUnavailable("the MCP client process stopped") from None
        return lambda: self._send_quietly({"op": "cancel", "id": number})

    def _endpoint_fields(self, endpoint: McpEndpoint | None) -> dict:
        """How a request names its endpoint (under the lock, so the host reads them in this order): by number
        when the host holds its description, else the description (which the host then holds, when numbered)."""
        if endpoint is None:
            return {}
        ref = endpoint.ref
        if ref and ref in self.endpoints:
            self.endpoints.move_to_end(ref)
            return {"endpoint": ref}
        if ref:
            self.endpoints[ref] = None
            while len(self.endpoints) > ENDPOINTS_KEPT:
                self.child.send({"op": "forget", "endpoint": self.endpoints.popitem(last=False)[0]})
        return {"endpoint": _endpoint_json(endpoint)}

    def request(self, request: dict, *, timeout_s: float):
        """Send a request and wait for its answer (no progress)."""
        inbox: queue.SimpleQueue = queue.SimpleQueue()
        stop = self.start(request, inbox.put)
        try:
            kind, payload = inbox.get(timeout=timeout_s)
        except queue.Empty:
            stop()
            raise UpstreamTimedOut("the MCP client process did not answer in time") from None
        if kind == "error":
            raise payload
        return payload

    def _send_quietly(self, message: dict) -> None:
        with self.lock, contextlib.suppress(ChildGone):
            if not self.dead:
                self.child.send(message)

    def _read(self) -> None:
        while True:
            try:
                message = self.child.recv()
            except ChildGone:
                break
            if "log" in message:
                record = logging.makeLogRecord(message["log"])
                logging.getLogger(record.name).handle(record)
                continue
            if "changed" in message:
                threading.Thread(target=_tell_callbacks, args=(message["changed"],), daemon=True).start()
                continue
            kind, payload = message["kind"], message.get("payload")
            put = self.pending.get(message["id"]) if kind in ("progress", "log") \
                else self.pending.pop(message["id"], None)
            if put is None:
                continue
            if kind in ("progress", "log"):
                put((kind, tuple(payload)))
            elif kind == "error":
                put((kind, _error_from(payload)))
            else:
                put((kind, payload))
        with self.lock:
            self.dead = True
            orphans, self.pending = list(self.pending.values()), {}
        for put in orphans:
            put(("error", UpstreamUnavailable("the MCP client process stopped during the request")))
        logger.warning("the MCP client process (pid %s) ended; the next request starts another", self.child.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.child.process.wait(timeout=HOST_EXIT_WAIT_S)  # its sessions closing, its stdio servers stopping
        self.child.close()


_host_state: _Host | None = None
_host_lock = threading.Lock()


def _host() -> _Host:
    global _host_state
    host = _host_state
    if host is None or host.dead or host.pid != os.getpid():
        with _host_lock:
            if _host_state is None or _host_state.dead or _host_state.pid != os.getpid():
                _host_state = _Host()
            host = _host_state
    return host


def _forget_host_after_fork() -> None:
    """A forked child starts a host of its own; its copy of the parent's socket is closed, so the parent's host
    still ends with the parent."""
    global _host_state, _host_lock
    if _host_state is not None:
        with contextlib.suppress(OSError):
            _host_state.child.conn.close()
    _host_state = None
    _host_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_host_after_fork)


def _tell_callbacks(key: str) -> None:
    for callback in list(_changed_callbacks):
        try:
            callback(key)
        except Exception:
            logger.exception("a tools/list_changed callback failed for %s", key)


class _ParentLog(logging.Handler):
    """The host's log records, handled by the parent's logging (its handlers, its tests' captures)."""

    def __init__(self, send: Callable[[dict], None]):
        super().__init__()
        self.send = send

    def emit(self, record: logging.LogRecord) -> None:
        fields = {"name": record.name, "levelno": record.levelno, "levelname": record.levelname,
                  "msg": record.getMessage(), "pathname": record.pathname, "lineno": record.lineno,
                  "funcName": record.funcName, "created": record.created, "msecs": record.msecs,
                  "threadName": record.threadName, "process": record.process}
        if record.exc_info:
            fields["exc_text"] = logging.Formatter().formatException(record.exc_info)
        self.send({"log": fields})


def _log_to(send: Callable[[dict], None]) -> None:
    """Every record goes to the parent (levels stay as configured; the handlers are the parent's)."""
    for logger_ in [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)] + [logging.root]:
        if isinstance(logger_, logging.Logger):
            logger_.handlers.clear()
            logger_.propagate = True
    logging.root.addHandler(_ParentLog(send))


def _no_database(self, *args, **kwargs):
    raise RuntimeError("the MCP client process has no database")


def host_main(fd: int) -> None:
    """The host process: requests from the parent run as tasks of the loop thread, their messages go back."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the server; the host ends with it
    django.setup()
    BaseDatabaseWrapper.ensure_connection = _no_database
    parent = ChildSide(fd)
    send_lock = threading.Lock()
    running: dict = {}  # request number → its cancel scope (None before its task starts), the loop thread's own
    endpoints: dict[int, McpEndpoint] = {}  # the descriptions the parent numbered (`_Host._endpoint_fields`)

    def send(message: dict) -> None:
        with send_lock, contextlib.suppress(OSError):
            parent.send(message)

    def answer(number: int) -> Callable[[tuple], None]:
        def put(item: tuple) -> None:
            kind, payload = item
            if kind == "error":
                payload = _error_json(payload)
            try:
                send({"id": number, "kind": kind, "payload": payload})
            except (TypeError, ValueError):  # a value JSON cannot carry (structuredContent is JSON already)
                send({"id": number, "kind": "error",
                      "payload": {"type": "UpstreamUnavailable", "message": "the MCP answer could not be relayed"}})
        return put

    def begin(number: int, message: dict) -> None:
        """In the loop thread: the request's task, in a cancel scope a cancel finds by the request's number."""
        operation = _operation(state.pool, message, answer(number))
        running[number] = None  # its scope is made in the task (anyio's scopes belong to a task)

        async def run() -> None:
            scope = anyio.CancelScope()
            if running.get(number) is True:  # cancelled before it started
                scope.cancel()
            running[number] = scope
            try:
                with scope:
                    await operation()
            except Exception:  # `_operation` answers every failure; nothing may end the pool's task group
                logger.exception("an MCP request failed in the client process")
            finally:
                running.pop(number, None)

        state.pool.tg.start_soon(run)

    def cancel(number: int) -> None:
        if number not in running:
            return
        scope = running[number]
        if scope is None:
            running[number] = True  # not started yet: its task starts cancelled
        else:
            scope.cancel()

    _log_to(send)
    mcp_on_tools_changed(lambda key: send({"changed": key}))
    state = _loop()
    loop = state.asyncio_loop
    send({"ready": True})
    # Each request is handed to the loop without waiting for it to be taken (no portal round trip): this thread
    # goes back to reading, and the loop starts the requests in the order they came, cancels after their requests.
    while (message := parent.recv()) is not None:
        op, number = message.get("op"), message.get("id")
        if op == "settings":
            for name, value in message["values"].items():
                setattr(settings, name, value)
        elif op == "cancel":
            loop.call_soon_threadsafe(cancel, number)
        elif op == "forget":
            endpoints.pop(message["endpoint"], None)
        else:
            described = message.get("endpoint")
            if isinstance(described, dict):
                endpoint = message["endpoint"] = _endpoint_from(described)
                if endpoint.ref:
                    endpoints[endpoint.ref] = endpoint
            elif described is not None:
                message["endpoint"] = endpoints.get(described)
                if message["endpoint"] is None:  # never so: the parent numbers only what it sent
                    answer(number)(("error", UpstreamUnavailable("the MCP client process lost the server's "
                                                                 "description")))
                    continue
            loop.call_soon_threadsafe(begin, number, message)
    mcp_sessions_close()
    tracing_flush()  # os._exit runs no atexit hook
    os._exit(0)
