"""`@tool`: a Python function becomes a governed tool.

The JSON Schema comes from the type hints and the docstring (via pydantic). A parameter typed
`ToolContext` is injected at call time and never appears in the schema. Plain functions, coroutine
functions and generators (sync or async) are tools alike; see `tool` for how each runs and stops.
"""
import asyncio
import contextlib
import inspect
import json
import math
import queue
import re
import threading
import typing
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from tools.catalog.registry import ToolDefinition
from tools.catalog.schemas import tool_name_reserved
from tools.python.isolation import ChildGone, ThreadGuard, ToolStopped, child_run, process_pool

ISOLATIONS = ("thread", "process")
EMIT_EXTRAS = ("completed", "total", "level")  # what an event may carry besides its text, progress and kind


class ToolError(Exception):
    """An error the model should see: `errorType` and a message, never a trace."""

    error_type = "ToolError"
    transient = False  # a failure that may pass when the call runs again (a lost connection, a 503)

    def __init__(self, message: str, *, error_type: str | None = None, transient: bool | None = None):
        super().__init__(message)
        if error_type:
            self.error_type = error_type
        if transient is not None:
            self.transient = transient


class CallCancelled(ToolError):
    error_type = "Cancelled"


class ToolContext:
    """What a running tool may know and do. `emit` reports progress and output to watchers."""

    def __init__(self, *, tenant, session, call, emit: Callable[..., None], cancelled: threading.Event,
                 ask: Callable[..., dict] | None = None):
        self.tenant = tenant
        self.session = session
        self.call = call
        self._emit = emit
        self._ask = ask
        self._cancelled = cancelled
        self._guard: ThreadGuard | None = None  # set while a thread guard runs the tool

    def _platform(self):
        """The context's own work is platform code: a stop never lands inside it."""
        return self._guard.shielded() if self._guard is not None else contextlib.nullcontext()

    @property
    def call_id(self) -> str:
        return self.call.call_id

    @property
    def agent(self) -> str:
        return self.session.agent

    @property
    def user(self) -> str:
        return self.session.user

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def cancel_signal(self) -> threading.Event:
        """The call's stop signal itself, for code that waits where `sleep` and `emit` cannot see, such as a
        request on another event loop (the MCP source): it is set at the call's timeout or cancel."""
        return self._cancelled

    def check_cancelled(self) -> None:
        if self._cancelled.is_set():
            raise CallCancelled("the call was cancelled")

    def sleep(self, seconds: float) -> None:
        """Sleep, waking early (and raising) when the call is cancelled or times out."""
        with self._platform():
            woken = self._cancelled.wait(seconds)
        if woken:
            raise CallCancelled("the call was cancelled")

    def emit(self, text: str = "", *, progress: float | None = None, kind: str | None = None) -> None:
        with self._platform():
            self._emit(text, progress=progress, kind=kind)

    def progress(self, completed: float, total: float | None = None, message: str = "") -> None:
        """Report progress as counts: `completed` so far, of `total` when it is known (MCP's progress and total).
        The event keeps both, and the share done (`progress`, 0 to 1) when there is a total."""
        completed, total = progress_numbers(completed, total)
        if completed is None:
            raise ValueError("progress: `completed` must be a finite number")
        text = message or (f"{completed:g} of {total:g}" if total else f"{completed:g}")
        with self._platform():
            self._emit(text, progress=completed / total if total else None, kind="progress",
                       completed=completed, total=total)

    def ask_user(self, message: str, requested_schema: dict | None = None, *, timeout_s: float | None = None) -> dict:
        """Ask the session's own user and wait for the answer (docs/calls.md, "Questions for the user"):
        `requested_schema` is an elicitation form (an object schema of primitive fields). The call is
        `awaiting_user` meanwhile; the answer is `{"action": "accept"|"decline"|"cancel", "content": {...}|None}`,
        `cancel` when nobody answers in time (`timeout_s`, or the platform's setting)."""
        if self._ask is None:
            raise ToolError("this call cannot ask its user a question", error_type="NoUserToAsk")
        with self._platform():
            return self._ask(message, requested_schema, timeout_s)

    def log(self, text: str, *, level: str = "info") -> None:
        """A log message of the call (`level` one of MCP's: debug, info, notice, warning, error, critical, alert,
        emergency): kept as the call's `log` event, and sent to MCP clients that asked for that level."""
        with self._platform():
            self._emit(text, kind="log", level=level if level in LOG_LEVELS else "info")


LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


def progress_numbers(completed, total) -> tuple[float | None, float | None]:
    """`completed` and `total` as finite numbers, or None: what a tool or an upstream server says is not trusted
    to be either. A total that is not above zero is no total."""
    def number(value) -> float | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        value = float(value)
        return value if math.isfinite(value) and abs(value) < 1e15 else None

    completed, total = number(completed), number(total)
    return completed, total if total is not None and total > 0 else None


@dataclass
class PythonTool:
    name: str
    description: str
    func: Callable[..., Any]
    input_model: type[BaseModel]
    context_param: str | None
    kind: str
    read_only: bool
    destructive: bool
    idempotent: bool
    concurrency_safe: bool
    timeout_s: float
    default_groups: tuple[str, ...]
    isolation: str = "thread"
    output_model: type[BaseModel] | None = None  # the return annotation, when it is a pydantic model

    @property
    def output_schema(self) -> dict | None:
        """A tool whose return annotation is a pydantic model declares its JSON Schema as its output schema (MCP's
        `outputSchema`): the returned model is the result's structured part."""
        return _strip_titles(self.output_model.model_json_schema()) if self.output_model is not None else None

    @property
    def input_schema(self) -> dict:
        return _strip_titles(self.input_model.model_json_schema())

    def definition(self) -> ToolDefinition:
        return ToolDefinition(
            name=self.name, description=self.description, input_schema=self.input_schema,
            output_schema=self.output_schema, source=self.kind,
            source_ref=f"{self.func.__module__}.{self.func.__qualname__}",
            read_only=self.read_only, destructive=self.destructive, idempotent=self.idempotent,
            concurrency_safe=self.concurrency_safe, timeout_s=self.timeout_s,
            default_groups=self.default_groups,
        )

    def __call__(self, arguments: dict, ctx: ToolContext | None = None):
        if self.isolation == "process":
            self._kwargs(arguments, ctx)  # a clear InvalidInput without a trip to the child
            return self._run_in_child(arguments, ctx if isinstance(ctx, ToolContext) else None)
        return self.run_here(arguments, ctx)

    def run_here(self, arguments: dict, ctx: ToolContext | None = None):
        """Run in this thread (and, for coroutines, an event loop thread beside it), whatever the isolation."""
        kwargs = self._kwargs(arguments, ctx)
        ctx = ctx if isinstance(ctx, ToolContext) else None  # what the platform drives: a real context only
        value = _guarded(lambda: _drain(self.func(**kwargs), ctx), ctx)
        if inspect.iscoroutine(value) or inspect.isasyncgen(value):
            value = _run_async(value, ctx)
        return value

    def _kwargs(self, arguments: dict, ctx: ToolContext | None) -> dict:
        try:
            validated = self.input_model.model_validate(arguments)
        except ValidationError as exc:
            raise ToolError(_describe_validation(exc), error_type="InvalidInput") from exc
        kwargs = {name: getattr(validated, name) for name in type(validated).model_fields}
        if self.context_param:
            kwargs[self.context_param] = ctx
        return kwargs

    def _run_in_child(self, arguments: dict, ctx: ToolContext | None):
        request = {
            "module": self.func.__module__, "qualname": self.func.__qualname__, "name": self.name,
            "arguments": arguments,
            "context": {} if ctx is None else {
                "call_id": ctx.call_id, "agent": ctx.agent, "user": ctx.user,
                "tenant": getattr(ctx.tenant, "slug", None),
            },
        }

        def emit(event: dict) -> None:
            if ctx is not None:
                extra = {name: event[name] for name in EMIT_EXTRAS if event.get(name) is not None}
                with ctx._platform():
                    ctx._emit(event.get("text", ""), progress=event.get("progress"), kind=event.get("kind"), **extra)

        def ask(question: dict) -> dict:
            if ctx is None or ctx._ask is None:
                return {"error": {"type": "NoUserToAsk", "message": "this call cannot ask its user a question"}}
            try:
                return {"answer": ctx.ask_user(question.get("message", ""), question.get("requested_schema"),
                                               timeout_s=question.get("timeout_s"))}
            except CallCancelled:
                raise
            except ToolError as exc:
                return {"error": {"type": exc.error_type, "message": str(exc)}}
            except ValueError as exc:
                return {"error": {"type": "InvalidQuestion", "message": str(exc)}}

        try:
            answer = child_run(request, emit=emit, stop=ctx._cancelled if ctx is not None else None, ask=ask)
        except ToolStopped as exc:
            raise CallCancelled("the call was stopped") from exc
        except ChildGone as exc:
            raise ToolError("the tool's process ended before it answered", error_type="ToolFailed") from exc
        if "error" in answer:
            raise ToolError(answer["error"]["message"], error_type=answer["error"]["type"])
        return answer["result"]


