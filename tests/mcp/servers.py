"""A real MCP server for the tests, built on the SDK's low-level `Server`, served over stdio, streamable
HTTP or SSE:

    python -m tests.mcp.servers stdio
    python -m tests.mcp.servers http PORT      (streamable HTTP at /mcp, SSE at /sse; GET /state)

What it did is appended, one JSON object a line, to the file named by MCP_TEST_STATE (when set): the
calls it received, the Authorization header each HTTP request carried, the calls it saw cancelled, so a
test can check what really reached the upstream side. MCP_TEST_PAGE_SIZE pages `tools/list`; over stdio,
MCP_TEST_SHOUT is written to stderr at start (to check it is masked in the platform's log).

Tools:
- `echo`: returns its arguments, as JSON text and as structuredContent
- `slow(steps, delay, tag)`: reports progress `steps` times ("step i of n"), sleeping `delay` between;
  a cancel is recorded (`{"event": "cancelled", "tag": tag}`)
- `fail(message)`: answers isError with the message
- `image`: an image block and a text block; `resource`: an embedded text resource
- `add_tool(name)`: adds a tool of that name (it echoes) and tells the clients their tool list changed
  (notifications/tools/list_changed, or an event on their subscriptions/listen stream); with `kind: "prompt"`,
  a prompt of that name, and their prompt list changed
- `end_listens`: ends every open subscriptions/listen stream gracefully (nothing changed)
- `big(size)`: a text block of `size` bytes
- `whoami`: the process id and the Authorization header the request carried
- `die_once(marker)`: the first call (no file at `marker`) creates the file and ends the process at once
- `env(names)`: the values of those environment variables (None when unset)
- `lookup(key)`: annotated readOnlyHint and idempotentHint
- `files.read_a_really_long_name_…` (over 64 characters, with a dot): echoes
- `chatty(tag)`: sends log messages (notifications/message) at debug, info and warning, the last one 10,000
  characters long, then answers
- `bad_shape`: declares an output schema (an integer `n`) and answers structuredContent that breaks it

Traces: a call whose request carries `params._meta.traceparent` is recorded (`{"event": "traceparent", ...}`);
with MCP_TEST_OTLP (an OTLP/HTTP endpoint) set, the server also exports a span of its own for the call, a child of
that traceparent (service name `test-mcp-upstream`), as an instrumented server would.

`/sse?idle_close=S` is an SSE stream that the server cuts once nothing was sent on it for S seconds (as an idle
timeout of a server or a proxy in front of it does).

Prompts (`prompts/get` is recorded with the Authorization header it carried):
- `greet(name, mood?)`: a user message greeting `name`; `picture`: an image; `brief(topic)`: an embedded
  resource and an assistant message; `docs.search` (a dotted name);
- `completion/complete` offers for `greet`'s `name` the names of GREETED that start with the value;
- MCP_TEST_PROMPT_FILE names a file read at each listing: a line `+NAME` adds a prompt of that name (no
  arguments), a line `-NAME` takes one away.
"""
import contextlib
import json
import os
import sys
from functools import cache

import anyio
import mcp_types as types
import uvicorn
from mcp.server import Server
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.sse import SseServerTransport
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, PromptsListChanged, ToolsListChanged
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

LONG_NAME = "files.read_a_really_long_name_that_keeps_going_well_past_the_sixty_four_limit"
PIXEL_PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
OPEN_OBJECT = {"type": "object", "additionalProperties": True}

