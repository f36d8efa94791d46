import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from tools.models import McpServer


def mcp_server_of(tenant_world) -> McpServer:
    """The tenant's MCP server for page tests (disabled: nothing here reaches out to it)."""
    server, _ = McpServer.objects.get_or_create(tenant=tenant_world.tenant, name="pages", defaults={
        "transport": "streamable_http", "url": "https://93.184.215.14/mcp", "enabled": False})
    return server


def object_ids(tenant_world) -> dict:
    """One id per console URL parameter, from a tenant of the test world."""
    return {
        "tool_id": tenant_world.tools["current_time"].pk,
        "group_id": tenant_world.groups["math"].pk,
        "binding_id": tenant_world.binding.pk,
        "key_id": tenant_world.key_objects["agent"].pk,
        "session_id": str(tenant_world.session.pk),
        "call_id": str(tenant_world.calls[0].pk),
        "server_id": mcp_server_of(tenant_world).pk,
    }


def console_routes() -> list[tuple[str, list[str]]]:
    """(url name, parameter names) of every console route that lives under /t/<tenant>/."""
    routes = []

    def walk(patterns, prefix_params):
        for entry in patterns:
            params = prefix_params + list(entry.pattern.converters)
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, params)
            elif isinstance(entry, URLPattern) and "tenant" in params:
                routes.append((f"console:{entry.name}", params))

    for entry in get_resolver().url_patterns:
        if isinstance(entry, URLResolver) and entry.namespace == "console":
            walk(entry.url_patterns, [])
    assert routes, "no console routes found"
    return routes


def console_url(name: str, params: list[str], tenant_world, ids=None) -> str:
    ids = ids if ids is not None else object_ids(tenant_world)
    kwargs = {p: (tenant_world.tenant.slug if p == "tenant" else ids[p]) for p in params}
    return reverse(name, kwargs=kwargs)


@pytest.fixture
def routes():
    return console_routes()