def _guarded(step: Callable[[], Any], ctx: ToolContext | None):
    """Run the tool's code in this thread so that its call's stop ends it (tools.python.isolation.ThreadGuard)."""
    guard = ThreadGuard(ctx._cancelled if ctx is not None else None)
    if ctx is not None:
        ctx._guard = guard
    try:
        return guard.run(step)
    except ToolStopped as exc:
        raise CallCancelled("the call was stopped") from exc
    finally:
        if ctx is not None:
            ctx._guard = None


def _drain(value, ctx: ToolContext | None):
    """A generator streams: each item becomes an output event; the result is its return value, or the items."""
    if not inspect.isgenerator(value):
        return value
    items = []
    with contextlib.closing(value):
        while True:
            try:
                item = next(value)
            except StopIteration as end:
                return items if end.value is None else end.value
            _emit_item(ctx, item)
            items.append(item)


async def _consume(value, ctx: ToolContext | None):
    """Await a coroutine, or stream an async generator (as `_drain`); the call's stop cancels the task."""
    on_set = getattr(ctx._cancelled, "on_set", None) if ctx is not None else None
    remove = None
    if on_set is not None:
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        remove = on_set(lambda: loop.call_soon_threadsafe(task.cancel))
    try:
        if not inspect.isasyncgen(value):
            return await value
        items = []
        try:
            async for item in value:
                _emit_item(ctx, item)
                items.append(item)
        finally:
            await value.aclose()
        return items
    finally:
        if remove is not None:
            remove()


def _run_async(value, ctx: ToolContext | None):
    """Coroutines and async generators run on an event loop of their own, in a thread beside this one. Django
    refuses database work in a thread with a running loop, so the context's emits are written here: they come
    over a queue, and the tool waits for each, as it would for a direct write."""
    outbox: queue.SimpleQueue = queue.SimpleQueue()

    def loop_thread() -> None:
        try:
            outcome = (True, _guarded(lambda: asyncio.run(_consume(value, ctx)), ctx))
        except BaseException as exc:  # handed to the calling thread, which raises it
            outcome = (False, exc)
        outbox.put(("done", outcome, None))

    home = threading.get_ident()
    direct = ctx._emit if ctx is not None else None

    def relayed(text: str = "", *, progress: float | None = None, kind: str | None = None, **extra) -> None:
        if threading.get_ident() == home:
            return direct(text, progress=progress, kind=kind, **extra)
        written: Future = Future()
        outbox.put(("emit", (text, progress, kind, extra), written))
        return written.result()

    if ctx is not None:
        ctx._emit = relayed
    runner = threading.Thread(target=loop_thread, name="toolkeeper-async-tool", daemon=True)
    try:
        runner.start()
        while True:
            what, payload, written = outbox.get()
            if what == "done":
                break
            text, progress, kind, extra = payload
            try:
                direct(text, progress=progress, kind=kind, **extra)
            except BaseException as exc:
                written.set_exception(exc)
            else:
                written.set_result(None)
    finally:
        if ctx is not None:
            ctx._emit = direct
    runner.join()
    ok, result = payload
    if ok:
        return result
    if isinstance(result, asyncio.CancelledError) and ctx is not None and ctx.cancelled:
        raise CallCancelled("the call was cancelled") from result
    raise result