BASE_TOOLS = [
    types.Tool(name="echo", description="Returns its arguments.", input_schema=OPEN_OBJECT),
    types.Tool(name="slow", description="Reports progress, slowly.", input_schema={
        "type": "object",
        "properties": {"steps": {"type": "integer"}, "delay": {"type": "number"}, "tag": {"type": "string"}},
    }),
    types.Tool(name="fail", description="Always fails.", input_schema={
        "type": "object", "properties": {"message": {"type": "string"}},
    }),
    types.Tool(name="image", description="A one-pixel image.", input_schema={"type": "object"}),
    types.Tool(name="resource", description="An embedded resource.", input_schema={"type": "object"}),
    types.Tool(name="add_tool", description="Adds a tool.", input_schema={
        "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
    }),
    types.Tool(name="big", description="A large answer.", input_schema={
        "type": "object", "properties": {"size": {"type": "integer"}}, "required": ["size"],
    }),
    types.Tool(name="end_listens", description="Ends the listen streams.", input_schema={"type": "object"}),
    types.Tool(name="whoami", description="Who the server is, what it was sent.", input_schema={"type": "object"}),
    types.Tool(name="die_once", description="Ends the server the first time.", input_schema={
        "type": "object", "properties": {"marker": {"type": "string"}}, "required": ["marker"],
    }),
    types.Tool(name="env", description="The values of environment variables.", input_schema={
        "type": "object", "properties": {"names": {"type": "array", "items": {"type": "string"}}},
    }),
    types.Tool(name="lookup", description="Looks a key up.", input_schema={
        "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"],
    }, output_schema={"type": "object", "properties": {"key": {"type": "string"}, "value": {"type": "string"}}},
        annotations=types.ToolAnnotations(read_only_hint=True, idempotent_hint=True, destructive_hint=False)),
    types.Tool(name=LONG_NAME, description="A long dotted name.", input_schema=OPEN_OBJECT),
    types.Tool(name="chatty", description="Logs while it works.", input_schema={
        "type": "object", "properties": {"tag": {"type": "string"}}}),
    types.Tool(name="bad_shape", description="Breaks its own output schema.", input_schema={"type": "object"},
               output_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
]
added: list[types.Tool] = []
bus = InMemorySubscriptionBus()  # tools/list_changed for 2026-era clients (subscriptions/listen)
listens = ListenHandler(bus)


BASE_PROMPTS = [
    types.Prompt(name="greet", title="Greeting", description="Greets someone.", arguments=[
        types.PromptArgument(name="name", description="Whom to greet.", required=True),
        types.PromptArgument(name="mood", description="How.", required=False),
    ]),
    types.Prompt(name="picture", description="A one-pixel picture."),
    types.Prompt(name="brief", description="A brief with the notes attached.", arguments=[
        types.PromptArgument(name="topic", required=True)]),
    types.Prompt(name="docs.search", description="A dotted name."),
]


added_prompts: list[types.Prompt] = []


def prompts_now() -> list[types.Prompt]:
    prompts = BASE_PROMPTS + added_prompts
    path = os.environ.get("MCP_TEST_PROMPT_FILE")
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as lines:
            for line in lines.read().splitlines():
                if line.startswith("+"):
                    prompts.append(types.Prompt(name=line[1:], description=f"Added: {line[1:]}."))
                elif line.startswith("-"):
                    prompts = [prompt for prompt in prompts if prompt.name != line[1:]]
    return prompts


def record(event: str, **data) -> None:
    path = os.environ.get("MCP_TEST_STATE")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"event": event, "pid": os.getpid(), **data}) + "\n")


def text(value) -> types.TextContent:
    return types.TextContent(type="text", text=value if isinstance(value, str) else json.dumps(value))


def authorization(ctx) -> str | None:
    request = getattr(ctx, "request", None)
    headers = getattr(request, "headers", None)
    return headers.get("authorization") if headers is not None else None


async def list_tools(ctx, params) -> types.ListToolsResult:
    tools = BASE_TOOLS + added
    size = int(os.environ.get("MCP_TEST_PAGE_SIZE") or 0)
    if not size:
        return types.ListToolsResult(tools=tools)
    start = int(params.cursor) if params is not None and params.cursor else 0
    following = start + size
    return types.ListToolsResult(tools=tools[start:following],
                                 next_cursor=str(following) if following < len(tools) else None)


def _traceparent(ctx, params) -> str | None:
    for meta in (getattr(params, "meta", None), getattr(ctx, "meta", None)):
        found = meta.get("traceparent") if isinstance(meta, dict) else (getattr(meta, "model_extra", None) or {}).get(
            "traceparent")
        if isinstance(found, str):
            return found
    return None


@cache
def _tracer():
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "test-mcp-upstream",
                                                        "process.pid": os.getpid()}))
    endpoint = os.environ["MCP_TEST_OTLP"].rstrip("/") + "/v1/traces"
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider.get_tracer("tests.mcp.servers")


def _server_span(name: str, traceparent: str | None):
    if not traceparent or not os.environ.get("MCP_TEST_OTLP"):
        return contextlib.nullcontext()
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    return _tracer().start_as_current_span(f"tools/call {name}", context=parent, kind=SpanKind.SERVER,
                                           attributes={"mcp.method.name": "tools/call"})


async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    traceparent = _traceparent(ctx, params)
    if traceparent is not None:
        record("traceparent", name=params.name, traceparent=traceparent)
    with _server_span(params.name, traceparent):
        return await _call_tool(ctx, params)


