"""Toolkeeper as the authorization server of its MCP endpoint (docs/identity.md, "OAuth for MCP clients")."""