def _emit_item(ctx: ToolContext | None, item) -> None:
    if ctx is None:
        return
    text = item if isinstance(item, str) else json.dumps(item, ensure_ascii=False, default=str)
    ctx.emit(text, kind="output")


_registry: dict[str, PythonTool] = {}


def python_tools() -> dict[str, PythonTool]:
    return dict(_registry)


def python_tool(name: str) -> PythonTool | None:
    return _registry.get(name)


def tool_processes_warm() -> None:
    """Start the pool of tool processes ahead of the first call, when a registered tool runs in one."""
    if any(spec.isolation == "process" for spec in _registry.values()):
        process_pool()


def tool(
    func: Callable | None = None,
    *,
    name: str | None = None,
    read_only: bool = False,
    destructive: bool = False,
    idempotent: bool = False,
    concurrency_safe: bool = True,
    timeout: float = 30.0,
    groups: tuple[str, ...] = (),
    kind: str = "python",
    isolation: str = "thread",
):
    """Register a Python function as a tool. Use bare (`@tool`) or with options.

    A method becomes a tool through an instance: `tool(instance.method, name=...)` (its schema starts after
    `self`, calls run on that instance). `@tool` on a method in its class body is refused (TypeError), as it
    would ask the model for `self`; a staticmethod is a plain function. A refused tool is not registered.

    What the function may be:
    - a plain function: its return value is the result;
    - an `async def` coroutine function: awaited on an event loop of its own;
    - a generator (sync or async): a streaming tool. Each yielded item is an output event (strings as they
      are, other values as JSON); the result is the generator's return value, or the list of the items when
      it returns None (an async generator cannot return a value).

    How a call is stopped at its timeout or cancellation (`timeout` seconds; operators may change it):
    - Every call's status is settled first (timed_out / interrupted); a late result is discarded.
    - `isolation="thread"` (the default): the tool runs in a worker thread of the server (or of the Celery
      worker process). A cooperative tool stops at once: `ctx.sleep` and `ctx.emit` raise, `ctx.cancelled`
      turns true, a coroutine's task is cancelled at its current `await`. Any other tool is stopped
      STOP_GRACE_S (1 s) later by an exception (`ThreadStop`, a BaseException) raised at its next Python
      instruction, repeated until it has left; its thread then serves other calls. Not stoppable this way:
      a tool blocked inside one C call (a huge integer power, a regular expression, `time.sleep`, a socket
      read without timeout) keeps its thread until that call returns, and a C call that holds the GIL
      stalls every other thread of the process until it returns.
    - `isolation="process"`: the tool runs in a child process from a small pool of pre-started ones and is
      stopped by killing the child (the pool starts a replacement), whatever it is doing. Use it for tools
      that spend long in C code or must be killable. The function must be defined at module level (the child
      imports it); arguments and the result must be JSON; the child has no database: `ctx.tenant`,
      `ctx.session` and `ctx.call` are None, `ctx.call_id`, `ctx.agent` and `ctx.user` are set, `ctx.emit`
      events are relayed to the server, which writes them, and the child is killed rather than told, so
      `ctx.cancelled` stays false. Each call costs a round trip between processes; when more such calls run
      at once than processes are ready (TOOLKEEPER_TOOL_PROCESSES), a call waits for one to start, within
      its timeout.
    In the Celery workers the same holds; a worker process runs one call at a time. A GIL-holding C call
    stalls that process only, watchdog included: the call is settled when the C call returns, or when
    Celery's hard time limit (timeout + 30 s) kills the process (Celery starts another; the call, whose lease
    is no longer renewed, ends as WorkerLost, or runs again if its tool is idempotent, three runs at most).
    Celery's soft time limit (timeout + 5 s) raises in a thread-run tool the stop has not ended by then.
    A process-run tool is killed at its timeout there too, and its worker process is free at once.
    """

    def register(fn: Callable) -> Callable:
        spec = build_python_tool(
            fn, name=name or fn.__name__, read_only=read_only, destructive=destructive,
            idempotent=idempotent, concurrency_safe=concurrency_safe, timeout=timeout,
            groups=tuple(groups), kind=kind, isolation=isolation,
        )
        if not inspect.ismethod(fn):  # a bound method takes no attributes; its tool is in the registry
            with contextlib.suppress(AttributeError, TypeError):
                fn.tool = spec
        _registry[spec.name] = spec  # last: a refused tool leaves the registry as it was
        return fn

    return register(func) if func is not None else register


