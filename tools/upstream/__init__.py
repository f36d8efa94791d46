"""Tenants' MCP servers, reached as a client: the pooled sessions (client), their tools as a tool source
(source), the servers' checks, writes and sync (servers), and their console pages (pages)."""
