"""In Chromium: an operator watches a long call arrive, its progress bar advance and its output stream in,
and the call finish, all without reloading; a dropped socket shows "reconnecting…", comes back by itself
and misses nothing.

The server is a real daphne process (the live tests' `toolkeeper_server`: embedded mode, SQLite, the
in-process channel layer, the local executor, the demo tenant). The app speaks the public API with
httpx and the demo API key; the operator is Playwright driving Debian's Chromium (/usr/bin/chromium).
Every wait is bounded; nothing is timed.
"""

import re

import httpx
import pytest

from tests.browser import chromium_context, chromium_or_skip, log_in
from tests.live.conftest import toolkeeper_server  # noqa: F401 (the live server fixture, reused)

# django_db although the test reads nothing from the test database: run alone, without it no test database
# is set up and tests/conftest.py's session teardown (_close_stray_connections) fails to connect.
pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.django_db]

STEP_MS = 20_000  # bound on each browser step
SECONDS = 6  # the countdown's length: progress every second

PROGRESS = "document.querySelector('progress[data-live-progress]').value"
LINES = "document.querySelectorAll('[data-live-output] .line').length"



def _shoot(page, name: str) -> None:
    page.screenshot(path=f"/tmp/live_{name}.png", full_page=True)


def _mark_no_reload(page) -> None:
    page.evaluate("window.__sameDocument = true")


def _assert_no_reload(page) -> None:
    assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"


