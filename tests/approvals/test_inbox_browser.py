"""In Chromium: a reviewer edits and approves a pending call; the app's waiting request gets the result.

The server is a real daphne process (`inbox_live_server`, started with tests/live/server.py: the `wait`
endpoints are async and need ASGI).
The app side speaks the public API with httpx and the demo tenant's keys; the reviewer side is
Playwright driving Debian's Chromium (/usr/bin/chromium). Every wait is bounded; nothing is timed.
"""
import threading
from pathlib import Path

import httpx
import pytest

from ..browser import chromium_context, chromium_or_skip

pytestmark = [pytest.mark.browser, pytest.mark.live]

SCREENSHOT = Path("/tmp/inbox.png")
WAIT_S = 30
STEP_MS = 15_000  # bound on each browser step



def _app_submits_and_waits(server, outcome: dict) -> None:
    """The app: a session, the math group on, one `calculate` call; then it waits for the final result."""
    try:
        with httpx.Client(base_url=server.url, headers=server.headers(), timeout=WAIT_S + 30) as app:
            session = app.post("/api/v1/sessions", json={"agent": "support-bot", "user": "alice@example.com",
                                                         "context": {"ticket": "T-1042"}})
            assert session.status_code == 201, session.text
            session_id = session.json()["id"]
            switched = app.post(f"/api/v1/sessions/{session_id}/calls",
                                json={"name": "reset_tools", "input": {"math": True}, "wait": 10})
            assert switched.json()["calls"][0]["status"] == "succeeded", switched.text
            submitted = app.post(f"/api/v1/sessions/{session_id}/calls", json={
                "calls": [{"id": "call_sum", "name": "calculate", "input": {"expression": "1 + 1"}}], "wait": WAIT_S})
            assert submitted.status_code == 200, submitted.text
            call = submitted.json()["calls"][0]
            outcome["submitted"] = call
            outcome["asked"].set()
            # The call waits for a human: hold a request open until it is final.
            final = app.get(f"/api/v1/calls/{call['id']}", params={"wait": WAIT_S})
            assert final.status_code == 200, final.text
            outcome["final"] = final.json()
    except BaseException as exc:  # reported by the test thread
        outcome["error"] = exc
        outcome["asked"].set()


def test_reviewer_edits_and_approves_in_chromium_and_the_waiting_app_gets_the_result(inbox_live_server):
    chromium_or_skip()
    from playwright.sync_api import expect

    server = inbox_live_server
    admin = httpx.Client(base_url=server.url, headers=server.headers(server.admin_api_key), timeout=30)
    rule = admin.post("/api/v1/rules", json={"behavior": "ask", "tool_pattern": "calculate",
                                             "agents": ["support-bot"], "note": "arithmetic by hand"})
    assert rule.status_code == 201, rule.text

    outcome = {"asked": threading.Event()}
    app = threading.Thread(target=_app_submits_and_waits, args=(server, outcome), daemon=True)
    app.start()
    try:
        assert outcome["asked"].wait(WAIT_S), "the app never got an answer to its submit"
        assert "error" not in outcome, outcome.get("error")
        assert outcome["submitted"]["status"] == "awaiting_approval", outcome["submitted"]

        reviewer = server.credentials["reviewer"]
        with chromium_context(server.url, step_ms=STEP_MS, height=1000) as (context, csp):
            page = context.new_page()
            page.goto(f"{server.url}/t/demo/inbox/")
            # Not logged in: the login page, then back to the inbox.
            page.fill("#id_username", reviewer["username"])
            page.fill("#id_password", reviewer["password"])
            page.click("button[type=submit]")
            page.wait_for_url("**/t/demo/inbox/")
            rows = page.locator("#requests tr[data-href]")
            expect(rows).to_have_count(1)
            expect(rows.first).to_contain_text("calculate")
            expect(rows.first).to_contain_text("support-bot")
            expect(rows.first).to_contain_text("alice@example.com")
            expect(page.locator("#pending-count")).to_have_text("1")
            page.screenshot(path="/tmp/inbox-list.png", full_page=True)

            # Enter opens the selected request.
            page.keyboard.press("Enter")
            page.wait_for_url("**/t/demo/inbox/*/")
            expect(page.locator("h1")).to_contain_text("calculate")
            expect(page.locator("#input-readable")).to_contain_text('"expression": "1 + 1"')
            expect(page.get_by_text("arithmetic by hand").first).to_be_visible()
            expect(page.get_by_text("T-1042")).to_be_visible()  # the session's context

            # `e` focuses the JSON editor; a broken edit is flagged before sending.
            page.keyboard.press("e")
            editor = page.locator("#id_input")
            expect(editor).to_be_focused()
            editor.fill('{"expression": "6 * 7"')
            expect(page.locator("#json-state")).to_have_class("jsonstate bad")
            editor.fill('{\n  "expression": "6 * 7"\n}')
            expect(page.locator("#json-state")).to_have_text("✓ valid JSON")
            page.screenshot(path=str(SCREENSHOT), full_page=True)

            assert app.is_alive(), "the app's wait returned before anyone decided"
            # Esc leaves the editor, `a` approves (the changed input makes it an edit).
            page.keyboard.press("Escape")
            page.keyboard.press("a")
            page.wait_for_url("**/t/demo/inbox/")
            expect(page.locator(".messages")).to_contain_text("approved with your edit")
            expect(page.locator("#pending-count")).to_have_text("0")
            csp.assert_clean()

        app.join(WAIT_S + 30)
        assert not app.is_alive(), "the app's waiting request did not return"
        assert "error" not in outcome, outcome.get("error")
        final = outcome["final"]
        assert final["status"] == "succeeded", final
        assert final["input"] == {"expression": "1 + 1"}  # what the model sent
        assert final["result"]["structured"] == {"expression": "6 * 7", "value": 42}  # what the reviewer approved
        votes = final["approval"]["votes"]
        assert [(v["reviewer"], v["decision"]) for v in votes] == [(reviewer["username"], "edit")]
    finally:
        admin.close()
        app.join(1)
