"""The console's pages of HTTP tools' OAuth providers (tools.accounts.provider_pages): declared form tests
(tests/view_cases.py), a provider chosen on an HTTP tool's form, and a stored client never shown."""
import pytest

from tests.view_cases import CreateCases, EditCases, RefusingDeleteCases
from tools.accounts.providers import provider_create
from tools.http_tools.services import http_tool_create
from tools.models import HttpEndpoint, OAuthProvider

pytestmark = pytest.mark.django_db

AS = "https://93.184.215.14"
SECRET = "pr0vider-client-5ecret"  # noqa: S105


def _provider(tw, name="crm", **fields) -> OAuthProvider:
    values = {"accounts": "person", "api_url": AS, "authorization_endpoint": AS + "/authorize",
              "token_endpoint": AS + "/token",
              "client": {"client_id": "toolkeeper", "client_secret": SECRET}, **fields}
    return provider_create(tenant=tw.tenant, name=name, **values)


def _form(**fields) -> dict:
    return {"name": "crm", "accounts": "person", "api_url": AS, "authorization_endpoint": AS + "/authorize",
            "token_endpoint": AS + "/token", "scopes": "items:read", "client_id": "toolkeeper", **fields}


class TestOAuthProviderCreate(CreateCases):
    url_name = "console:oauth_provider_create"
    model = OAuthProvider
    allowed = ("admin",)
    refused = ("operator", "reviewer", "viewer")
    audit_verb = "oauth_provider.created"
    success_url = "console:oauth_provider_list"

    def valid(self, world):
        return _form(client_secret=SECRET), {"name": "crm", "accounts": "person", "scopes": "items:read"}

    def invalid(self, world):
        return [
            (_form(token_endpoint="http://127.0.0.1/token"), "loopback"),
            (_form(accounts="service"), "leave it empty"),
            (_form(accounts="service", authorization_endpoint=""), "client_secret"),
            (_form(client_id=""), "the client registered for Toolkeeper"),
            (_form(client_id="", client_secret=SECRET), "a client secret needs its client id"),
            (_form(api_url="http://93.184.215.14/api"), "not an HTTPS address"),
        ]


class TestOAuthProviderEdit(EditCases):
    url_name = "console:oauth_provider_edit"
    param = "oauth_provider_id"
    model = OAuthProvider
    allowed = ("admin",)
    refused = ("operator", "reviewer", "viewer")
    audit_verb = "oauth_provider.updated"
    success_url = "console:oauth_provider_list"

    def target(self, tw):
        return _provider(tw)

    def valid(self, world):
        # the client fields left empty: the stored client stays
        return _form(client_id="", scopes="items:write"), {"scopes": "items:write"}

    def invalid(self, world):
        return [(_form(scopes='a "b"'), "scope names")]


class TestOAuthProviderDelete(RefusingDeleteCases):
    url_name = "console:oauth_provider_delete"
    param = "oauth_provider_id"
    model = OAuthProvider
    allowed = ("admin",)
    refused = ("operator", "reviewer", "viewer")
    audit_verb = "oauth_provider.deleted"
    success_url = "console:oauth_provider_list"
    refused_message = "HTTP tools call with it (pages_crm)"

    def target(self, tw):
        return _provider(tw, name="spare")

    def refused_target(self, tw):
        provider = _provider(tw, name="used")
        http_tool_create(tenant=tw.tenant, name="pages_crm", url=AS + "/x", oauth_provider=provider.name)
        return provider

    def done(self, tw, obj) -> bool:
        return not OAuthProvider.objects.for_tenant(tw.tenant).filter(pk=obj.pk).exists()


def test_pages_never_show_the_stored_client_secret(world):
    provider = _provider(world.a)
    console = world.a.console("admin")
    for url in (f"/t/{world.a.tenant.slug}/oauth-providers/", f"/t/{world.a.tenant.slug}/oauth-providers/"
                f"{provider.pk}/", f"/t/{world.a.tenant.slug}/oauth-providers/{provider.pk}/delete/"):
        page = console.get(url)
        assert page.status_code == 200 and SECRET not in page.content.decode()
    refused = console.post(f"/t/{world.a.tenant.slug}/oauth-providers/{provider.pk}/",
                           _form(client_secret="typed-n0t-echoed", token_endpoint="http://127.0.0.1/t"))
    assert refused.status_code != 302 and "typed-n0t-echoed" not in refused.content.decode()


def test_an_http_tools_form_chooses_a_provider_of_the_tenant(world):
    _provider(world.a)
    _provider(world.b, name="globex-only")
    console = world.a.console("operator")
    page = console.get(f"/t/{world.a.tenant.slug}/http-tools/new/").content.decode()
    assert "OAuth provider crm" in page and "globex-only" not in page
    created = console.post(f"/t/{world.a.tenant.slug}/http-tools/new/", {
        "name": "crm_items", "input_schema": '{"type": "object", "properties": {}}', "method": "GET",
        "url": AS + "/items", "timeout_s": "30", "enabled": "on", "oauth_provider": "crm"})
    assert created.status_code == 302, created.content.decode()[:2000]
    endpoint = HttpEndpoint.objects.for_tenant(world.a.tenant).get(tool__name="crm_items")
    assert endpoint.oauth_provider.name == "crm"
    edit = console.get(f"/t/{world.a.tenant.slug}/http-tools/{endpoint.pk}/").content.decode()
    assert '<option value="crm" selected>' in edit
    refused = console.post(f"/t/{world.a.tenant.slug}/http-tools/{endpoint.pk}/", {
        "name": "crm_items", "input_schema": '{"type": "object", "properties": {}}', "method": "GET",
        "url": AS + "/items", "timeout_s": "30", "oauth_provider": "crm", "headers": "Authorization: Bearer x"})
    assert refused.status_code != 302 and "leave it out of the headers" in refused.content.decode()
