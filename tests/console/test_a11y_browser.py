"""In Chromium, every console page a demo admin can reach is checked with axe-core (from the npm registry,
tests/a11y): no serious or critical accessibility violation. And at phone width the navigation folds
into a menu and a request's decide bar is on screen without scrolling.

The pages are found as a user finds them: from the dashboard, by following the console's own links
(breadth first, each once), after the app has made a call that waits for a reviewer so that the inbox
and a request page have something to show.
"""
import re
from pathlib import Path
from urllib.parse import urldefrag, urlsplit

import httpx
import pytest

from tests.browser import chromium_context, chromium_or_skip, log_in
from tests.live.conftest import toolkeeper_server  # noqa: F401 (the live server fixture, reused)

pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.django_db]

AXE = Path(__file__).resolve().parent.parent / "a11y" / "node_modules" / "axe-core" / "axe.min.js"
STEP_MS = 20_000
MAX_PAGES = 120
# Links that change something when followed, leave the console, or only serve a file.
SKIP = re.compile(r"/logout/|/api/|/admin/|/download|/export|\.(json|zip|md)$")
# The same page with other data (a number in the path, a filter or a page in the query) is visited once.
SHAPE = re.compile(r"/\d+/|/[0-9a-f]{8}-[0-9a-f-]{27}/")


def _axe_or_skip() -> str:
    if not AXE.exists():
        import os

        problem = f"{AXE} is missing (make install-node installs it)"
        if os.environ.get("TOOLKEEPER_REQUIRE_SERVICES") == "1":
            pytest.fail(problem)
        pytest.skip(problem)
    return AXE.read_text()


def _pending_request(server) -> None:
    """The app makes a call that waits for a reviewer (the demo holds support-bot's slow_write for one)."""
    with httpx.Client(base_url=server.url, headers=server.headers(), timeout=30) as app:
        session = app.post("/api/v1/sessions", json={"agent": "support-bot", "user": "alice@example.com"})
        assert session.status_code == 201, session.text
        calls = f"/api/v1/sessions/{session.json()['id']}/calls"
        switched = app.post(calls, json={"name": "reset_tools", "input": {"ops": True}, "wait": 10})
        assert switched.status_code == 200, switched.text
        held = app.post(calls, json={"name": "slow_write", "input": {"text": "hello", "seconds": 1}})
        assert held.json()["calls"][0]["status"] == "awaiting_approval", held.text


def _violations(page, axe: str) -> list[str]:
    page.evaluate(axe)  # through the DevTools protocol: the console's policy refuses injected scripts
    found = page.evaluate("""axe.run(document, {resultTypes: ["violations"]}).then(r => r.violations.map(v => ({
        id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 3).map(n => n.target.join(" "))})))""")
    return [f"{v['impact']} {v['id']}: {v['help']} at {v['nodes']}" for v in found
            if v["impact"] in ("serious", "critical")]


def _links(page, origin: str) -> list[str]:
    hrefs = page.evaluate("Array.from(document.querySelectorAll('a[href]'), a => a.href)")
    return [urldefrag(href)[0] for href in hrefs if href.startswith(origin + "/t/demo/")]


def test_every_console_page_passes_axe_and_the_phone_layout_works(toolkeeper_server):  # noqa: F811
    chromium_or_skip()
    axe = _axe_or_skip()
    from playwright.sync_api import expect

    server = toolkeeper_server
    _pending_request(server)
    problems, visited, shapes = {}, [], set()
    with chromium_context(server.url, step_ms=STEP_MS) as (context, csp):
        page = context.new_page()
        log_in(page, server, "/t/demo/")  # the demo operator, an admin of the tenant
        queue = [page.url]
        while queue and len(visited) < MAX_PAGES:
            url = queue.pop(0)
            shape = SHAPE.sub("/N/", urlsplit(url).path)
            if shape in shapes or SKIP.search(urlsplit(url).path):
                continue
            shapes.add(shape)
            response = page.goto(url)
            assert response.status == 200, (url, response.status)
            visited.append(url)
            found = _violations(page, axe)
            if found:
                problems[urlsplit(url).path] = found
            queue += _links(page, server.url)
        csp.assert_clean()
        assert not problems, "axe found serious or critical violations:\n" + "\n".join(
            f"{path}\n  " + "\n  ".join(found) for path, found in problems.items())
        paths = {urlsplit(url).path for url in visited}
        for expected in ("/t/demo/", "/t/demo/activity/", "/t/demo/tools/", "/t/demo/inbox/", "/t/demo/rules/",
                         "/t/demo/keys/", "/t/demo/knowledge/", "/t/demo/skills/", "/t/demo/sessions/",
                         "/t/demo/calls/"):
            assert expected in paths, (expected, sorted(paths))
        assert any(re.fullmatch(r"/t/demo/inbox/\d+/", path) for path in paths), sorted(paths)
        assert len(visited) >= 30, sorted(paths)

    # A form refused says so at the top, with a link to each field to fix, and marks the field; a new key's
    # secret has a copy button.
    with chromium_context(server.url, step_ms=STEP_MS) as (context, csp):
        context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)
        page = context.new_page()
        log_in(page, server, "/t/demo/keys/new/")
        page.fill("#id_name", "copy check")
        page.get_by_role("button", name="Create key").click()  # no scope chosen
        summary = page.locator("#error-summary")
        expect(summary).to_contain_text("Nothing was saved: 1 thing to fix")
        expect(summary.locator("a[href='#id_scopes']")).to_have_text("Scopes")
        expect(page.locator(".invalid")).to_have_count(1)
        assert not _violations(page, axe)
        page.locator("input[name=scopes][value=agent]").check()
        page.get_by_role("button", name="Create key").click()
        secret = page.locator("#new-api-key").inner_text().strip()
        assert secret.startswith("tk_")
        page.locator("#copy-key").click()
        expect(page.locator("#copy-key")).to_have_text("Copied")
        assert page.evaluate("navigator.clipboard.readText()") == secret
        csp.assert_clean()

    # At phone width the navigation is a menu, and the request's decide bar is on screen at once.
    with chromium_context(server.url, step_ms=STEP_MS, width=390, height=740) as (context, csp):
        page = context.new_page()
        log_in(page, server, "/t/demo/inbox/", who="reviewer")
        nav = page.locator("header.top nav")
        expect(nav).to_be_hidden()
        page.locator("#menu-toggle").click()
        expect(nav).to_be_visible()
        page.locator("#requests tr[data-href] a").first.click()
        page.wait_for_url(re.compile(r"/t/demo/inbox/\d+/$"))
        for button in ("#decide-approve", "#decide-reject"):
            expect(page.locator(button)).to_be_in_viewport()
        assert not _violations(page, axe)
        page.screenshot(path="/tmp/request-phone.png")
        csp.assert_clean()
