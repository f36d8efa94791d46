"""In Chromium: Swagger UI at /api/docs/ shows the API's operations under its Content-Security-Policy.

The page is drf-spectacular's, served from the sidecar package's files by a real daphne process (the live
tests' `toolkeeper_server`); its start-up script is a file of its own, so no inline script runs.
"""
import pytest

from tests.browser import chromium_context, chromium_or_skip
from tests.live.conftest import toolkeeper_server  # noqa: F401 (the live server fixture, reused)

pytestmark = [pytest.mark.browser, pytest.mark.live]

STEP_MS = 20_000  # bound on each browser step


def test_swagger_ui_lists_the_operations_under_its_policy(toolkeeper_server):  # noqa: F811 (the imported fixture)
    chromium_or_skip()
    from playwright.sync_api import expect

    server = toolkeeper_server
    with chromium_context(server.url, step_ms=STEP_MS) as (context, csp):
        page = context.new_page()
        page.goto(f"{server.url}/api/docs/")
        operation = page.locator(".opblock-summary-path", has_text="/api/v1/sessions/{session_id}/calls")
        expect(operation.first).to_be_visible()
        expect(page.locator(".opblock")).not_to_have_count(0)
        page.screenshot(path="/tmp/swagger.png")
        csp.assert_clean()
        assert "'unsafe-eval'" not in csp.documents[f"{server.url}/api/docs/"]
