"""The catalog and what a session sees: tools, groups, bindings, sessions, the per-tenant snapshot, input
schemas, meta tools on the surface, and the registries other apps plug tool sources and filters into."""
