"""Settings of the distributed test stack: the product's settings plus the test-only tools of
`tests.distributed.stack_tools` (registered in daphne, the worker and manage.py alike), and the test MCP
server (tests.mcp.servers): allow-listed for stdio, and 127.0.0.1 open to outbound requests for its HTTP
form (both for this stack only)."""
import sys
from pathlib import Path

from toolkeeper.settings import *  # noqa: F403
from toolkeeper.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.distributed.stack_tools"]
TOOLKEEPER_TOOL_PROCESSES = 1  # per worker process
TOOLKEEPER_MCP_STDIO_SERVERS = {"testkit": {
    "command": sys.executable, "args": ["-m", "tests.mcp.servers", "stdio"],
    "env": {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}, "tenant_env": ["MCP_TEST_STATE", "MCP_TEST_OTLP"],
}}
TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1"]
