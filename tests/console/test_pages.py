"""Every console page renders for every member, and only for members."""
import pytest
from django.test import Client

from tests.console.conftest import console_url

pytestmark = pytest.mark.django_db

# Pages a member of each role may open with GET (the rest are POST-only or need a higher role).
READ_PAGES = ["dashboard", "activity", "tool_list", "tool_detail", "tool_plugins", "group_list", "binding_list",
              "apikey_list", "session_list", "session_detail", "call_list", "call_detail", "mcp_server_list",
              "mcp_server_detail", "redaction_rule_list", "search", "upstream_accounts", "oauth_provider_list",
              "confirmations"]
OPERATOR_PAGES = ["group_create", "group_edit", "group_delete", "binding_create", "tenant_settings",
                  "mcp_server_create", "mcp_server_edit", "mcp_server_delete", "http_tool_create",
                  "http_tool_edit", "http_tool_delete", "tool_result_steps", "call_cancel", "tool_disable",
                  "binding_delete", "audit_log", "audit_export_csv", "audit_export_jsonl", "tool_try"]
ADMIN_PAGES = ["apikey_create", "apikey_created", "apikey_revoke", "redaction_rule_create", "redaction_rule_edit",
               "redaction_rule_delete", "member_list", "member_remove", "invitation_created",
               "oauth_provider_create", "oauth_provider_edit", "oauth_provider_delete"]
POST_ONLY = ["mcp_server_sync", "mcp_server_test", "member_role", "invitation_revoke", "tool_group_add",
             "mcp_server_group_add", "client_disconnect", "upstream_account_connect", "upstream_account_disconnect",
             "upstream_account_list_tools", "provider_account_connect", "provider_account_disconnect",
             "tool_definition_accept", "confirmation_answer"]


def test_the_page_lists_cover_every_console_route(routes):
    names = {name.removeprefix("console:") for name, _ in routes}
    assert names == set(READ_PAGES + OPERATOR_PAGES + ADMIN_PAGES + POST_ONLY)


@pytest.mark.parametrize("role", ["admin", "operator", "reviewer", "viewer"])
def test_every_read_page_renders_for_every_role(world, routes, role):
    client = world.a.console(role)
    params = dict(routes)
    for name in READ_PAGES:
        response = client.get(console_url(f"console:{name}", params[f"console:{name}"], world.a))
        assert response.status_code == 200, (name, response.status_code)
        assert world.a.tenant.name in response.content.decode()
        assert world.b.tenant.name not in response.content.decode()  # the switcher lists only A


@pytest.mark.parametrize("role,expected", [("admin", 200), ("operator", 200), ("reviewer", 403), ("viewer", 403)])
def test_change_forms_need_an_operator(world, routes, role, expected):
    client = world.a.console(role)
    params = dict(routes)
    for name in OPERATOR_PAGES:
        response = client.get(console_url(f"console:{name}", params[f"console:{name}"], world.a))
        assert response.status_code == expected, (name, response.status_code)


@pytest.mark.parametrize("role,expected", [("admin", 200), ("operator", 403), ("reviewer", 403), ("viewer", 403)])
def test_key_pages_need_a_tenant_admin(world, routes, role, expected):
    client = world.a.console(role)
    params = dict(routes)
    for name in ADMIN_PAGES:
        response = client.get(console_url(f"console:{name}", params[f"console:{name}"], world.a))
        assert response.status_code == expected, (name, response.status_code)


def test_post_only_routes_refuse_get(world, routes):
    client = world.a.console("admin")
    params = dict(routes)
    for name in POST_ONLY:
        response = client.get(console_url(f"console:{name}", params[f"console:{name}"], world.a))
        assert response.status_code == 405, name


def test_anonymous_visitors_are_sent_to_the_login_page(world, routes):
    client = Client()
    for name, params in routes:
        url = console_url(name, params, world.a)
        response = client.get(url)
        assert response.status_code == 302, name
        assert response["Location"].startswith("/login/?next=")


def test_non_members_and_unknown_tenants_get_404(world, routes):
    outsider = world.b.console("admin")  # a member of B only
    for name, params in routes:
        assert outsider.get(console_url(name, params, world.a)).status_code == 404, name
        assert outsider.post(console_url(name, params, world.a)).status_code == 404, name
    assert world.a.console("admin").get("/t/no-such-tenant/").status_code == 404


