"""The tool-source registry: how Python tools, built-ins and other apps' tools enter the catalog.

Apps that add tools (MCP servers, skills, knowledge) call `register_source(...)` from their
AppConfig.ready; `tools` never imports them (DESIGN §2).
"""
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolDefinition:
    name: str
    description: str
    input_schema: dict
    source: str
    source_ref: str = ""
    output_schema: dict | None = None
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    concurrency_safe: bool = True
    timeout_s: float = 30.0
    default_groups: tuple[str, ...] = field(default=())


class Source(Protocol):
    kinds: tuple[str, ...]

    def definitions(self, tenant) -> Iterable[ToolDefinition]:
        """The tools this source offers the tenant."""

    def invoke(self, tool, arguments: dict, ctx) -> Any:
        """Run one call; returns the tool's raw value or raises ToolError."""


_sources: list[Source] = []


def register_source(source: Source) -> None:
    if source not in _sources:
        _sources.append(source)


def sources() -> list[Source]:
    return list(_sources)


def source_for(kind: str) -> Source | None:
    for source in _sources:
        if kind in source.kinds:
            return source
    return None
