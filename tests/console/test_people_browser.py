"""In Chromium, the people of the demo tenant: a four-eyes queue with a quorum of 2 is built and worked in the
console alone, by its seeded reviewers; an admin invites someone, who accepts in a second browser as a new
user, sets a time zone on their profile and appears on the members page; the new pages pass axe-core."""
import httpx
import pytest

from tests.browser import CspWatch, chromium_context, chromium_or_skip, log_in
from tests.console.test_a11y_browser import _axe_or_skip, _violations
from tests.live.conftest import toolkeeper_server  # noqa: F401 (the live server fixture, reused)

pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.django_db]

STEP_MS = 20_000
NEW_PASSWORD = "a newcomer's long passphrase"


def _approve_in_the_inbox(context, server, who: str, tool: str, said: str) -> None:
    from playwright.sync_api import expect

    page = context.new_page()
    log_in(page, server, "/t/demo/inbox/", who=who)
    page.locator("#requests tr[data-href]", has_text=tool).locator("a").first.click()
    page.wait_for_url("**/t/demo/inbox/*/")
    page.locator("#decide-approve").click()
    page.wait_for_url("**/t/demo/inbox/")
    expect(page.locator(".messages")).to_contain_text(said)
    page.close()


def test_a_quorum_queue_and_an_invitation_are_worked_in_the_console(toolkeeper_server):  # noqa: F811
    chromium_or_skip()
    axe = _axe_or_skip()
    from playwright.sync_api import expect

    server = toolkeeper_server
    app = httpx.Client(base_url=server.url, headers=server.headers(), timeout=30)
    try:
        # The queue and its rule, in the console, as the demo admin.
        with chromium_context(server.url, step_ms=STEP_MS) as (context, csp):
            page = context.new_page()
            log_in(page, server, "/t/demo/queues/new/")
            page.fill("#id_name", "two-keys")
            page.fill("#id_required_approvals", "2")
            page.check("#id_four_eyes")
            page.get_by_role("button", name="Create").click()
            page.wait_for_url("**/t/demo/queues/")
            expect(page.locator("main")).to_contain_text("two-keys")
            page.goto(f"{server.url}/t/demo/rules/new/")
            page.select_option("#id_behavior", "ask")
            page.fill("#id_tool_pattern", "current_time")
            page.fill("#id_agents", "quorum-bot")
            page.select_option("#id_queue", label="two-keys")
            page.get_by_role("button", name="Create").click()
            page.wait_for_url("**/t/demo/rules/")
            csp.assert_clean()

        session = app.post("/api/v1/sessions", json={"agent": "quorum-bot", "user": "operator"}).json()
        held = app.post(f"/api/v1/sessions/{session['id']}/calls", json={"name": "current_time", "input": {}}).json()
        call_id = held["calls"][0]["id"]
        assert held["calls"][0]["status"] == "awaiting_approval", held

        # Two reviewers approve; the session's own user (operator) could not, and one vote is not enough.
        with chromium_context(server.url, step_ms=STEP_MS) as (context, csp):
            _approve_in_the_inbox(context, server, "reviewer", "current_time", "more approvals are needed")
            assert app.get(f"/api/v1/calls/{call_id}").json()["status"] == "awaiting_approval"
        with chromium_context(server.url, step_ms=STEP_MS) as (context, csp):
            _approve_in_the_inbox(context, server, "reviewer2", "current_time", "approved")
            csp.assert_clean()
        final = app.get(f"/api/v1/calls/{call_id}", params={"wait": 20}).json()
        assert final["status"] == "succeeded", final

        # An invitation, accepted by a new person in a second browser.
        with chromium_context(server.url, step_ms=STEP_MS) as (admin_context, admin_csp):
            newcomer_context = admin_context.browser.new_context()  # no cookies of the admin's
            newcomer_context.set_default_timeout(STEP_MS)
            newcomer_csp = CspWatch(newcomer_context, server.url)
            admin = admin_context.new_page()
            log_in(admin, server, "/t/demo/members/")
            assert not _violations(admin, axe)
            expect(admin.locator("#invite")).to_be_visible()
            admin.fill("#id_email", "newcomer@example.com")
            admin.select_option("#id_role", "reviewer")
            admin.get_by_role("button", name="Invite").click()
            admin.wait_for_url("**/t/demo/members/invitations/*/")
            expect(admin.locator("main")).to_contain_text("No mail server is configured")
            link = admin.locator("#invitation-link").inner_text().strip()
            assert link.startswith(server.url + "/account/invitations/"), link
            assert not _violations(admin, axe)

            newcomer = newcomer_context.new_page()
            newcomer.goto(link)
            expect(newcomer.locator("h1")).to_have_text("Join Demo")
            assert not _violations(newcomer, axe)
            newcomer.fill("#id_username", "newcomer")
            newcomer.fill("#id_password", "short")
            newcomer.get_by_role("button", name="Create the account and join").click()
            expect(newcomer.locator("#error-summary")).to_contain_text("This password is too short")
            expect(newcomer.locator("#id_username")).to_have_value("newcomer")  # what was typed stays
            newcomer.fill("#id_password", NEW_PASSWORD)
            newcomer.get_by_role("button", name="Create the account and join").click()
            newcomer.wait_for_url("**/t/demo/")
            expect(newcomer.locator(".messages")).to_contain_text("you joined as reviewer")

            newcomer.goto(f"{server.url}/account/profile/")
            assert not _violations(newcomer, axe)
            newcomer.fill("#id_name", "New Comer")
            newcomer.select_option("#id_time_zone", "Asia/Tokyo")
            newcomer.get_by_role("button", name="Save").click()
            expect(newcomer.locator(".messages")).to_contain_text("Profile saved")
            expect(newcomer.locator("#id_email")).to_have_value("newcomer@example.com")

            # The link worked once.
            newcomer.goto(link)
            expect(newcomer.locator("main")).to_contain_text("not valid")

            admin.goto(f"{server.url}/t/demo/members/")
            row = admin.locator("#members tr[data-member=newcomer]")
            expect(row).to_contain_text("New Comer")
            expect(row.locator("select")).to_have_value("reviewer")
            expect(admin.locator("#invitations")).to_contain_text("No open invitations")
            admin_csp.assert_clean()
            newcomer_csp.assert_clean()
    finally:
        app.close()

