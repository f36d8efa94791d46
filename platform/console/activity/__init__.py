"""The activity page (docs/observability.md, "The activity page"): `selectors` reads a span of a tenant's calls
and approval requests in a fixed number of queries, `charts` draws them as SVG on the server, `pages` is the view."""
