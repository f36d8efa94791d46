"""In Chromium: an operator uploads a skill (a zip built here, then a folder), binds the `ops` group to it, and
watches a session's page show the skill once the agent loads it — the group's `countdown` on the session's
surface from then on.

The server is a real daphne process (the live tests' `toolkeeper_server`: embedded mode, SQLite, the
in-process channel layer, the local executor, the demo tenant). The agent speaks the public API with httpx
and the demo API key; the operator is Playwright driving Debian's Chromium (/usr/bin/chromium). Every wait
is bounded; nothing is timed.
"""
import io
import re
import zipfile

import httpx
import pytest

from tests.browser import chromium_context, chromium_or_skip, log_in
from tests.live.conftest import toolkeeper_server  # noqa: F401 (the live server fixture, reused)

# django_db although the test reads nothing from the test database: run alone, without it no test database
# is set up and tests/conftest.py's session teardown (_close_stray_connections) fails to connect.
pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.django_db]

STEP_MS = 20_000  # bound on each browser step
SKILL = "launch-check"
SKILL_MD = f"""---
name: {SKILL}
description: Checks before a launch; counts down with the ops group's countdown.
allowed-tools: countdown
---
# Launch check

1. Read `notes/checklist.md`.
2. Count down with `countdown` before you launch.
"""
FOLDER_SKILL = "preflight-notes"


def _skill_zip() -> bytes:
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"{SKILL}/SKILL.md", SKILL_MD)
        archive.writestr(f"{SKILL}/notes/checklist.md", "1. fuel\n2. weather\n")
    return data.getvalue()


def _skill_folder(base):
    folder = base / FOLDER_SKILL
    (folder / "notes" / "deep").mkdir(parents=True)
    (folder / "SKILL.md").write_text(f"---\nname: {FOLDER_SKILL}\ndescription: Notes for a preflight.\n---\n"
                                     "# Preflight\n\nRead the notes.\n")
    (folder / "notes" / "deep" / "weather.md").write_text("Check the wind.\n")
    return folder


def _tool_names(app, session_id: str) -> list[str]:
    response = app.get(f"/api/v1/sessions/{session_id}/tools", params={"format": "mcp"})
    assert response.status_code == 200, response.text
    return [tool["name"] for tool in response.json()["tools"]]


def test_an_operator_uploads_a_skill_binds_a_group_and_watches_a_session_load_it(
        toolkeeper_server, tmp_path):  # noqa: F811 (the imported fixture)
    chromium_or_skip()
    from playwright.sync_api import expect

    server = toolkeeper_server
    with (chromium_context(server.url, step_ms=STEP_MS, height=1100) as (context, csp),
          httpx.Client(base_url=server.url, headers=server.headers(), timeout=30) as app):
        page = context.new_page()
        log_in(page, server, "/t/demo/skills/")
        expect(page.locator("header.top nav a.on")).to_have_text("Skills")
        expect(page.locator('#skills tr[data-skill="incident-triage"]')).to_contain_text("platform")

        # A zip built here, uploaded through the form: the skill's page, version 1.
        page.set_input_files("#id_archive", files=[
            {"name": f"{SKILL}.zip", "mimeType": "application/zip", "buffer": _skill_zip()}])
        page.click("#skill-upload button[type=submit]")
        page.wait_for_url("**/t/demo/skills/*/")
        expect(page.locator(".messages")).to_contain_text(f"{SKILL}: version 1 stored (2 files)")
        expect(page.locator("h1")).to_contain_text(SKILL)
        expect(page.locator("#skill-body h3")).to_have_text("Launch check")
        expect(page.locator("#skill-body ol li")).to_have_count(2)
        expect(page.locator("#allowed-tools")).to_contain_text("grants no permission")
        expect(page.locator("#files")).to_contain_text("checklist.md")
        skill_page = page.url

        # Bind the ops group (countdown) to it.
        page.select_option("#id_group", label="ops")
        page.click("#bind-group button[type=submit]")
        page.wait_for_url(skill_page)
        expect(page.locator("#bound-groups")).to_have_text("ops")
        page.screenshot(path="/tmp/skill_page.png", full_page=True)

        # A folder upload: the page's script sends each file's path inside the folder.
        page.goto(f"{server.url}/t/demo/skills/")
        page.set_input_files("#id_files", _skill_folder(tmp_path))
        expect(page.locator("#skill-upload input[name=paths]")).to_have_count(2)
        page.click("#skill-upload button[type=submit]")
        page.wait_for_url("**/t/demo/skills/*/")
        expect(page.locator(".messages")).to_contain_text(f"{FOLDER_SKILL}: version 1 stored (2 files)")
        expect(page.locator("#files td.d2")).to_have_text("weather.md")  # notes/deep/weather.md

        # An agent's session, before it loads the skill: no countdown, no skill on its page.
        session = app.post("/api/v1/sessions", json={"agent": "ops-bot", "user": "alice@example.com"})
        assert session.status_code == 201, session.text
        session_id = session.json()["id"]
        assert "load_skill_through_path" in _tool_names(app, session_id)
        assert "countdown" not in _tool_names(app, session_id)
        page.goto(f"{server.url}/t/demo/sessions/{session_id}/")
        expect(page.locator("#live-indicator")).to_have_text("live")
        expect(page.locator("#session-skills")).to_have_text("none")
        page.evaluate("window.__sameDocument = true")

        # The agent loads it; the page shows it without a reload, with the skill's group on.
        loaded = app.post(f"/api/v1/sessions/{session_id}/calls", json={
            "id": "call_skill", "name": "load_skill_through_path", "input": {"skillId": SKILL, "path": "SKILL.md"},
            "wait": 10})
        assert loaded.status_code == 200, loaded.text
        call = loaded.json()["calls"][0]
        assert call["status"] == "succeeded", call
        expect(page.locator(f'#session-skills [data-skill="{SKILL}"]')).to_have_text(f"{SKILL} v1")
        expect(page.locator("#session-skills time")).to_have_count(1)
        facts = page.locator('[data-live-region="session-facts"]')
        expect(facts.locator(".tag", has_text=re.compile(r"^ops$"))).to_have_count(1)  # the group the skill brings
        assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"
        assert "countdown" in _tool_names(app, session_id)
        page.screenshot(path="/tmp/skill_session.png", full_page=True)

        # Its link opens the version the session loaded.
        page.click(f'#session-skills [data-skill="{SKILL}"] a')
        page.wait_for_url("**/t/demo/skills/*/?version=1")
        expect(page.locator("h1")).to_contain_text(SKILL)
        csp.assert_clean()
