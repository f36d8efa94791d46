"""In Chromium, the demo tenant's settings, audit log, search and times as an operator meets them: the settings
page changes the default decision and says so; the audit log filters, links an entry to what it names and
exports the filtered view; the header's box finds a call by its id; instants name their zone and show the
exact instant on hover; axe-core passes on each page."""
import csv
import io
import re

import httpx
import pytest

from tests.browser import chromium_context, chromium_or_skip, log_in
from tests.console.test_a11y_browser import _axe_or_skip, _violations
from tests.live.conftest import toolkeeper_server  # noqa: F401 (the live server fixture, reused)

pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.django_db]

STEP_MS = 20_000


def test_settings_audit_search_and_times_in_the_console(toolkeeper_server):  # noqa: F811
    chromium_or_skip()
    axe = _axe_or_skip()
    from playwright.sync_api import expect

    server = toolkeeper_server
    app = httpx.Client(base_url=server.url, headers=server.headers(), timeout=30)
    session = app.post("/api/v1/sessions", json={"agent": "support-bot"}).json()
    [call] = app.post(f"/api/v1/sessions/{session['id']}/calls",
                      json={"calls": [{"id": "find-me-7", "name": "current_time", "input": {}}]}).json()["calls"]
    with chromium_context(server.url, step_ms=STEP_MS) as (context, csp):
        page = context.new_page()
        log_in(page, server, "/t/demo/settings/")
        page.select_option("#id_default_behavior", "deny")
        page.get_by_role("button", name="Save decisions").click()
        expect(page.locator(".messages")).to_be_visible()
        expect(page.locator("#id_default_behavior")).to_have_value("deny")
        assert not _violations(page, axe)

        # The audit log: the change just made, linked, filtered and exported.
        page.get_by_role("link", name="Audit log").click()
        page.fill("#id_action", "tenant.")
        page.get_by_role("button", name="Filter").click()
        entries = page.locator("#audit-entries tbody tr")
        expect(entries.first).to_contain_text("tenant.governance_set")
        expect(entries.first).to_contain_text('"default_behavior": "deny"')
        when = entries.first.locator("time")
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", when.inner_text())  # with its zone
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC \(UTC\+0000\)",
                            when.get_attribute("title"))  # the exact instant on hover
        assert not _violations(page, axe)
        export = page.locator("#export-csv").get_attribute("href")
        assert export.endswith("?action=tenant.")
        rows = list(csv.DictReader(io.StringIO(page.request.get(server.url + export).text())))
        assert rows and all(row["verb"].startswith("tenant.") for row in rows)

        # The header's box: straight to the call an app's id names.
        page.fill("header input[name=q]", "find-me-7")
        page.press("header input[name=q]", "Enter")
        page.wait_for_url(f"**/t/demo/calls/{call['id']}/")
        expect(page.locator("h1")).to_contain_text("find-me-7")
        created = page.locator("dl.facts dt:text-is('Created') + dd time")
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", created.inner_text())
        page.goto(f"{server.url}/t/demo/search/?q=_")  # several tools hold one
        expect(page.locator("#found")).to_contain_text("current_time")
        assert not _violations(page, axe)
        csp.assert_clean()
