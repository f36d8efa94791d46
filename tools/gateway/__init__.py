"""The governed MCP endpoint `/mcp/` that MCP clients reach: the protocol side (protocol), its HTTP entry
(entry) and what the console shows about the clients using it (pages)."""