async def _call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    name, arguments = params.name, params.arguments or {}
    record("call", name=name, arguments=arguments, authorization=authorization(ctx))
    if name in ("echo", LONG_NAME) or any(tool.name == name for tool in added):
        return types.CallToolResult(content=[text(arguments)], structured_content=arguments)
    if name == "slow":
        steps, delay, tag = int(arguments.get("steps", 3)), float(arguments.get("delay", 0.05)), arguments.get("tag")
        try:
            for i in range(1, steps + 1):
                await ctx.session.report_progress(i, steps, f"step {i} of {steps}")
                await anyio.sleep(delay)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                record("cancelled", tag=tag)
            raise
        return types.CallToolResult(content=[text(f"done {steps}")], structured_content={"steps": steps})
    if name == "fail":
        return types.CallToolResult(content=[text(arguments.get("message", "it broke"))], is_error=True)
    if name == "image":
        return types.CallToolResult(content=[types.ImageContent(type="image", data=PIXEL_PNG, mime_type="image/png"),
                                             text("a pixel")])
    if name == "resource":
        notes = types.TextResourceContents(uri="file:///notes.txt", mime_type="text/plain", text="the notes")
        return types.CallToolResult(content=[types.EmbeddedResource(type="resource", resource=notes)])
    if name == "add_tool" and arguments.get("kind") == "prompt":
        added_prompts.append(types.Prompt(name=arguments["name"], description="Added at run time."))
        await bus.publish(PromptsListChanged())
        await ctx.session.send_prompt_list_changed()
        return types.CallToolResult(content=[text(f"added the prompt {arguments['name']}")])
    if name == "add_tool":
        added.append(types.Tool(name=arguments["name"], description="Added at run time.", input_schema=OPEN_OBJECT))
        await bus.publish(ToolsListChanged())  # clients of the 2026 protocol listen for it
        await ctx.session.send_tool_list_changed()  # earlier ones get the notification (dropped for the others)
        return types.CallToolResult(content=[text(f"added {arguments['name']}")])
    if name == "big":
        return types.CallToolResult(content=[text("x" * int(arguments["size"]))])
    if name == "end_listens":
        listens.close()
        return types.CallToolResult(content=[text("ended")])
    if name == "whoami":
        return types.CallToolResult(content=[text("whoami")],
                                    structured_content={"pid": os.getpid(), "authorization": authorization(ctx)})
    if name == "die_once":
        marker = arguments["marker"]
        if not os.path.exists(marker):
            with open(marker, "w") as out:
                out.write(str(os.getpid()))
            os._exit(3)
        return types.CallToolResult(content=[text("survived")])
    if name == "env":
        return types.CallToolResult(content=[text("env")],
                                    structured_content={n: os.environ.get(n) for n in arguments.get("names", [])})
    if name == "lookup":
        key = arguments.get("key", "")
        return types.CallToolResult(content=[text(f"{key}=value")], structured_content={"key": key, "value": "value"})
    if name == "chatty":
        tag = arguments.get("tag", "")
        for level, said in (("debug", f"{tag} debug detail"), ("info", f"{tag} started"),
                            ("warning", f"{tag} warns " + "w" * 10_000)):
            await ctx.session.send_log_message(level, said, logger="chatty", related_request_id=ctx.request_id)
            await anyio.sleep(0.02)
        return types.CallToolResult(content=[text(f"{tag} chatted")])
    if name == "bad_shape":
        return types.CallToolResult(content=[text("n is not a number")], structured_content={"n": "many"})
    raise MCPError(code=types.INVALID_PARAMS, message=f"unknown tool {name}")


class IdleTimeout(Exception):
    """Ends an idle SSE stream: uvicorn closes the connection of a response that raised after it started."""


async def list_prompts(ctx, params) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=prompts_now())


