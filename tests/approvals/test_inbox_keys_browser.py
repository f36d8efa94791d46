"""In Chromium, at typing speed: the inbox's letter keys decide only what the reviewer saw (issue 36, point 8).

A reason typed straight after `r` (or an input after `e`) while the request page loads must never be read as
the list's shortcuts; `a` approves only a row whose whole input is on screen; a burst of keys that began on
one page never acts on the page that replaces it. The rules are in docs/notes/console.md ("Console").

The server is a real daphne process (`inbox_live_server`): the demo holds support-bot's `slow_write` for a
reviewer. What was decided is read back through the API after the browser loaded one more page: the server
runs the console's views one at a time, in the order their requests came, so any decision a key sent
before has been recorded by then. Every wait is bounded; nothing is timed.
"""
import re

import httpx
import pytest

from tests.browser import chromium_context, chromium_or_skip, log_in

pytestmark = [pytest.mark.browser, pytest.mark.live]

STEP_MS = 15_000
# All of an element in the window, as the inbox's wholeOnScreen has it: in a fractional layout an element's
# edges need not fall on whole pixels, and a scroll may leave part of one out.
ON_SCREEN = 0.99
INBOX = "/t/demo/inbox/"
REASON = "a mistake, reject"  # starts with `a`, and holds `e` and `r`: every letter the list reads
KEY_DELAY_MS = 60


def _hold_writes(server, texts: list[str]) -> list[str]:
    """The app asks for one `slow_write` per text, in this order; each waits for a reviewer. Their call ids."""
    with httpx.Client(base_url=server.url, headers=server.headers(), timeout=30) as app:
        session = app.post("/api/v1/sessions", json={"agent": "support-bot", "user": "alice@example.com"})
        assert session.status_code == 201, session.text
        calls = f"/api/v1/sessions/{session.json()['id']}/calls"
        switched = app.post(calls, json={"name": "reset_tools", "input": {"ops": True}, "wait": 10})
        assert switched.status_code == 200, switched.text
        ids = []
        for text in texts:  # one by one: the inbox lists them oldest first
            held = app.post(calls, json={"name": "slow_write", "input": {"text": text, "seconds": 1}})
            assert held.status_code == 200, held.text
            call = held.json()["calls"][0]
            assert call["status"] == "awaiting_approval", call
            ids.append(call["id"])
        return ids


def _votes(admin: httpx.Client, call_ids: list[str]) -> dict[str, list[str]]:
    """Each call's votes, as decisions."""
    found = {}
    for call_id in call_ids:
        call = admin.get(f"/api/v1/calls/{call_id}")
        assert call.status_code == 200, call.text
        found[call_id] = [vote["decision"] for vote in call.json()["approval"]["votes"]]
    return found


def _undecided(admin: httpx.Client, call_ids: list[str]) -> None:
    votes = _votes(admin, call_ids)
    assert all(not decided for decided in votes.values()), f"decided by keys typed as text: {votes}"
    for call_id in call_ids:
        assert admin.get(f"/api/v1/calls/{call_id}").json()["status"] == "awaiting_approval"


def _clear_inbox(admin: httpx.Client, call_ids: list[str]) -> None:
    """Reject what a test left pending, so the next test's list holds its own requests only."""
    for call_id in call_ids:
        approval = admin.get(f"/api/v1/calls/{call_id}").json()["approval"]
        if approval["status"] == "pending":
            admin.post(f"/api/v1/approvals/{approval['id']}/decide", json={"decision": "reject", "message": "done"})


def keys_ready(page) -> None:
    """Wait until an inbox page's keys act (they wait for a quiet keyboard on a page just shown)."""
    page.locator("html[data-keys=on]").wait_for(state="attached")


def _inbox(page, server) -> None:
    """Load the list again (the server has then handled whatever the page sent before) and wait for its keys."""
    page.goto(server.url + INBOX)
    keys_ready(page)


@pytest.fixture
def admin(inbox_live_server):
    with httpx.Client(base_url=inbox_live_server.url, headers=inbox_live_server.headers(
            inbox_live_server.admin_api_key), timeout=30) as client:
        yield client


def test_a_reason_typed_right_after_r_or_e_decides_nothing(inbox_live_server, admin):
    chromium_or_skip()
    from playwright.sync_api import expect

    server = inbox_live_server
    call_ids = _hold_writes(server, ["write one", "write two", "write three"])
    try:
        with chromium_context(server.url, step_ms=STEP_MS) as (context, csp):
            page = context.new_page()
            log_in(page, server, INBOX, who="reviewer")
            expect(page.locator("#requests tr[data-href]")).to_have_count(3)
            keys_ready(page)
            for _ in range(3):
                for key, fragment, focused in (("r", "reject", "#id_message"), ("e", "edit", "#id_input")):
                    page.keyboard.press(key)
                    page.keyboard.type(REASON, delay=KEY_DELAY_MS)  # at once: the request page is still loading
                    page.wait_for_load_state()
                    expect(page).to_have_url(re.compile(rf"/t/demo/inbox/\d+/#{fragment}$"))
                    expect(page.locator(focused)).to_be_focused()  # the rest of the keys went into the text box
                    _inbox(page, server)
                    _undecided(admin, call_ids)
                    expect(page.locator("#requests tr[data-href]")).to_have_count(3)
            csp.assert_clean()
    finally:
        _clear_inbox(admin, call_ids)


