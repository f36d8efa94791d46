"""In Chromium, the console's forms prevent the mistakes that used to pass: a queue whose quorum its
reviewers cannot reach, a binding whose value the tool's schema refuses; a four-eyes request tells the
session's own user up front that it is not theirs; and the agent's-eye view on the tools page lists
exactly what `GET /api/v1/sessions/{id}/tools` lists for the same agent.
"""
import re

import httpx
import pytest

from tests.browser import chromium_context, chromium_or_skip, log_in
from tests.live.conftest import toolkeeper_server  # noqa: F401 (the live server fixture, reused)

pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.django_db]

STEP_MS = 20_000


def test_the_forms_refuse_mistakes_and_the_agents_eye_view_matches_the_api(toolkeeper_server):  # noqa: F811
    chromium_or_skip()
    from playwright.sync_api import expect

    server = toolkeeper_server
    app = httpx.Client(base_url=server.url, headers=server.headers(), timeout=30)
    admin = httpx.Client(base_url=server.url, headers=server.headers(server.admin_api_key), timeout=30)
    try:
        # A four-eyes queue for the clock, and a call in a session whose user is the demo reviewer.
        queue = admin.post("/api/v1/queues", json={"name": "four-eyes", "four_eyes": True})
        assert queue.status_code == 201, queue.text
        rule = admin.post("/api/v1/rules", json={"behavior": "ask", "tool_pattern": "current_time",
                                                 "agents": ["support-bot"], "queue": "four-eyes"})
        assert rule.status_code == 201, rule.text
        own = app.post("/api/v1/sessions", json={"agent": "support-bot", "user": "reviewer"}).json()
        held = app.post(f"/api/v1/sessions/{own['id']}/calls", json={"name": "current_time", "input": {}}).json()
        assert held["calls"][0]["status"] == "awaiting_approval", held

        with chromium_context(server.url, step_ms=STEP_MS) as (context, csp):
            page = context.new_page()
            log_in(page, server, "/t/demo/inbox/", who="reviewer")
            row = page.locator("#requests tr[data-href]", has_text="current_time")
            expect(row).to_contain_text("Four-eyes: you cannot decide a call made in your own session")
            expect(row.locator("form.quick-approve")).to_have_count(0)
            row.locator("a").first.click()
            expect(page.locator("#cannot-decide")).to_contain_text("Four-eyes")
            expect(page.locator("#decide")).to_have_count(0)
            csp.assert_clean()

        with chromium_context(server.url, step_ms=STEP_MS) as (context, csp):
            page = context.new_page()
            # A queue of three approvals with four-eyes, in a tenant with two members who review.
            log_in(page, server, "/t/demo/queues/new/")
            page.fill("#id_name", "all-hands")
            page.fill("#id_required_approvals", "3")
            page.check("#id_four_eyes")
            page.get_by_role("button", name="Create").click()
            expect(page.locator("#error-summary")).to_contain_text(
                "3 approvals with four-eyes (which keeps out the session's own user) need 4 members who review")
            expect(page.locator("#id_required_approvals")).to_have_attribute("aria-invalid", "true")
            assert "all-hands" not in [q["name"] for q in admin.get("/api/v1/queues").json()["results"]]

            # A binding whose value the tool's schema refuses: the argument is picked, the value refused.
            page.goto(f"{server.url}/t/demo/bindings/new/")
            page.select_option("#choose-tool-select", label="current_time")
            page.get_by_role("button", name="Show its arguments").click()
            expect(page.locator("#schema-preview")).to_contain_text("timezone")
            page.select_option("#id_name", "timezone")
            page.fill("#id_value", "42")
            page.get_by_role("button", name="Save binding").click()
            expect(page.locator("#error-summary")).to_contain_text("current_time refuses it: timezone: 42 is not of")
            bindings = admin.get("/api/v1/bindings").json()["results"]
            assert not [b for b in bindings if b["tool"] == "current_time" and b["value"] == 42], bindings

            # The agent's-eye view lists what the API lists to a new session of the same agent.
            page.goto(f"{server.url}/t/demo/tools/")
            page.fill("#id_agent", "support-bot")
            page.get_by_role("button", name="Show").click()
            shown = page.locator("#seen-tools tr[data-seen-tool]")
            expect(shown.first).to_be_visible()
            seen = [shown.nth(i).get_attribute("data-seen-tool") for i in range(shown.count())]
            fresh = app.post("/api/v1/sessions", json={"agent": "support-bot"}).json()
            listed = app.get(f"/api/v1/sessions/{fresh['id']}/tools").json()["tools"]
            names = [tool.get("name") or tool.get("function", {}).get("name") for tool in listed]
            assert seen == names, (seen, names)
            expect(page.locator('#seen-tools tr[data-seen-tool="current_time"]')).to_contain_text(
                re.compile(r"ask\s+rule #\d+"))
            csp.assert_clean()
    finally:
        app.close()
        admin.close()
