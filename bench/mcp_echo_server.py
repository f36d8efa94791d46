"""A small MCP server on streamable HTTP for bench/mcp_proxy.py: one `echo` tool.

    python bench/mcp_echo_server.py PORT
"""
import sys

import uvicorn
from mcp.server.mcpserver import MCPServer

server = MCPServer("bench-echo")


@server.tool()
def echo(text: str) -> str:
    """Return the text."""
    return text


def main() -> None:
    port = int(sys.argv[1])
    app = server.streamable_http_app(host="127.0.0.1")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
