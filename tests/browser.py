"""Debian's Chromium for the browser tests, driven by Playwright (docs/notes/structure-and-testing.md)."""
import contextlib
import os
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
# No background traffic: this machine's network is closed, and the tests must not wait on it.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]


def chromium_or_skip() -> None:
    """Skip when Chromium or Playwright is missing; with TOOLKEEPER_REQUIRE_SERVICES=1, fail instead."""
    problem = None
    if not CHROMIUM.exists():
        problem = f"{CHROMIUM} is not installed (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            problem = "the playwright package is not installed"
    if problem:
        if os.environ.get("TOOLKEEPER_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{problem}, and TOOLKEEPER_REQUIRE_SERVICES=1")
        pytest.skip(problem)


class CspWatch:
    """What Chromium says about the Content-Security-Policy on every page of a browser context.

    `violations`: the console's reports of anything the policy refused (a script, a style, a socket).
    `documents`: each page loaded from the server, with the policy it came with. Together they prove the
    console ran under its policy and the policy refused nothing it needs.
    """

    def __init__(self, context, origin: str):
        self.origin = origin
        self.violations: list[str] = []
        self.documents: dict[str, str] = {}
        context.on("console", self._console)
        context.on("response", self._response)

    def _console(self, message) -> None:
        if "Content Security Policy" in message.text or "Content-Security-Policy" in message.text:
            self.violations.append(message.text)

    def _response(self, response) -> None:
        if response.request.resource_type == "document" and response.url.startswith(self.origin):
            self.documents[response.url] = response.headers.get("content-security-policy", "")

    def assert_clean(self) -> None:
        assert not self.violations, "the Content-Security-Policy refused:\n" + "\n".join(self.violations)
        assert self.documents, "no page was loaded"
        unprotected = [url for url, policy in self.documents.items() if "script-src" not in policy]
        assert not unprotected, f"pages without a Content-Security-Policy: {unprotected}"


@contextlib.contextmanager
def chromium_context(origin: str, *, step_ms: int, height: int = 900, width: int = 1280):
    """A browser context of a fresh Chromium, every step bounded by `step_ms`, and the CspWatch of its pages."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": width, "height": height})
            context.set_default_timeout(step_ms)
            expect.set_options(timeout=step_ms)
            yield context, CspWatch(context, origin)
        finally:
            browser.close()


def log_in(page, server, path: str, who: str = "operator") -> None:
    """Open `path` on a live server as a demo member (`server.credentials[who]`), through the login page it
    redirects to."""
    member = server.credentials[who]
    page.goto(f"{server.url}{path}")
    page.wait_for_url("**/login/**")
    page.fill("#id_username", member["username"])
    page.fill("#id_password", member["password"])
    page.click("button[type=submit]")
    page.wait_for_url(f"**{path}")