def test_a_approves_only_a_row_whose_whole_input_is_on_screen(inbox_live_server, admin):
    chromium_or_skip()
    from playwright.sync_api import expect

    server = inbox_live_server
    long_text = "append this long note to the customer's record, " * 4  # folded in the list: read on demand
    call_ids = _hold_writes(server, [long_text] + [f"short note {i}" for i in range(14)])
    note = "#keys-note"
    try:
        with chromium_context(server.url, step_ms=STEP_MS, height=600) as (context, csp):
            page = context.new_page()
            log_in(page, server, INBOX, who="reviewer")
            rows = page.locator("#requests tr[data-href]")
            expect(rows).to_have_count(15)
            keys_ready(page)

            # The first row is selected; its input is folded: `a` unfolds it and approves nothing.
            first = rows.nth(0)
            expect(first.locator("[data-input-whole]")).to_be_hidden()
            page.keyboard.press("a")
            expect(page.locator(note)).to_contain_text("press a again")
            expect(first.locator("[data-input-whole]")).to_be_in_viewport(ratio=ON_SCREEN)
            expect(first.locator("[data-input-whole]")).to_contain_text("append this long note")
            assert page.url.endswith(INBOX), page.url
            _undecided(admin, call_ids)
            # Its whole input on screen now: `a` approves it, and only it, whatever keys follow at once.
            page.keyboard.type("aaaa", delay=KEY_DELAY_MS)
            page.wait_for_url("**" + INBOX)
            expect(page.locator(".messages")).to_contain_text("approved")
            _inbox(page, server)
            votes = _votes(admin, call_ids)
            assert votes[call_ids[0]] == ["approve"], votes
            assert all(not decided for call_id, decided in votes.items() if call_id != call_ids[0]), votes

            # The last row, selected, then scrolled out of view: `a` shows it and approves nothing.
            expect(rows).to_have_count(14)
            for _ in range(13):
                page.keyboard.press("j")
            last = rows.nth(13)
            expect(last).to_have_class(re.compile(r"\bselected\b"))
            page.evaluate("window.scrollTo(0, 0)")
            expect(last.locator("[data-input-whole]")).not_to_be_in_viewport()
            page.keyboard.press("a")
            expect(page.locator(note)).to_contain_text("press a again")
            expect(last.locator("[data-input-whole]")).to_be_in_viewport(ratio=ON_SCREEN)
            votes = _votes(admin, call_ids)
            assert all(not decided for call_id, decided in votes.items() if call_id != call_ids[0]), votes
            page.keyboard.press("a")
            page.wait_for_url("**" + INBOX)
            expect(page.locator(".messages")).to_contain_text("approved")
            _inbox(page, server)
            votes = _votes(admin, call_ids)
            assert votes[call_ids[14]] == ["approve"], votes
            assert [call_id for call_id, decided in votes.items() if decided] == [call_ids[0], call_ids[14]], votes
            csp.assert_clean()
    finally:
        _clear_inbox(admin, call_ids)


def test_keys_pressed_right_after_j_on_a_request_page_decide_nothing(inbox_live_server, admin):
    """`j` leaves for the next request: an `a` typed at once acts neither on the page being left nor on the
    next one, which the reviewer has not seen yet."""
    chromium_or_skip()
    from playwright.sync_api import expect

    server = inbox_live_server
    call_ids = _hold_writes(server, ["first write", "second write", "third write"])
    try:
        with chromium_context(server.url, step_ms=STEP_MS) as (context, csp):
            page = context.new_page()
            log_in(page, server, INBOX, who="reviewer")
            expect(page.locator("#requests tr[data-href]")).to_have_count(3)
            page.locator("#requests tr[data-href] a").first.click()
            page.wait_for_url(re.compile(r"/t/demo/inbox/\d+/$"))
            first_page = page.url
            keys_ready(page)
            page.keyboard.press("j")
            page.keyboard.type("aaaaaaaa", delay=KEY_DELAY_MS)
            page.wait_for_load_state()
            expect(page).not_to_have_url(first_page)
            expect(page.locator("#decide")).to_be_visible()  # the next request, still undecided
            _inbox(page, server)
            _undecided(admin, call_ids)
            csp.assert_clean()
    finally:
        _clear_inbox(admin, call_ids)
