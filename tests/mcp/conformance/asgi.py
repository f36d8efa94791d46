"""Test-only ASGI application for the MCP conformance run: the product's application, with an agent API key
and an agent presented on every `/mcp` request that comes without them. The conformance CLI sends no headers
of its own; everything else (Host and Origin checks, the protocol) is the product's.

The key is the demo tenant's agent key that `manage.py bootstrap` wrote to the data dir's
`demo-credentials.json` (TOOLKEEPER_DATA_DIR) before the server started.
"""
import json
import os
from pathlib import Path

from toolkeeper.asgi import application as toolkeeper_application

AGENT = "conformance-bot"
_presented: list[tuple[bytes, bytes]] = []


def _credentials() -> list[tuple[bytes, bytes]]:
    if not _presented:
        data_dir = Path(os.environ["TOOLKEEPER_DATA_DIR"])
        key = json.loads((data_dir / "demo-credentials.json").read_text())["api_key"]
        _presented.extend([(b"authorization", f"Bearer {key}".encode()), (b"x-toolkeeper-agent", AGENT.encode())])
    return _presented


async def application(scope, receive, send):
    if scope["type"] == "http" and scope["path"] in ("/mcp", "/mcp/"):
        present = {name.lower() for name, _ in scope["headers"]}
        added = [(name, value) for name, value in _credentials() if name not in present]
        if added:
            scope = {**scope, "headers": [*scope["headers"], *added]}
    await toolkeeper_application(scope, receive, send)
