"""In Chromium, wiring at scale in the demo tenant with 500 more tools: the group editor filters by source and
name and selects what it shows; an HTTP tool's page adds it to a group and tries it with an input, through the
governed path, against a real HTTP server; the call's page marks the operator's test; axe-core passes."""
import json

import pytest

from tests.browser import chromium_context, chromium_or_skip, log_in
from tests.console.test_a11y_browser import _axe_or_skip, _violations
from tests.live.server import LiveServer
from tests.tools.http_endpoint import serve

pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.django_db]

STEP_MS = 20_000
SEED = """
from tenancy.models import Tenant
from tools.http_tools.services import http_tool_create
from tools.models import McpServer, Tool

demo = Tenant.objects.get(slug="demo")
docs = McpServer.objects.create(tenant=demo, name="docs", transport="streamable_http",
                                url="https://93.184.215.14/mcp", enabled=False)
Tool.objects.bulk_create(
    [Tool(tenant=demo, name=f"mcp__docs__page_{n}", source="mcp", mcp_server=docs, source_ref=f"page_{n}",
          description=f"page {n} of the docs", input_schema={"type": "object"}) for n in range(40)]
    + [Tool(tenant=demo, name=f"crm_{n}", source="external", description=f"CRM step {n}",
            input_schema={"type": "object"}) for n in range(460)])
http_tool_create(tenant=demo, name="issue_lookup", description="An issue of a repository",
                 input_schema={"type": "object", "properties": {"repo": {"type": "string"}}, "required": ["repo"]},
                 method="GET", url=ENDPOINT + "/echo/{repo}/issues")
print(Tool.objects.for_tenant(demo).count())
"""


@pytest.fixture(scope="module")
def endpoint():
    yield from serve()


@pytest.fixture(scope="module")
def wired_server(endpoint):
    with LiveServer(extra_env={"TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS": "127.0.0.1"}) as server:
        count = int(server.manage("shell", "-c", f"ENDPOINT = {endpoint.url!r}\n" + SEED).split()[-1])
        assert count > 500
        yield server
        print(f"--- server log ---\n{server.log_tail(20000)}")


def test_a_group_is_wired_from_500_tools_and_an_http_tool_is_tried(wired_server, endpoint):
    chromium_or_skip()
    axe = _axe_or_skip()
    from playwright.sync_api import expect

    server = wired_server
    with chromium_context(server.url, step_ms=STEP_MS) as (context, csp):
        page = context.new_page()
        log_in(page, server, "/t/demo/groups/new/")
        page.fill("#id_name", "docs-pages")
        count = page.locator("[data-picker-count]")
        expect(count).to_contain_text("0 of ")
        page.select_option("[data-picker-source]", "mcp:docs")
        page.fill("[data-picker-name]", "page_1")  # page_1, page_10 … page_19
        expect(page.locator("[data-tool-row]:visible")).to_have_count(11)
        page.get_by_role("button", name="Select the shown").click()
        expect(count).to_contain_text("11 of ")
        page.fill("[data-picker-name]", "")
        page.select_option("[data-picker-source]", "")
        page.check("[data-picker-selected]")
        expect(page.locator("[data-tool-row]:visible")).to_have_count(11)
        page.press("[data-picker-name]", "Enter")  # filtering never submits the form
        expect(page).to_have_url(f"{server.url}/t/demo/groups/new/")
        assert not _violations(page, axe)
        page.get_by_role("button", name="Create").click()
        page.wait_for_url("**/t/demo/groups/")
        row = page.locator("tr", has_text="docs-pages")
        expect(row).to_contain_text("mcp__docs__page_19")
        expect(row).not_to_contain_text("mcp__docs__page_2")

        # The HTTP tool's page: into the always-active group, then tried as support-bot.
        page.goto(f"{server.url}/t/demo/tools/")
        page.get_by_role("link", name="issue_lookup", exact=True).click()
        page.select_option("#id_group", label="basic")
        page.get_by_role("button", name="Add", exact=True).click()
        expect(page.locator(".messages")).to_contain_text("1 tool added to the group basic.")
        page.locator("#try-tool").click()
        page.fill("#id_agent", "support-bot")
        page.fill("#id_input", json.dumps({"repo": "toolkeeper"}))
        assert not _violations(page, axe)
        page.get_by_role("button", name="Run the test call").click()
        page.wait_for_url("**/t/demo/calls/*/")
        expect(page.locator("[data-call-status]").first).to_have_text("succeeded")
        expect(page.locator("#operator-test")).to_contain_text("an operator's test: operator")
        expect(page.locator("main")).to_contain_text("/echo/toolkeeper/issues")
        csp.assert_clean()
    assert [(sent.method, sent.path) for sent in endpoint.received] == [("GET", "/echo/toolkeeper/issues")]


PHONE_PAGES = ["/t/demo/", "/t/demo/inbox/", "/t/demo/inbox/history/", "/t/demo/inbox/notifications/",
               "/t/demo/calls/", "/t/demo/sessions/", "/t/demo/tools/", "/t/demo/groups/new/", "/t/demo/audit/",
               "/t/demo/settings/", "/t/demo/members/", "/t/demo/queues/", "/t/demo/search/?q=crm_1"]
WIDER_THAN_THE_SCREEN = """() => [document.documentElement.scrollWidth, window.innerWidth,
    Array.from(document.querySelectorAll("main *")).filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
      .slice(0, 3).map(e => e.tagName + (e.id ? "#" + e.id : "") + "." + e.className)]"""


def test_on_a_phone_no_page_scrolls_sideways_and_cards_name_their_cells(wired_server):
    chromium_or_skip()
    from playwright.sync_api import expect

    server = wired_server
    with chromium_context(server.url, step_ms=STEP_MS, width=390, height=844) as (context, csp):
        page = context.new_page()
        log_in(page, server, "/t/demo/")
        for path in PHONE_PAGES:
            page.goto(server.url + path)
            expect(page.locator("main")).to_be_visible()
            scroll_width, screen, wide = page.evaluate(WIDER_THAN_THE_SCREEN)
            assert scroll_width <= screen, (path, scroll_width, wide)
        page.goto(server.url + "/t/demo/calls/")
        cell = page.locator("table.calls tbody tr td").first
        expect(cell).to_have_attribute("data-label", "Created")
        assert page.evaluate("getComputedStyle(document.querySelector('table.calls tbody td'), '::before').content") \
            == '"Created"'
        # Links in code keep their underscores clear of the underline.
        assert page.evaluate("getComputedStyle(document.querySelector('main a')).textUnderlineOffset") != "auto"
        csp.assert_clean()
