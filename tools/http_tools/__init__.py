"""HTTP tools: a tenant's tools that call an HTTP endpoint. Their source and checks (services), their API
(api) and their console pages (pages)."""
