"""In Chromium: a reviewer filters the inbox, selects every request on the page, reads an input, and approves
them in one action; the request of the reviewer's own session is skipped with the four-eyes reason, and the
app's approved calls run, and a request that arrived meanwhile stays unticked and waits (docs/governance.md,
"Approvals": bulk decisions).

The server is a real daphne process (`inbox_live_server`, tests/live/server.py); the app speaks the public
API with httpx and the demo tenant's keys; the reviewer is Playwright driving Debian's Chromium. Every wait is
bounded; nothing is timed.
"""
import httpx
import pytest

from tests.approvals.test_inbox_keys_browser import keys_ready
from tests.browser import chromium_context, chromium_or_skip, log_in

pytestmark = [pytest.mark.browser, pytest.mark.live]

WAIT_S = 30
STEP_MS = 15_000
LONG = " + ".join(str(n) for n in range(1, 31))  # an input too long for the row's one line: shown in a <details>


def _calls(app, *, agent: str, user: str, expressions: list[str]) -> list[dict]:
    """A session of `agent` for `user`, the math group on, one `calculate` call per expression (each waits)."""
    session = app.post("/api/v1/sessions", json={"agent": agent, "user": user})
    assert session.status_code == 201, session.text
    calls = f"/api/v1/sessions/{session.json()['id']}/calls"
    switched = app.post(calls, json={"name": "reset_tools", "input": {"math": True}, "wait": 10})
    assert switched.json()["calls"][0]["status"] == "succeeded", switched.text
    submitted = app.post(calls, json={"calls": [{"name": "calculate", "input": {"expression": e}}
                                                for e in expressions]})
    assert submitted.status_code == 200, submitted.text
    made = submitted.json()["calls"]
    assert [c["status"] for c in made] == ["awaiting_approval"] * len(expressions), made
    return made


def test_reviewer_approves_a_filtered_page_in_one_action_and_the_own_session_is_skipped(inbox_live_server):
    chromium_or_skip()
    from playwright.sync_api import expect

    server = inbox_live_server
    reviewer = server.credentials["reviewer"]["username"]
    admin = httpx.Client(base_url=server.url, headers=server.headers(server.admin_api_key), timeout=30)
    app = httpx.Client(base_url=server.url, headers=server.headers(), timeout=WAIT_S + 30)
    try:
        queue = admin.post("/api/v1/queues", json={"name": "incident", "four_eyes": True})
        assert queue.status_code == 201, queue.text
        rule = admin.post("/api/v1/rules", json={"behavior": "ask", "tool_pattern": "calculate", "queue": "incident",
                                                 "agents": ["triage-bot", "noise-bot"], "note": "after the incident"})
        assert rule.status_code == 201, rule.text
        approved = _calls(app, agent="triage-bot", user="alice@example.com", expressions=["2 + 3", LONG])
        (own,) = _calls(app, agent="triage-bot", user=reviewer, expressions=["7 * 6"])
        (noise,) = _calls(app, agent="noise-bot", user="alice@example.com", expressions=["1 + 1"])

        with chromium_context(server.url, step_ms=STEP_MS, height=1000) as (context, csp):
            page = context.new_page()
            log_in(page, server, "/t/demo/inbox/", who="reviewer")
            rows = page.locator("#requests tr[data-href]")
            expect(rows).to_have_count(4)
            # Filter: the triage bot's requests only.
            page.locator("select[name=agent]").select_option("triage-bot")
            page.get_by_role("button", name="Filter").click()
            page.wait_for_url("**/t/demo/inbox/?*agent=triage-bot*")
            keys_ready(page)
            expect(rows).to_have_count(3)
            expect(page.locator("#requests")).not_to_contain_text('"1 + 1"')  # the noise bot's input
            own_row = rows.filter(has_text="7 * 6")
            expect(own_row.locator(".cannot-decide")).to_contain_text("Four-eyes")

            # `x` ticks the current row (the first); then select all on the page; read the long input, unfolded.
            page.keyboard.press("x")
            expect(page.locator("#bulk-count")).to_have_text("1 selected")
            expect(rows.first.locator('input[name="ids"]')).to_be_checked()
            page.locator("#select-all").check()
            expect(page.locator("#bulk-count")).to_have_text("3 selected")
            expect(page.locator('#requests input[name="ids"]:checked')).to_have_count(3)
            long_row = rows.filter(has_text="1 + 2 + 3")
            long_row.locator("summary").click()
            expect(long_row.locator("pre[data-input-whole]")).to_be_visible()
            expect(long_row.locator("pre[data-input-whole]")).to_contain_text("29 + 30")
            assert "/inbox/?" in page.url  # the click in the input unfolded it, it did not open the request

            # A request that arrives meanwhile joins the list live, unticked; the ticks stay where they were.
            (late,) = _calls(app, agent="triage-bot", user="alice@example.com", expressions=["9 - 4"])
            expect(rows).to_have_count(4)
            expect(page.locator('#requests input[name="ids"]:checked')).to_have_count(3)
            expect(rows.filter(has_text="9 - 4").locator('input[name="ids"]')).not_to_be_checked()
            expect(page.locator("#bulk-count")).to_have_text("3 selected")
            select_all = page.locator("#select-all")  # the refreshed table's own header checkbox, half ticked
            expect(select_all).to_be_visible()
            assert select_all.evaluate("box => box.indeterminate && !box.checked")

            page.locator("#bulk-approve").click()
            page.wait_for_url("**/t/demo/inbox/?*agent=triage-bot*")
            messages = page.locator(".messages")
            expect(messages).to_contain_text("Approved 2:")
            expect(messages).to_contain_text(
                "four-eyes: you cannot decide a call made in your own session")
            expect(rows).to_have_count(2)
            expect(rows.filter(has_text="7 * 6")).to_have_count(1)
            expect(rows.filter(has_text="9 - 4")).to_have_count(1)
            page.screenshot(path="/tmp/inbox-bulk.png", full_page=True)
            csp.assert_clean()

        # The app's approved calls continue to their results; the skipped and the unselected ones still wait.
        results = {}
        for call in approved:
            final = app.get(f"/api/v1/calls/{call['id']}", params={"wait": WAIT_S})
            assert final.status_code == 200, final.text
            results[call["input"]["expression"]] = final.json()
        assert {e: r["status"] for e, r in results.items()} == {"2 + 3": "succeeded", LONG: "succeeded"}
        assert results["2 + 3"]["result"]["structured"]["value"] == 5
        assert results[LONG]["result"]["structured"]["value"] == 465
        for call in results.values():
            assert [(v["reviewer"], v["decision"]) for v in call["approval"]["votes"]] == [(reviewer, "approve")]
        for waiting in (own, noise, late):
            state = admin.get(f"/api/v1/calls/{waiting['id']}").json()
            assert state["status"] == "awaiting_approval" and state["approval"]["votes"] == [], state
    finally:
        admin.close()
        app.close()