def build_python_tool(fn, *, name, read_only=False, destructive=False, idempotent=False, concurrency_safe=True,
                      timeout=30.0, groups=(), kind="python", isolation="thread"):
    if not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name):
        raise ValueError(f"tool name {name!r} must be 1-64 letters, digits, '_' or '-'")
    if tool_name_reserved(name):
        raise ValueError(f"tool name {name!r} is reserved for a meta tool of the platform")
    if isolation not in ISOLATIONS:
        raise ValueError(f"tool {name}: isolation must be one of {', '.join(ISOLATIONS)}")
    if _method_in_class_body(fn):
        raise TypeError(f"tool {name}: {fn.__qualname__} is a method, whose {_first_parameter(fn)!r} no model can "
                        f"give; register an instance's method instead (tool(instance.{fn.__name__})), or make it a "
                        "function or a staticmethod")
    if isolation == "process" and (inspect.ismethod(fn) or "<locals>" in getattr(fn, "__qualname__", "<locals>")
                                   or fn.__module__ == "__main__"):
        raise ValueError(f"tool {name}: a tool run in a process must be a function defined at module level of an "
                         "importable module, so that the process can import it")
    summary, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
    hints = typing.get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    context_param = None
    for param in inspect.signature(fn).parameters.values():
        annotation = hints.get(param.name, Any)
        if annotation is ToolContext:
            context_param = param.name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name}: *args/**kwargs cannot be described to a model")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, Field(default, description=arg_docs.get(param.name)))
    model = create_model(f"{name}_input", __config__=ConfigDict(extra="forbid"), **fields)
    returned = hints.get("return")
    output_model = returned if isinstance(returned, type) and issubclass(returned, BaseModel) else None
    return PythonTool(
        name=name, description=summary, func=fn, input_model=model, context_param=context_param,
        kind=kind, read_only=read_only, destructive=destructive, idempotent=idempotent,
        concurrency_safe=concurrency_safe, timeout_s=float(timeout), default_groups=groups, isolation=isolation,
        output_model=output_model,
    )


def _first_parameter(fn) -> str | None:
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    return parameters[0].name if parameters and parameters[0].kind in (
        inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) else None


def _method_in_class_body(fn) -> bool:
    """Whether `fn` is a function decorated in a class body that takes its instance or class first (`self`,
    `cls`): decorated there, it is not bound yet, and nothing could give it that argument. A bound method
    (`instance.method`, `Class.classmethod`) is fine: its signature leaves the bound argument out."""
    if not inspect.isfunction(fn):
        return False
    scopes = fn.__qualname__.split(".")
    return len(scopes) > 1 and scopes[-2] != "<locals>" and _first_parameter(fn) in ("self", "cls")


_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):\s*$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Google-style docstring: the text before the sections, and the `Args:` entries."""
    lines = doc.splitlines()
    summary: list[str] = []
    args: dict[str, str] = {}
    section = None
    current = None
    for line in lines:
        match = _SECTION.match(line.strip())
        if match:
            section = match.group(1)
            current = None
            continue
        if section is None:
            summary.append(line)
        elif section in ("Args", "Arguments", "Parameters"):
            entry = re.match(r"^\s*(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$", line)
            if entry and (not line.startswith(" " * 8)):
                current = entry.group(1)
                args[current] = entry.group(3).strip()
            elif current and line.strip():
                args[current] = f"{args[current]} {line.strip()}".strip()
    return "\n".join(summary).strip(), args


def _strip_titles(schema):
    if isinstance(schema, dict):
        return {
            key: _strip_titles(value)
            for key, value in schema.items()
            if not (key == "title" and isinstance(value, str))
        }
    if isinstance(schema, list):
        return [_strip_titles(item) for item in schema]
    return schema


def _describe_validation(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        location = ".".join(str(p) for p in error["loc"]) or "input"
        parts.append(f"{location}: {error['msg']}")
    return "; ".join(parts)
