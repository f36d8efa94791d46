"""Redaction rules a tenant sets for what tools return: the rules and their cache (rules), their API (api)
and their console pages (pages)."""
