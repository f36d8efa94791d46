"""HTML pages carry a Content-Security-Policy: scripts and styles from this server only (inline blocks by a
nonce per response), sockets to this host, no framing, no plugins, no foreign base URL.

The browser tests (tests/console/test_live_browser.py, tests/approvals/test_inbox_browser.py,
tests/api/test_swagger_browser.py) show that the pages work under it: Chromium reports no violation.
"""
import re
from pathlib import Path

import pytest
from django.test import Client

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
TAG = re.compile(r"<(script|style)\b([^>]*)>", re.IGNORECASE)


def directives(response) -> dict[str, str]:
    policy = response["Content-Security-Policy"]
    return {part.split()[0]: " ".join(part.split()[1:]) for part in policy.split(";") if part.strip()}


def assert_console_policy(response) -> None:
    assert response.status_code == 200
    policy = directives(response)
    nonce = re.fullmatch(r"'self' 'nonce-([\w-]{16,})'", policy["script-src"]).group(1)
    assert policy["style-src"] == f"'self' 'nonce-{nonce}'"
    assert policy["default-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'"
    assert policy["object-src"] == "'none'"
    assert policy["base-uri"] == "'self'"
    assert policy["connect-src"] == "'self' ws://testserver wss://testserver"
    assert "unsafe-inline" not in response["Content-Security-Policy"]
    assert "unsafe-eval" not in response["Content-Security-Policy"]
    tags = TAG.findall(response.content.decode())
    assert tags, "the page has no script or style at all"
    for name, attributes in tags:
        assert f'nonce="{nonce}"' in attributes or "src=" in attributes, f"<{name}{attributes}> would be refused"


def test_the_login_page_has_the_policy(db):
    assert_console_policy(Client().get("/login/"))


@pytest.mark.parametrize("path", ["/t/acme/", "/t/acme/calls/", "/t/acme/inbox/", "/t/acme/rules/",
                                  "/t/acme/knowledge/", "/t/acme/tools/"])
def test_console_pages_have_the_policy(world, path):
    assert_console_policy(world.a.console("admin").get(path))


def test_each_response_has_its_own_nonce(world):
    client = world.a.console("admin")
    first, second = (directives(client.get("/t/acme/"))["script-src"] for _ in range(2))
    assert first != second


def test_swagger_ui_has_a_policy_of_its_own_and_no_inline_script(db):
    response = Client().get("/api/docs/")
    policy = directives(response)
    assert policy["script-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'" and policy["object-src"] == "'none'"
    scripts = re.findall(r"<script\b([^>]*)>", response.content.decode())
    assert scripts and all("src=" in attributes for attributes in scripts)
    start_up = Client().get("/api/docs/?script=")
    assert start_up.status_code == 200 and "SwaggerUIBundle" in start_up.content.decode()


def test_json_answers_carry_no_page_policy(world):
    response = world.a.client("admin").get("/api/v1/tools")
    assert response.status_code == 200 and "Content-Security-Policy" not in response


def test_templates_use_no_inline_handlers_or_style_attributes():
    """The live client swaps fetched parts into pages, where such attributes would be refused as well."""
    offenders = []
    for template in TEMPLATES.rglob("*.html"):
        text = template.read_text()
        for pattern in (r"\sstyle\s*=", r"\son[a-z]+\s*=", r"javascript:"):
            offenders += [f"{template.relative_to(TEMPLATES)}: {m.group(0)}" for m in re.finditer(pattern, text)]
        for name, attributes in TAG.findall(text):
            if "src=" not in attributes and 'nonce="{{ request.csp_nonce }}"' not in attributes:
                offenders.append(f"{template.relative_to(TEMPLATES)}: <{name}{attributes}> without the nonce")
    assert not offenders, offenders
