"""Single sign-on end to end (docs/identity.md, "Single sign-on"): Chromium, driven by Playwright, signs people in
to a live Toolkeeper through a real OpenID provider (the npm `oidc-provider`, tests/identity/provider.mjs) with the
authorization code flow and PKCE. The first sign-in makes the account and the role claim its membership; a wrong
domain is refused; a person nobody invited gets a page that says so, and joins by an invitation; signing out ends
the provider's session too; a person disabled at the provider cannot sign in again."""
import contextlib
import json
import re
import sqlite3
import urllib.error
import urllib.request

import pytest

from tests.browser import chromium_context, chromium_or_skip, log_in
from tests.identity.provider import deployment_with

pytestmark = [pytest.mark.live, pytest.mark.xdist_group("sso-browser")]  # one provider and server for the module

STEP_MS = 20_000
ACCOUNTS = {
    "carol": {"email": "carol@example.com", "groups": ["toolkeeper:demo:reviewer", "unrelated-group"]},
    "dave": {"email": "dave@elsewhere.org", "groups": ["toolkeeper:demo:admin"]},
    "erin": {"email": "erin@example.com", "groups": []},
    "frank": {"email": "frank@example.com", "groups": ["toolkeeper:demo:operator"]},
}


@pytest.fixture(scope="module")
def sso():
    chromium_or_skip()
    with deployment_with(ACCOUNTS, TOOLKEEPER_OIDC_ROLES_CLAIM="groups",
                         TOOLKEEPER_OIDC_ALLOWED_DOMAINS="example.com") as both:
        yield both


@contextlib.contextmanager
def browser(server):
    with chromium_context(server.url, step_ms=STEP_MS) as (context, csp):
        yield context.new_page(), csp


def rows(server, sql: str, *args) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(server.data_dir / "common.sqlite3")) as db:
        return db.execute(sql, args).fetchall()


def membership(server, username: str) -> list[tuple]:
    return rows(server, "SELECT t.slug, m.role, m.from_claim FROM tenancy_membership m JOIN auth_user u ON "
                        "u.id = m.user_id JOIN tenancy_tenant t ON t.id = m.tenant_id WHERE u.username = ?", username)


def at_provider_login(page, provider, login: str) -> None:
    """Sign in on the provider's own form (it takes any password)."""
    page.wait_for_url(f"{provider.issuer}/interaction/**")
    page.fill("input[name=login]", login)
    page.fill("input[name=password]", "any password")
    page.click("button[type=submit]")


def sso_from(page, server, provider, path: str, login: str) -> None:
    """Open `path` signed out, and sign in with single sign-on from the login page it leads to."""
    page.goto(f"{server.url}{path}")
    page.wait_for_url(re.compile(r"/login/\?next="))
    page.click("#sso")
    at_provider_login(page, provider, login)


def test_a_first_sign_in_makes_the_account_with_the_role_its_claim_names(sso):
    provider, server = sso
    with browser(server) as (page, csp):
        sso_from(page, server, provider, "/t/demo/inbox/", "carol")
        page.wait_for_url(f"{server.url}/t/demo/inbox/")  # back where she was going, signed in
        assert page.locator("header.top").inner_text().count("carol@example.com") == 1
        assert membership(server, "carol@example.com") == [("demo", "reviewer", 1)]
        assert rows(server, "SELECT subject, email FROM tenancy_identity") == [("carol", "carol@example.com")]
        assert rows(server, "SELECT verb, data FROM audit_event WHERE verb = 'person.signed_in'") == [
            ("person.signed_in", f'{{"method": "oidc", "issuer": "{provider.issuer}", "account_created": true}}')]

        # signing out ends the session here and at the provider, which asks, then comes back to the login page
        page.click("header.top button:has-text('Log out')")
        page.wait_for_url(f"{provider.issuer}/session/end**")
        page.click("button[name=logout]")
        page.wait_for_url(f"{server.url}/login/")
        page.goto(f"{server.url}/t/demo/")
        page.wait_for_url(f"{server.url}/login/?next=/t/demo/")
        page.click("#sso")
        page.wait_for_url(f"{provider.issuer}/interaction/**")  # the provider asks again: its session ended too
        csp.assert_clean()


def test_a_wrong_domain_and_a_forged_return_are_refused(sso):
    provider, server = sso
    with browser(server) as (page, _):
        sso_from(page, server, provider, "/t/demo/", "dave")
        page.wait_for_url(f"{server.url}/login/sso/callback/**")
        assert "Accounts at elsewhere.org may not sign in" in page.inner_text("#refusal")
        assert rows(server, "SELECT id FROM auth_user WHERE email = 'dave@elsewhere.org'") == []
        page.goto(f"{server.url}/t/demo/")
        page.wait_for_url(f"{server.url}/login/?next=/t/demo/")  # not signed in

        # a return that this browser did not start (a login forced on someone) signs nobody in
        response = page.goto(f"{server.url}/login/sso/callback/?code=stolen&state=forged")
        assert response.status == 400
        assert "did not complete" in page.inner_text("#refusal")