async def get_prompt(ctx, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    name, arguments = params.name, params.arguments or {}
    record("prompt", name=name, arguments=arguments, authorization=authorization(ctx))
    if not any(prompt.name == name for prompt in prompts_now()):
        raise MCPError(code=types.INVALID_PARAMS, message=f"unknown prompt {name}")
    if name == "greet":
        words = f"Hello {arguments.get('name')}" + (f", {arguments['mood']}" if arguments.get("mood") else "")
        return types.GetPromptResult(description="A greeting.", messages=[
            types.PromptMessage(role="user", content=text(words))])
    if name == "picture":
        return types.GetPromptResult(messages=[types.PromptMessage(
            role="user", content=types.ImageContent(type="image", data=PIXEL_PNG, mime_type="image/png"))])
    if name == "brief":
        notes = types.TextResourceContents(uri="file:///notes.txt", mime_type="text/plain",
                                           text=f"notes on {arguments.get('topic')}")
        return types.GetPromptResult(messages=[
            types.PromptMessage(role="user", content=types.EmbeddedResource(type="resource", resource=notes)),
            types.PromptMessage(role="assistant", content=text("Read the notes."))])
    return types.GetPromptResult(messages=[types.PromptMessage(role="user", content=text(f"the prompt {name}"))])


GREETED = ("Ada", "Alan", "Grace")


async def complete(ctx, params: types.CompleteRequestParams) -> types.CompleteResult:
    """The names `greet` knows, by their start; recorded with the Authorization header the request carried."""
    record("complete", ref=params.ref.model_dump(mode="json"), argument=params.argument.model_dump(),
           authorization=authorization(ctx))
    values = [name for name in GREETED if name.startswith(params.argument.value)] \
        if getattr(params.ref, "name", "") == "greet" and params.argument.name == "name" else []
    return types.CompleteResult(completion=types.Completion(values=values))


def build() -> Server:
    return Server("toolkeeper-test", version="1.2.3", on_list_tools=list_tools, on_call_tool=call_tool,
                  on_list_prompts=list_prompts, on_get_prompt=get_prompt, on_completion=complete,
                  on_subscriptions_listen=listens, get_tool_input_schema=lambda name: None)


def options(server: Server):
    return server.create_initialization_options(NotificationOptions(tools_changed=True))


async def serve_stdio() -> None:
    server = build()
    print("test MCP server on stdio", file=sys.stderr, flush=True)
    if os.environ.get("MCP_TEST_SHOUT"):
        print(f"my secret is {os.environ['MCP_TEST_SHOUT']}!", file=sys.stderr, flush=True)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, options(server))


def http_app():
    """Streamable HTTP at /mcp (stateful, so that list_changed has a stream to travel on), SSE at /sse."""
    server = build()
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    sse = SseServerTransport("/messages/", security_settings=security)

    async def handle_sse(request: Request) -> Response:
        record("sse_connect", authorization=request.headers.get("authorization"), query=request.url.query)
        idle_close = float(request.query_params.get("idle_close") or 0)
        if idle_close:
            await idle_closing_sse(request, idle_close)
        async with sse.connect_sse(request.scope, request.receive, request._send) as streams:
            await server.run(streams[0], streams[1], options(server))
        return Response()

    async def idle_closing_sse(request: Request, idle_close: float) -> None:
        """As a proxy or a server with an idle timeout does: the stream is cut (the connection closed, the
        response unfinished) once nothing was sent on it for `idle_close` seconds."""
        last_sent = [anyio.current_time()]

        async def send(message) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                last_sent[0] = anyio.current_time()
            await request._send(message)

        async def serve() -> None:
            async with sse.connect_sse(request.scope, request.receive, send) as streams:
                await server.run(streams[0], streams[1], options(server))

        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            while anyio.current_time() - last_sent[0] < idle_close:
                await anyio.sleep(0.05)
            record("sse_idle_closed", query=request.url.query)
            raise IdleTimeout(f"nothing sent for {idle_close} s")

    async def state(request: Request) -> JSONResponse:
        return JSONResponse({"pid": os.getpid(), "added": [tool.name for tool in added]})

    app = server.streamable_http_app(streamable_http_path="/mcp", transport_security=security, custom_starlette_routes=[
        Route("/sse", endpoint=handle_sse, methods=["GET"]),
        Mount("/messages/", app=sse.handle_post_message),
        Route("/state", endpoint=state, methods=["GET"]),
    ])
    return app


def main(argv: list[str]) -> None:
    if argv[:1] == ["stdio"]:
        anyio.run(serve_stdio)
    elif argv[:1] == ["http"]:
        port = int(argv[1])
        print(f"test MCP server on http://127.0.0.1:{port}", file=sys.stderr, flush=True)
        uvicorn.run(http_app(), host="127.0.0.1", port=port, log_level="warning")
    else:
        raise SystemExit("usage: python -m tests.mcp.servers stdio | http PORT")


if __name__ == "__main__":
    main(sys.argv[1:])
