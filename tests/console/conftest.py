import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from tools.models import McpServer, RedactionRule


def mcp_server_of(tenant_world) -> McpServer:
    """The tenant's MCP server for page tests (disabled: nothing here reaches out to it)."""
    server, _ = McpServer.objects.get_or_create(tenant=tenant_world.tenant, name="pages", defaults={
        "transport": "streamable_http", "url": "https://93.184.215.14/mcp", "enabled": False})
    return server


def redaction_rule_of(tenant_world) -> RedactionRule:
    rule, _ = RedactionRule.objects.get_or_create(tenant=tenant_world.tenant, name="pages",
                                                  defaults={"pattern": r"page-\d+"})
    return rule


def http_tool_of(tenant_world):
    """The tenant's HTTP tool for page tests (its endpoint; nothing here calls it)."""
    from tools.http_tools.services import http_tool_create
    from tools.models import HttpEndpoint

    endpoint = HttpEndpoint.objects.for_tenant(tenant_world.tenant).filter(tool__name="pages_http").first()
    if endpoint is None:
        tool = http_tool_create(tenant=tenant_world.tenant, name="pages_http", url="https://93.184.215.14/x")
        endpoint = HttpEndpoint.objects.for_tenant(tenant_world.tenant).get(tool=tool)
    return endpoint


def oauth_provider_of(tenant_world):
    """The tenant's OAuth provider of HTTP tools for page tests (nothing here reaches out to it)."""
    from tools.models import OAuthProvider

    provider, _ = OAuthProvider.objects.get_or_create(tenant=tenant_world.tenant, name="pages", defaults={
        "api_url": "https://93.184.215.14/api", "authorization_endpoint": "https://93.184.215.14/authorize",
        "token_endpoint": "https://93.184.215.14/token",
        "client": {"client_id": "pages"}})
    return provider


def invitation_of(tenant_world):
    """An open invitation of the tenant for page tests."""
    from tenancy.models import Invitation
    from tenancy.people.services import invitation_create

    invitation = Invitation.objects.for_tenant(tenant_world.tenant).filter(email="pages@example.com").first()
    return invitation or invitation_create(tenant=tenant_world.tenant, email="pages@example.com",
                                           role="viewer").invitation


def grant_of(tenant_world):
    """An MCP client a member of the tenant connected with OAuth, for page tests."""
    from tenancy.models import OAuthGrant
    from tests.identity.grants import connected_client

    grant = OAuthGrant.objects.for_tenant(tenant_world.tenant).filter(api_key__agent="pages-ide").first()
    return grant or connected_client(tenant=tenant_world.tenant, user=tenant_world.users["reviewer"],
                                     agent="pages-ide", client_id=f"pages-{tenant_world.tenant.slug}",
                                     name="Pages IDE")


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
        "http_tool_id": http_tool_of(tenant_world).pk,
        "redaction_rule_id": redaction_rule_of(tenant_world).pk,
        "oauth_provider_id": oauth_provider_of(tenant_world).pk,
        "member_id": tenant_world.tenant.memberships.get(user=tenant_world.users["reviewer"]).pk,
        "invitation_id": invitation_of(tenant_world).pk,
        "grant_id": grant_of(tenant_world).pk,
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


def page_text(response) -> str:
    """A page's text, streamed or not (the audit exports stream)."""
    return b"".join(response).decode("utf-8", "replace")


def console_url(name: str, params: list[str], tenant_world, ids=None) -> str:
    ids = ids if ids is not None else object_ids(tenant_world)
    kwargs = {p: (tenant_world.tenant.slug if p == "tenant" else ids[p]) for p in params}
    return reverse(name, kwargs=kwargs)


@pytest.fixture
def routes():
    return console_routes()