def test_a_person_nobody_invited_is_told_and_joins_by_an_invitation(sso):
    provider, server = sso
    with browser(server) as (page, _):
        sso_from(page, server, provider, "/t/demo/", "erin")
        page.wait_for_url(f"{server.url}/login/sso/callback/**")
        assert "erin@example.com" in page.inner_text("#not-invited")
        assert rows(server, "SELECT username FROM auth_user WHERE email = 'erin@example.com'") == [
            ("erin@example.com",)], "the account is made; it has no tenant yet"
        page.goto(f"{server.url}/t/demo/")
        page.wait_for_url(f"{server.url}/login/?next=/t/demo/")  # and no session

        admins = page.context.browser.new_context()  # another person's browser: the demo admin's
        admins.set_default_timeout(STEP_MS)
        admin = admins.new_page()
        log_in(admin, server, "/t/demo/members/", who="operator")
        admin.fill("input[name=email]", "erin@example.com")
        admin.select_option("select[name=role]", "viewer")
        admin.click("form:has(input[name=email]) button[type=submit]")
        link = admin.inner_text("#invitation-link").strip()
        admins.close()

        page.goto(link)
        page.click("#sso")  # the provider remembers her: no form this time
        page.wait_for_url(link)
        page.click("#accept")
        page.wait_for_url(f"{server.url}/t/demo/")
        assert membership(server, "erin@example.com") == [("demo", "viewer", 0)]


def test_a_person_disabled_at_the_provider_cannot_sign_in_again(sso):
    provider, server = sso
    with browser(server) as (page, _):
        sso_from(page, server, provider, "/t/demo/", "frank")
        page.wait_for_url(f"{server.url}/t/demo/")
        assert membership(server, "frank@example.com") == [("demo", "operator", 1)]
        page.click("header.top button:has-text('Log out')")
        page.click("button[name=logout]")
        page.wait_for_url(f"{server.url}/login/")

        provider.account_set("frank", disabled=True)
        sso_from(page, server, provider, "/t/demo/", "frank")
        # the provider refuses him on its own pages: Toolkeeper never hears of him
        page.wait_for_url(f"{provider.issuer}/auth/**")
        assert "error" in page.inner_text("body")
        signed_in = "SELECT count(*) FROM audit_event WHERE verb = 'person.signed_in' AND target = ?"
        assert rows(server, signed_in, "user:frank@example.com") == [(1,)]
        page.goto(f"{server.url}/t/demo/")
        page.wait_for_url(f"{server.url}/login/?next=/t/demo/")


def grant_token(server, username: str, agent: str) -> str:
    """An MCP client's access token for the person (as the consent page and token endpoint make them:
    tests/identity/test_mcp_oauth.py drives those)."""
    code = (
        "from django.contrib.auth import get_user_model; from tenancy.models import Tenant; "
        "from tenancy.oauth import services as s; from tenancy.selectors import mcp_resource; "
        f"c = s.client_register(metadata={{'client_id': 'cli-{agent}', 'client_name': 'IDE', "
        "'redirect_uris': ['http://127.0.0.1:9/cb']}, client_secret=None); "
        "consent = s.Consent(client_id=c.client_id, redirect_uri='http://127.0.0.1:9/cb', "
        "redirect_uri_provided_explicitly=True, code_challenge='c' * 43, scopes=('agent',), state=None, "
        "resource=mcp_resource()); "
        f"user = get_user_model().objects.get(username='{username}'); "
        f"code = s.code_issue(consent=consent, user=user, tenant=Tenant.objects.get(slug='demo'), agent='{agent}', "
        "scopes=['agent']); "
        "print(s.code_exchange(code=s.code_load(client_id=c.client_id, code=code)).access_token)")
    return server.manage("shell", "-c", code).strip().splitlines()[-1]


def mcp_status(server, token: str) -> int:
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", ' \
           b'"capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}'
    request = urllib.request.Request(f"{server.url}/mcp/", data=body, method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as refused:
        return refused.code


def test_a_person_the_provider_signs_out_loses_sessions_clients_and_streams_within_seconds(sso):
    provider, server = sso
    provider.account_set("grace", email="grace@example.com", groups=["toolkeeper:demo:operator"])
    with browser(server) as (page, _):
        with page.expect_websocket() as opened:
            sso_from(page, server, provider, "/t/demo/calls/", "grace")
            page.wait_for_url(f"{server.url}/t/demo/calls/")
        stream = opened.value
        token = grant_token(server, "grace@example.com", "grace-ide")
        assert mcp_status(server, token) == 200

        # disabled at the provider, which tells Toolkeeper at once (back-channel logout)
        provider.account_set("grace", disabled=True)
        assert provider.signed_out("grace") == ["ok"]
        stream.wait_for_event("close", timeout=10_000)  # the console's live stream closes within seconds
        assert mcp_status(server, token) == 401  # the client she connected is cut off
        page.goto(f"{server.url}/t/demo/calls/")
        page.wait_for_url(f"{server.url}/login/?next=/t/demo/calls/")  # and her console session is gone
    signed_out = rows(server, "SELECT data FROM audit_event WHERE verb = 'person.signed_out'")
    assert signed_out and '"by": "provider"' in signed_out[0][0]
    assert rows(server, "SELECT count(*) FROM tenancy_oauthgrant WHERE revoked_at IS NULL AND user_id = "
                        "(SELECT id FROM auth_user WHERE username = 'grace@example.com')") == [(0,)]


def test_a_forged_logout_token_signs_nobody_out(sso):
    provider, server = sso
    request = urllib.request.Request(f"{server.url}/login/sso/logout/", method="POST",
                                     data=b"logout_token=eyJhbGciOiJub25lIn0.eyJzdWIiOiJjYXJvbCJ9.",
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 400
    assert "does not verify" in json.loads(refused.value.read())["error_description"]
