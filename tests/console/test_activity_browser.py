"""In Chromium: the activity page follows the tenant's calls. A member watches it while an app makes a call;
once the call settles, the calls chart counts it and the latency chart has measured it, without a reload
(docs/observability.md, "The activity page").

The server is a real daphne process (the live tests' `toolkeeper_server`: embedded mode, SQLite, the
in-process channel layer, the local executor, the demo tenant); the app speaks the public API with httpx.
Every wait is bounded; nothing is timed.
"""
import httpx
import pytest

from tests.browser import chromium_context, chromium_or_skip, log_in
from tests.live.conftest import toolkeeper_server  # noqa: F401 (the live server fixture, reused)

# django_db: run alone, the session teardown of tests/conftest.py needs the test database set up.
pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.django_db]

STEP_MS = 20_000
CALLS = "document.querySelector('[data-chart=calls]').dataset.total"
MEASURED = "document.querySelector('[data-chart=latency]').dataset.measured"
POINTS = "document.querySelectorAll('#chart-latency circle').length"
COLUMNS = "document.querySelectorAll('#chart-calls rect').length"


def _wait_until(page, condition: str) -> None:
    """Polls a JavaScript condition through the DevTools protocol (the console's policy refuses eval)."""
    for _ in range(STEP_MS // 20):
        if page.evaluate(condition):
            return
        page.wait_for_timeout(20)
    raise AssertionError(f"never true: {condition}")


def test_the_charts_change_when_a_call_settles(toolkeeper_server):  # noqa: F811 (the imported fixture)
    chromium_or_skip()
    from playwright.sync_api import expect

    server = toolkeeper_server
    with (httpx.Client(base_url=server.url, headers=server.headers(), timeout=30) as app,
          chromium_context(server.url, step_ms=STEP_MS) as (context, csp)):
        session = app.post("/api/v1/sessions", json={"agent": "ops-bot", "user": "alice@example.com"})
        assert session.status_code == 201, session.text
        calls = f"/api/v1/sessions/{session.json()['id']}/calls"
        switched = app.post(calls, json={"name": "reset_tools", "input": {"ops": True}, "wait": 10})
        assert switched.json()["calls"][0]["status"] == "succeeded", switched.text

        page = context.new_page()
        log_in(page, server, "/t/demo/activity/", who="reviewer")  # a member, not an operator
        expect(page.locator("#live-indicator")).to_have_text("live")
        expect(page.get_by_role("link", name="Activity")).to_have_class("on")
        page.evaluate("window.__sameDocument = true")
        calls_before, measured_before = int(page.evaluate(CALLS)), int(page.evaluate(MEASURED))
        points_before = page.evaluate(POINTS)
        assert calls_before >= 1 and measured_before >= 1  # the reset_tools call, drawn already

        # The app starts a call that runs a second, without waiting for it.
        started = app.post(calls, json={"name": "countdown", "input": {"seconds": 1}})
        assert started.status_code in (200, 201, 202), started.text
        call = started.json()["calls"][0]
        assert call["status"] in ("queued", "running"), call

        # Counted as soon as it arrives; measured once it has settled.
        _wait_until(page, f"Number({CALLS}) === {calls_before + 1}")
        _wait_until(page, f"Number({MEASURED}) === {measured_before + 1}")
        settled = app.get(f"/api/v1/calls/{call['id']}").json()
        assert settled["status"] == "succeeded", settled
        assert page.evaluate(POINTS) >= points_before  # a point per minute with calls, per percentile
        assert page.evaluate(COLUMNS) >= 1
        expect(page.locator("[data-chart=calls] figcaption")).to_contain_text("succeeded")
        assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"
        page.screenshot(path="/tmp/activity_hour.png", full_page=True)

        # The day's span keeps its choice across the live reloads.
        page.get_by_role("link", name="Last day").click()
        page.wait_for_url("**/activity/?span=day")
        expect(page.get_by_role("link", name="Last day")).to_have_attribute("aria-current", "page")
        expect(page.locator("#live-indicator")).to_have_text("live")
        page.evaluate("window.__sameDocument = true")
        before = int(page.evaluate(CALLS))
        again = app.post(calls, json={"name": "reset_tools", "input": {"ops": True}, "wait": 10})
        assert again.json()["calls"][0]["status"] == "succeeded", again.text
        _wait_until(page, f"Number({CALLS}) === {before + 1}")
        expect(page.get_by_role("link", name="Last day")).to_have_attribute("aria-current", "page")
        assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"
        csp.assert_clean()


def test_the_charts_move_on_by_themselves_while_no_call_does(toolkeeper_server):  # noqa: F811
    """Time buckets roll forward with nobody calling: the page reloads its charts each minute it is shown."""
    chromium_or_skip()
    from playwright.sync_api import expect

    server = toolkeeper_server
    with chromium_context(server.url, step_ms=STEP_MS) as (context, csp):
        page = context.new_page()
        page.clock.install()
        log_in(page, server, "/t/demo/activity/", who="reviewer")
        expect(page.locator("#live-indicator")).to_have_text("live")
        page.evaluate("window.__reloads = 0; document.addEventListener('live:refreshed',"
                      " (e) => { if (e.detail.regions.includes('activity')) window.__reloads += 1; })")
        page.clock.fast_forward(30_000)
        page.wait_for_timeout(300)
        assert page.evaluate("window.__reloads") == 0  # not before the minute is up
        for _ in range(STEP_MS // 100):
            page.clock.fast_forward(1_000)
            if page.evaluate("window.__reloads") >= 1:
                break
            page.wait_for_timeout(100)
        assert page.evaluate("window.__reloads") >= 1, "the charts were never reloaded"
        csp.assert_clean()