def _wait_until(page, condition: str) -> None:
    """Polls a JavaScript condition (every 20 ms, bounded by STEP_MS) through the DevTools protocol:
    page.wait_for_function would compile it inside the page, which the console's policy (no eval) refuses."""
    for _ in range(STEP_MS // 20):
        if page.evaluate(condition):
            return
        page.wait_for_timeout(20)
    raise AssertionError(f"never true: {condition}")


def _drop_and_recover(page, expect) -> None:
    """Close every socket of the page as a network drop would; the page says so, then reconnects by itself."""
    indicator = page.locator("#live-indicator")
    expect(indicator).to_have_attribute("data-state", "live")
    page.evaluate("window.toolkeeperLive.drop()")
    _wait_until(page, "window.toolkeeperLive.state() === 'reconnecting'")
    expect(indicator).to_have_text("reconnecting…")
    page.screenshot(path="/tmp/live_reconnecting.png", clip={"x": 0, "y": 0, "width": 1280, "height": 120})
    expect(indicator).to_have_attribute("data-state", "live")
    expect(indicator).to_have_text("live")


def test_an_operator_watches_a_long_call_live(toolkeeper_server):  # noqa: F811 (the imported fixture)
    chromium_or_skip()
    server = toolkeeper_server
    with httpx.Client(base_url=server.url, headers=server.headers(), timeout=30) as app:
        session = app.post("/api/v1/sessions", json={"agent": "ops-bot", "user": "alice@example.com"})
        assert session.status_code == 201, session.text
        session_id = session.json()["id"]
        switched = app.post(f"/api/v1/sessions/{session_id}/calls",
                            json={"id": "call_ops", "name": "reset_tools", "input": {"ops": True}, "wait": 10})
        assert switched.status_code == 200, switched.text
        assert switched.json()["calls"][0]["status"] == "succeeded", switched.text
        _watch_a_long_call(server, app, session_id)


def _watch_a_long_call(server, app, session_id) -> None:
    from playwright.sync_api import expect

    with chromium_context(server.url, step_ms=STEP_MS) as (context, csp):
        page = context.new_page()

        # The operator logs in through the login page and lands on the calls list.
        log_in(page, server, "/t/demo/calls/")
        indicator = page.locator("#live-indicator")
        expect(indicator).to_have_text("live")
        expect(page.locator("tr[data-call]", has_text="call_ops")).to_have_count(1)

        # A dropped socket: "reconnecting…", then live again by itself.
        _mark_no_reload(page)
        _drop_and_recover(page, expect)

        # The session page, in a second tab, follows the session's calls.
        session_page = context.new_page()
        session_page.goto(f"{server.url}/t/demo/sessions/{session_id}/")
        expect(session_page.locator("#live-indicator")).to_have_text("live")
        _mark_no_reload(session_page)

        # The app starts the countdown without waiting.
        submitted = app.post(f"/api/v1/sessions/{session_id}/calls", json={
            "id": "call_countdown", "name": "countdown", "input": {"seconds": SECONDS}})
        assert submitted.status_code in (200, 201, 202), submitted.text
        call = submitted.json()["calls"][0]
        assert call["status"] in ("queued", "running"), call

        # The new row appears on top of the calls list, without a reload.
        row = page.locator(f'tr[data-call="{call["id"]}"]')
        expect(row).to_be_visible()
        expect(page.locator("table.calls tbody tr").first).to_have_attribute("data-call", call["id"])
        expect(row).to_contain_text("countdown")
        expect(row.locator("[data-call-status]")).to_have_text("running")
        expect(row.locator("[data-call-progress]")).to_have_text(re.compile(r"^\d{1,3}%$"))  # as it advances
        _assert_no_reload(page)
        _shoot(page, "calls")
        expect(session_page.locator(f'tr[data-call="{call["id"]}"]')).to_be_visible()

        # The call page: the progress bar advances, the output streams in, without a reload.
        row.locator("a").first.click()
        page.wait_for_url(f"**/t/demo/calls/{call['id']}/")
        expect(indicator).to_have_text("live")
        _mark_no_reload(page)
        first, lines = page.evaluate(PROGRESS), page.evaluate(LINES)
        _wait_until(page, f"{PROGRESS} > {first}")
        second = page.evaluate(PROGRESS)
        assert first < second, (first, second)
        _wait_until(page, f"{LINES} > {lines}")
        expect(page.locator("[data-live-progress-section]")).to_be_visible()
        expect(page.locator("[data-live-output]")).to_be_visible()
        _assert_no_reload(page)
        if second < 1:
            _shoot(page, "call_running")

        # A drop while the call runs: the page resumes after the last event it showed.
        page.evaluate("window.toolkeeperLive.drop()")
        status = page.locator("h1 [data-call-status]")
        expect(status).to_have_text("succeeded", timeout=STEP_MS + SECONDS * 1000)
        expect(indicator).to_have_text("live")
        expect(page.locator("[data-live-region=call-outcome]")).to_contain_text(
            f"counted down {SECONDS} seconds")
        expect(page.locator("[data-live-region=call-facts] dt:text-is('Finished') + dd")).not_to_have_text("—")
        assert page.evaluate(PROGRESS) == 1
        expect(page.locator("[data-live-progress-label]")).to_have_text("100%")
        _assert_no_reload(page)
        _shoot(page, "call_done")

        # Nothing missed, nothing twice: the timeline and the output are exactly the stored events.
        events = app.get(f"/api/v1/calls/{call['id']}/events")
        assert events.status_code == 200, events.text
        stored = events.json()["events"]
        shown = [int(seq) for seq in page.locator("[data-live-timeline] tr").evaluate_all(
            "rows => rows.map(row => row.dataset.seq)")]
        assert shown == [event["seq"] for event in stored]
        # Each event's time, added live or not, is how long after the call was made, in the one duration format.
        after = page.locator("[data-live-timeline] tr td:nth-child(2)").all_inner_texts()
        assert len(after) == len(stored), after
        assert all(re.fullmatch(r"\+(\d+(\.\d+)? s|\d+ min( \d+ s)?)", text) for text in after), after
        texts = [e["data"]["text"] for e in stored if e["kind"] in ("progress", "output") and e["data"]["text"]]
        assert page.locator("[data-live-output] .line").all_inner_texts() == texts
        assert texts[-1] == "done" and f"{SECONDS} s left" in texts

        # The session page followed the call to its end, without a reload.
        expect(session_page.locator(f'tr[data-call="{call["id"]}"] [data-call-status]')).to_have_text(
            "succeeded")
        expect(session_page.locator("[data-live-region=session-facts] dt:text-is('Calls') + dd")).to_have_text("2")
        _assert_no_reload(session_page)
        _shoot(session_page, "session")
        csp.assert_clean()


def test_the_inbox_badge_and_the_dashboard_follow_an_approval_without_a_reload(toolkeeper_server):  # noqa: F811
    chromium_or_skip()
    from playwright.sync_api import expect

    server = toolkeeper_server
    admin = httpx.Client(base_url=server.url, headers=server.headers(server.admin_api_key), timeout=30)
    app = httpx.Client(base_url=server.url, headers=server.headers(), timeout=30)
    try:
        rule = admin.post("/api/v1/rules", json={"behavior": "ask", "tool_pattern": "countdown",
                                                 "agents": ["badge-bot"], "note": "a human starts countdowns"})
        assert rule.status_code == 201, rule.text
        session = app.post("/api/v1/sessions", json={"agent": "badge-bot"})
        assert session.status_code == 201, session.text
        session_id = session.json()["id"]
        switched = app.post(f"/api/v1/sessions/{session_id}/calls",
                            json={"name": "reset_tools", "input": {"ops": True}, "wait": 10})
        assert switched.json()["calls"][0]["status"] == "succeeded", switched.text

        with chromium_context(server.url, step_ms=STEP_MS) as (context, csp):
            page = context.new_page()
            log_in(page, server, "/t/demo/")
            expect(page.locator("#live-indicator")).to_have_text("live")
            badge = page.locator('[data-live="inbox-count"]')
            expect(badge).to_have_text("0")
            expect(badge).to_have_class("count zero")
            calls_before = page.locator(".cards .card").nth(3).locator(".n").inner_text()
            _mark_no_reload(page)
            # A reviewer's inbox list, open in a second tab of the same login.
            inbox = page.context.new_page()
            inbox.set_default_timeout(STEP_MS)
            inbox.goto(server.url + "/t/demo/inbox/")
            expect(inbox.locator("#live-indicator")).to_have_text("live")
            expect(inbox.locator("#requests tbody")).to_contain_text("Nothing is waiting")
            _mark_no_reload(inbox)

            # An approval request opens: the badge counts it, the dashboard shows the waiting call.
            submitted = app.post(f"/api/v1/sessions/{session_id}/calls", json={
                "name": "countdown", "input": {"seconds": 1}})
            call = submitted.json()["calls"][0]
            assert call["status"] == "awaiting_approval", call
            expect(badge).to_have_text("1")
            expect(badge).to_have_class("count")
            row = page.locator(f'tr[data-call="{call["id"]}"]')
            expect(row.locator("[data-call-status]")).to_have_text("awaiting_approval")
            expect(page.locator(".cards .card").nth(3).locator(".n")).not_to_have_text(calls_before)
            _assert_no_reload(page)
            _shoot(page, "dashboard")
            # The new request appears in the inbox list without a reload, and its count with it.
            new_row = inbox.locator("#requests tr[data-id]")
            expect(new_row).to_have_count(1)
            expect(new_row).to_contain_text("countdown")
            expect(inbox.locator('[data-live-region="inbox-summary"]')).to_contain_text("1 pending")
            _assert_no_reload(inbox)
            _shoot(inbox, "inbox")

            # It is settled (rejected through the API): the badge counts down, the row follows.
            pending = admin.get("/api/v1/approvals", params={"status": "pending"})
            assert pending.status_code == 200, pending.text
            (approval,) = [a for a in pending.json()["results"] if a["call"]["id"] == call["id"]]
            decided = admin.post(f"/api/v1/approvals/{approval['id']}/decide",
                                 json={"decision": "reject", "message": "not now"})
            assert decided.status_code == 200, decided.text
            expect(badge).to_have_text("0")
            expect(inbox.locator("#requests tr[data-id]")).to_have_count(0)
            _assert_no_reload(inbox)
            expect(row.locator("[data-call-status]")).to_have_text("rejected")
            expect(page.locator('.by-status td[data-status="rejected"]')).to_be_visible()
            _assert_no_reload(page)
            csp.assert_clean()
    finally:
        admin.close()
        app.close()


def test_an_edited_approval_and_new_sessions_show_up_live(toolkeeper_server):  # noqa: F811 (the imported fixture)
    """The call page's effective input and its approval refresh when a reviewer's edit lands, with the edit as
    a diff; the sessions list shows a new session without a reload."""
    chromium_or_skip()
    from playwright.sync_api import expect

    server = toolkeeper_server
    app = httpx.Client(base_url=server.url, headers=server.headers(), timeout=30)
    admin = httpx.Client(base_url=server.url, headers=server.headers(server.admin_api_key), timeout=30)
    try:
        session = app.post("/api/v1/sessions", json={"agent": "support-bot", "user": "erin@example.com"}).json()
        calls = f"/api/v1/sessions/{session['id']}/calls"
        assert app.post(calls, json={"name": "reset_tools", "input": {"ops": True}, "wait": 10}).status_code == 200
        held = app.post(calls, json={"name": "slow_write", "input": {"text": "draft", "seconds": 1}}).json()
        call = held["calls"][0]
        assert call["status"] == "awaiting_approval", call
        request_id = app.get(f"/api/v1/calls/{call['id']}").json()["approval"]["id"]

        with chromium_context(server.url, step_ms=STEP_MS) as (context, csp):
            page = context.new_page()
            log_in(page, server, f"/t/demo/calls/{call['id']}/")
            expect(page.locator("#live-indicator")).to_have_text("live")
            effective = page.locator("#effective-input")
            expect(effective).to_contain_text('"text": "draft"')
            _mark_no_reload(page)

            sessions = context.new_page()
            sessions.goto(f"{server.url}/t/demo/sessions/")
            expect(sessions.locator("#live-indicator")).to_have_text("live")
            _mark_no_reload(sessions)

            decided = admin.post(f"/api/v1/approvals/{request_id}/decide",
                                 json={"decision": "edit", "input": {"text": "final", "seconds": 1}})
            assert decided.status_code == 200, decided.text
            expect(page.locator("h1 [data-call-status]")).to_have_text("succeeded")
            expect(effective).to_contain_text('"text": "final"')
            votes = page.locator("#approval-votes")
            expect(votes).to_contain_text("approved by")
            expect(votes).to_contain_text("(edited)")
            expect(votes.locator("pre.diff .removed")).to_have_text('- text: "draft"')
            expect(votes.locator("pre.diff .added")).to_have_text('+ text: "final"')
            timeline = page.locator("[data-live-timeline]")  # the vote is an event of the call, before the run
            expect(timeline).to_contain_text("(edited)")
            expect(timeline).to_contain_text('"changes": ["- text: \\"draft\\"", "+ text: \\"final\\""]')
            _assert_no_reload(page)
            _shoot(page, "edited_approval")

            other = app.post("/api/v1/sessions", json={"agent": "ops-bot", "user": "fay@example.com"}).json()
            app.post(f"/api/v1/sessions/{other['id']}/calls", json={"name": "reset_tools", "input": {"ops": True}})
            expect(sessions.locator(f'tr[data-id="{other["id"]}"]')).to_contain_text("fay@example.com")
            _assert_no_reload(sessions)
            csp.assert_clean()
    finally:
        app.close()
        admin.close()
