"""`@tool`: a Python function becomes a governed tool.

The JSON Schema comes from the type hints and the docstring (via pydantic). A parameter typed
`ToolContext` is injected at call time and never appears in the schema.
"""
import inspect
import re
import threading
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from .registry import ToolDefinition


class ToolError(Exception):
    """An error the model should see: `errorType` and a message, never a trace."""

    error_type = "ToolError"

    def __init__(self, message: str, *, error_type: str | None = None):
        super().__init__(message)
        if error_type:
            self.error_type = error_type


class CallCancelled(ToolError):
    error_type = "Cancelled"


class ToolContext:
    """What a running tool may know and do. `emit` reports progress and output to watchers."""

    def __init__(self, *, tenant, session, call, emit: Callable[..., None], cancelled: threading.Event):
        self.tenant = tenant
        self.session = session
        self.call = call
        self._emit = emit
        self._cancelled = cancelled

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

    def check_cancelled(self) -> None:
        if self._cancelled.is_set():
            raise CallCancelled("the call was cancelled")

    def sleep(self, seconds: float) -> None:
        """Sleep, waking early (and raising) when the call is cancelled or times out."""
        if self._cancelled.wait(seconds):
            raise CallCancelled("the call was cancelled")

    def emit(self, text: str = "", *, progress: float | None = None, kind: str | None = None) -> None:
        self._emit(text, progress=progress, kind=kind)


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

    @property
    def input_schema(self) -> dict:
        return _strip_titles(self.input_model.model_json_schema())

    def definition(self) -> ToolDefinition:
        return ToolDefinition(
            name=self.name, description=self.description, input_schema=self.input_schema,
            source=self.kind, source_ref=f"{self.func.__module__}.{self.func.__qualname__}",
            read_only=self.read_only, destructive=self.destructive, idempotent=self.idempotent,
            concurrency_safe=self.concurrency_safe, timeout_s=self.timeout_s,
            default_groups=self.default_groups,
        )

    def __call__(self, arguments: dict, ctx: ToolContext | None = None):
        try:
            validated = self.input_model.model_validate(arguments)
        except ValidationError as exc:
            raise ToolError(_describe_validation(exc), error_type="InvalidInput") from exc
        kwargs = {name: getattr(validated, name) for name in type(validated).model_fields}
        if self.context_param:
            kwargs[self.context_param] = ctx
        return self.func(**kwargs)


_registry: dict[str, PythonTool] = {}


def python_tools() -> dict[str, PythonTool]:
    return dict(_registry)


def python_tool(name: str) -> PythonTool | None:
    return _registry.get(name)


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
):
    """Register a Python function as a tool. Use bare (`@tool`) or with options."""

    def register(fn: Callable) -> Callable:
        spec = build_python_tool(
            fn, name=name or fn.__name__, read_only=read_only, destructive=destructive,
            idempotent=idempotent, concurrency_safe=concurrency_safe, timeout=timeout,
            groups=tuple(groups), kind=kind,
        )
        _registry[spec.name] = spec
        fn.tool = spec
        return fn

    return register(func) if func is not None else register


def build_python_tool(fn, *, name, read_only, destructive, idempotent, concurrency_safe, timeout, groups, kind):
    if not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name):
        raise ValueError(f"tool name {name!r} must be 1-64 letters, digits, '_' or '-'")
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
    return PythonTool(
        name=name, description=summary, func=fn, input_model=model, context_param=context_param,
        kind=kind, read_only=read_only, destructive=destructive, idempotent=idempotent,
        concurrency_safe=concurrency_safe, timeout_s=float(timeout), default_groups=groups,
    )


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
