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

from tests.approvals.test_inbox_keys_browser import keys_ready
from tests.browser import chromium_context, chromium_or_skip, log_in

pytestmark = [pytest.mark.browser, pytest.mark.live]

SCREENSHOT = Path("/tmp/inbox.png")
WAIT_S = 30
STEP_MS = 15_000  # bound on each browser step



def _submit_for_review(app, *, expression: str, user: str, context: dict | None = None) -> dict:
    """The app's side: a session, the math group on, one `calculate` call, which waits for a reviewer."""
    session = app.post("/api/v1/sessions", json={"agent": "support-bot", "user": user, "context": context or {}})
    assert session.status_code == 201, session.text
    calls = f"/api/v1/sessions/{session.json()['id']}/calls"
    switched = app.post(calls, json={"name": "reset_tools", "input": {"math": True}, "wait": 10})
    assert switched.json()["calls"][0]["status"] == "succeeded", switched.text
    submitted = app.post(calls, json={"calls": [{"name": "calculate", "input": {"expression": expression}}],
                                      "wait": WAIT_S})
    assert submitted.status_code == 200, submitted.text
    return submitted.json()["calls"][0]


def _admin_asking_for_calculate(server, *, note: str) -> httpx.Client:
    """The demo admin's API client, after adding a rule that holds support-bot's `calculate` for a reviewer."""
    admin = httpx.Client(base_url=server.url, headers=server.headers(server.admin_api_key), timeout=30)
    rule = admin.post("/api/v1/rules", json={"behavior": "ask", "tool_pattern": "calculate",
                                             "agents": ["support-bot"], "note": note})
    assert rule.status_code == 201, rule.text
    return admin


def _app_submits_and_waits(server, outcome: dict) -> None:
    """The app: one `calculate` call for a reviewer; then it waits for the final result."""
    try:
        with httpx.Client(base_url=server.url, headers=server.headers(), timeout=WAIT_S + 30) as app:
            call = _submit_for_review(app, expression="1 + 1", user="alice@example.com", context={"ticket": "T-1042"})
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
    admin = _admin_asking_for_calculate(server, note="arithmetic by hand")

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
            log_in(page, server, "/t/demo/inbox/", who="reviewer")  # the login page, then back to the inbox
            rows = page.locator("#requests tr[data-href]")
            expect(rows).to_have_count(1)
            expect(rows.first).to_contain_text("calculate")
            expect(rows.first).to_contain_text("support-bot")
            expect(rows.first).to_contain_text("alice@example.com")
            expect(page.locator("#pending-count")).to_have_text("1")
            page.screenshot(path="/tmp/inbox-list.png", full_page=True)

            # Enter opens the selected request.
            keys_ready(page)
            page.keyboard.press("Enter")
            page.wait_for_url("**/t/demo/inbox/*/")
            keys_ready(page)
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


def test_typing_a_reason_never_decides_and_focused_buttons_ignore_the_letter_keys(inbox_live_server):
    """`r` from the inbox opens the request to write a rejection: every letter typed goes into the message
    (none of a, e, r, j acts), a focused decision button ignores the letters too, and Ctrl+Enter rejects."""
    chromium_or_skip()
    from playwright.sync_api import expect

    server = inbox_live_server
    admin = _admin_asking_for_calculate(server, note="typed by hand")
    with httpx.Client(base_url=server.url, headers=server.headers(), timeout=WAIT_S) as app:
        call = _submit_for_review(app, expression="2 + 2", user="bob@example.com")
    assert call["status"] == "awaiting_approval", call
    reason = "a rejection: never rerun jobs, ask Jane"

    def status() -> str:
        return admin.get(f"/api/v1/calls/{call['id']}").json()["status"]

    try:
        with chromium_context(server.url, step_ms=STEP_MS, height=1000) as (context, csp):
            page = context.new_page()
            log_in(page, server, "/t/demo/inbox/", who="reviewer")
            rows = page.locator("#requests tr[data-href]")
            expect(rows).to_have_count(1)
            keys_ready(page)
            page.keyboard.press("r")
            page.wait_for_url("**/t/demo/inbox/*/#reject")
            message = page.locator("#id_message")
            expect(message).to_be_focused()
            page.keyboard.type(reason, delay=20)
            expect(message).to_have_value(reason)
            assert status() == "awaiting_approval"

            # A decision button with focus (a Tab away, or a click elsewhere that landed on it) takes no letter.
            page.locator("#decide-reject").focus()
            for key in "aerj":
                page.keyboard.press(key)
            expect(page.locator("#decide-reject")).to_be_focused()
            assert "/inbox/" in page.url and page.url.endswith("/#reject"), page.url
            assert status() == "awaiting_approval"
            expect(message).to_have_value(reason)

            # With nothing focused, `e` and `r` move to the editor and the message; they decide nothing.
            page.keyboard.press("Escape")
            page.evaluate("document.activeElement.blur()")
            keys_ready(page)
            page.keyboard.press("e")
            expect(page.locator("#id_input")).to_be_focused()
            page.keyboard.press("Escape")
            page.keyboard.press("r")
            expect(message).to_be_focused()
            assert status() == "awaiting_approval"

            page.keyboard.press("Control+Enter")  # on purpose: rejects with the whole reason
            page.wait_for_url(lambda url: url.split("#")[0].endswith("/t/demo/inbox/"))  # the redirect keeps #reject
            expect(page.locator(".messages")).to_contain_text("rejected")
            csp.assert_clean()
        final = admin.get(f"/api/v1/calls/{call['id']}").json()
        assert final["status"] == "rejected", final
        assert [(v["decision"], v["message"]) for v in final["approval"]["votes"]] == [("reject", reason)]
    finally:
        admin.close()