def test_login_page_and_login_flow(world):
    client = Client()
    page = client.get("/login/")
    assert page.status_code == 200
    assert "Sign in" in page.content.decode()
    bad = client.post("/login/", {"username": "acme-admin", "password": "wrong"})
    assert bad.status_code == 200
    assert "correct username and password" in bad.content.decode()
    from tests.conftest import PASSWORD

    good = client.post("/login/", {"username": "acme-admin", "password": PASSWORD}, follow=True)
    assert good.redirect_chain[-1][0] == "/t/acme/"  # one tenant: straight to its dashboard
    assert "Dashboard" in good.content.decode()


def test_logout_is_a_post_and_ends_the_session(world):
    client = world.a.console("viewer")
    assert client.get("/t/acme/").status_code == 200
    page = client.get("/t/acme/").content.decode()
    assert 'action="/logout/"' in page
    client.post("/logout/")
    assert client.get("/t/acme/").status_code == 302


def test_tenant_switcher_lists_every_membership_and_keeps_the_section(world):
    from tenancy.services import membership_set

    user = world.a.users["operator"]
    membership_set(tenant=world.b.tenant, user=user, role="viewer")
    client = world.a.console("operator")
    page = client.get("/t/acme/tools/").content.decode()
    assert 'href="/t/globex/tools/"' in page
    assert 'href="/t/acme/tools/"' in page
    detail = client.get(f"/t/acme/tools/{world.a.tools['current_time'].pk}/").content.decode()
    assert 'href="/t/globex/"' in detail  # an object page switches to the other tenant's dashboard
    home = client.get("/", follow=True)
    assert home.status_code == 200 and "Your tenants" in home.content.decode()


def test_dashboard_counts(world):
    page = world.a.console("viewer").get("/t/acme/").content.decode()
    # the world has one session with two calls: reset_tools succeeded, an unknown tool failed
    assert 'data-status="succeeded">1<' in page
    assert 'data-status="failed">1<' in page
    assert "call_missing" in page and "call_time" in page


def test_call_list_filters_and_detail_shows_timeline_and_audit(world):
    client = world.a.console("viewer")
    failed = client.get("/t/acme/calls/?status=failed").content.decode()
    assert "call_missing" in failed and "call_time" not in failed
    by_tool = client.get("/t/acme/calls/?tool=reset_tools").content.decode()
    assert "call_time" in by_tool and "call_missing" not in by_tool
    bad = client.get("/t/acme/calls/?status=nonsense")  # said, and nothing listed rather than everything
    assert bad.status_code == 400 and "Select a valid choice" in bad.content.decode()
    assert "call_time" not in bad.content.decode() and "call_missing" not in bad.content.decode()

    call = world.a.calls[1]
    page = client.get(f"/t/acme/calls/{call.pk}/").content.decode()
    assert "ToolNotAvailable" in page  # the structured error
    assert "call.received" in page  # the audit event whose target is call:<uuid>
    assert page.count("<td>status</td>") >= 1  # the timeline of CallEvents
    from tools.catalog.selectors import call_events

    assert call_events(call).count() >= 1
    for event in call_events(call):
        assert f"<td>{event.seq}</td>" in page


def test_session_detail_shows_context_groups_and_calls(world):
    from tools.catalog.services import session_create

    session = session_create(tenant=world.a.tenant, agent="ops-bot", user="bob", context={"ticket": "T-42"})
    page = world.a.console("viewer").get(f"/t/acme/sessions/{session.pk}/").content.decode()
    assert "T-42" in page and "ops-bot" in page and "basic" in page
    own = world.a.console("viewer").get(f"/t/acme/sessions/{world.a.session.pk}/").content.decode()
    assert "call_time" in own and "math" in own  # reset_tools activated math
    listing = world.a.console("viewer").get("/t/acme/sessions/").content.decode()
    assert "ops-bot" in listing and "support-bot" in listing


def test_malformed_ids_are_404_not_500(world):
    client = world.a.console("admin")
    assert client.get("/t/acme/sessions/not-a-uuid/").status_code == 404
    assert client.get("/t/acme/calls/123/").status_code == 404
    assert client.get("/t/acme/tools/999999999/").status_code == 404


def test_readers_get_no_links_to_pages_they_cannot_open(world):
    page = world.a.console("viewer").get("/t/acme/tools/").content.decode()
    assert f"/t/acme/groups/{world.a.groups['math'].pk}/" not in page
    operator_page = world.a.console("operator").get("/t/acme/tools/").content.decode()
    assert f"/t/acme/groups/{world.a.groups['math'].pk}/" in operator_page
