"""The client side of MCP (DESIGN §8): reaching a tenant's MCP servers.

Interface only, for now: the pooled sessions, listing and calling are being built.
"""
from dataclasses import dataclass, field


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


@dataclass(frozen=True)
class UpstreamTool:
    """A tool as the server lists it."""

    name: str
    description: str
    input_schema: dict
    output_schema: dict | None = None
    annotations: dict = field(default_factory=dict)  # readOnlyHint, destructiveHint, idempotentHint, …


class UpstreamUnavailable(Exception):
    """The server could not be reached, or its session broke; the message is safe to show a tenant."""


class UpstreamToolError(Exception):
    """The server ran the tool and answered `isError`; the message is the upstream text."""
