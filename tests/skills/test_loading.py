"""Skills as a session sees them: the platform's are off until enabled, an upload is a new version, loading
SKILL.md switches on the skill's groups in that session only, resources are read by path, and another
tenant's skills are never seen."""
import base64
import io
import zipfile

import pytest

from audit.models import Event
from skills.models import Skill
from tools.calls.submit import calls_submit
from tools.catalog.selectors import session_prompt, session_tools
from tools.catalog.services import session_create
from tools.models import ToolGroup

pytestmark = pytest.mark.django_db

SKILL_MD = """---
name: {name}
description: {description}
allowed-tools: countdown
---
# {name}

Count down before you launch.
"""


def skill_files(name="launch-check", description="Checks before a launch.", body_extra="") -> dict:
    return {"SKILL.md": SKILL_MD.format(name=name, description=description) + body_extra,
            "notes/checklist.md": "1. fuel\n2. weather\n"}


def upload(client, files=None, archive=None):
    body = {"archive": base64.b64encode(archive).decode()} if archive is not None else {"files": files}
    return client.post("/api/v1/skills", body, format="json")


def load(session, skill: str, path: str):
    [call] = calls_submit(session=session, calls=[
        {"name": "load_skill_through_path", "input": {"skillId": skill, "path": path}}])
    return call


def names(session) -> list[str]:
    return [tool["name"] for tool in session_tools(session, "mcp")]


def test_platform_skills_are_in_every_tenant_and_off_until_enabled(world):
    platform = Skill.objects.for_tenant(world.a.tenant).filter(source="platform")
    assert platform.count() >= 2
    session = session_create(tenant=world.a.tenant, agent="support-bot")
    assert "load_skill_through_path" not in names(session)
    skill = platform.order_by("name").first()
    response = world.a.client("admin").patch(f"/api/v1/skills/{skill.pk}", {"enabled": True}, format="json")
    assert response.status_code == 200, response.content
    session = session_create(tenant=world.a.tenant, agent="support-bot")
    assert "load_skill_through_path" in names(session)
    assert f"- {skill.name}: {skill.description}" in session_prompt(session)
    assert "load_skill_through_path" not in names(session_create(tenant=world.b.tenant, agent="support-bot"))


def test_loading_a_skill_switches_its_groups_on_in_that_session_only(world):
    response = upload(world.a.client("admin"), skill_files())
    assert response.status_code == 201, response.content
    assert response.json()["current_version"] == 1
    ToolGroup.objects.for_tenant(world.a.tenant).filter(name="ops").update(skill_ref="launch-check")
    loading = session_create(tenant=world.a.tenant, agent="support-bot")
    other = session_create(tenant=world.a.tenant, agent="support-bot")
    assert "countdown" not in names(loading)

    call = load(loading, "launch-check", "SKILL.md")
    assert call.status == "succeeded", call.error
    assert "Count down before you launch." in call.result["structured"]["content"]
    assert call.result["structured"]["resources"] == ["notes/checklist.md"]
    loading.refresh_from_db()
    assert "countdown" in names(loading)
    assert "countdown" not in names(other)
    [loaded] = loading.loaded_skills
    assert (loaded["skill"], loaded["version"]) == ("launch-check", 1)
    assert Event.objects.for_tenant(world.a.tenant).filter(verb="skill.loaded").count() == 1


def test_resources_are_read_by_path_and_the_rules_refuse_the_rest(world):
    assert upload(world.a.client("admin"), skill_files()).status_code == 201
    session = session_create(tenant=world.a.tenant, agent="support-bot")
    read = load(session, "launch-check", "notes\\checklist.md")  # backslashes become slashes
    assert read.status == "succeeded", read.error
    assert read.result["structured"]["content"] == "1. fuel\n2. weather\n"
    for refused in ("../SKILL.md", "/SKILL.md", ".", "./", "notes"):
        call = load(session, "launch-check", refused)
        assert call.status == "failed" and call.error["errorType"] == "InvalidPath", (refused, call.error)
    miss = load(session, "launch-check", "notes/missing.md")
    assert miss.status == "failed" and miss.error["errorType"] == "NotFound"
    assert "SKILL.md" in miss.error["error"] and "notes/checklist.md" in miss.error["error"]
    unknown = load(session, "no-such-skill", "SKILL.md")
    assert unknown.status == "failed"


def test_a_binary_resource_comes_as_base64(world):
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as package:
        for path, text in skill_files().items():
            package.writestr(f"launch-check/{path}", text)
        package.writestr("launch-check/assets/logo.png", b"\x89PNG\r\n\x1a\n\x00\xff")
    assert upload(world.a.client("admin"), archive=archive.getvalue()).status_code == 201
    session = session_create(tenant=world.a.tenant, agent="support-bot")
    read = load(session, "launch-check", "assets/logo.png")
    assert read.result["structured"]["encoding"] == "base64"
    assert base64.b64decode(read.result["structured"]["content"]) == b"\x89PNG\r\n\x1a\n\x00\xff"


def test_a_session_keeps_the_version_it_loaded(world):
    client = world.a.client("admin")
    assert upload(client, skill_files()).status_code == 201
    early = session_create(tenant=world.a.tenant, agent="support-bot")
    assert load(early, "launch-check", "SKILL.md").status == "succeeded"
    again = upload(client, skill_files(body_extra="\nThen check the weather twice.\n"))
    assert again.status_code == 201 and again.json()["current_version"] == 2
    same = upload(client, skill_files(body_extra="\nThen check the weather twice.\n"))
    assert same.json()["current_version"] == 2  # the same files are no new version

    early.refresh_from_db()
    kept = load(early, "launch-check", "SKILL.md").result["structured"]
    assert kept["version"] == 1 and "twice" not in kept["content"]
    late = session_create(tenant=world.a.tenant, agent="support-bot")
    fresh = load(late, "launch-check", "SKILL.md").result["structured"]
    assert fresh["version"] == 2 and "twice" in fresh["content"]


def test_agents_limit_who_sees_a_skill(world):
    response = upload(world.a.client("admin"), skill_files())
    skill_id = response.json()["id"]
    patched = world.a.client("admin").patch(f"/api/v1/skills/{skill_id}", {"agents": ["ops-bot"]}, format="json")
    assert patched.status_code == 200 and patched.json()["agents"] == ["ops-bot"]
    assert "load_skill_through_path" not in names(session_create(tenant=world.a.tenant, agent="support-bot"))
    assert "load_skill_through_path" in names(session_create(tenant=world.a.tenant, agent="ops-bot"))


def test_another_tenant_neither_lists_nor_loads_a_tenants_skills(world):
    response = upload(world.a.client("admin"), skill_files(name="acme-secret", description="Acme only."))
    skill_id = response.json()["id"]
    b_admin = world.b.client("admin")
    assert "acme-secret" not in [skill["name"] for skill in b_admin.get("/api/v1/skills").json()["results"]]
    assert b_admin.get(f"/api/v1/skills/{skill_id}").status_code == 404
    assert b_admin.patch(f"/api/v1/skills/{skill_id}", {"enabled": False}, format="json").status_code == 404
    b_session = session_create(tenant=world.b.tenant, agent="support-bot")
    assert load(b_session, "acme-secret", "SKILL.md").status == "failed"


def test_a_bad_package_is_refused_with_every_problem_and_nothing_stored(world):
    files = {"SKILL.md": "---\nname: Bad Name\ndescription: ''\nauthor: me\n---\nbody\n", "../evil.md": "x"}
    response = upload(world.a.client("admin"), files)
    assert response.status_code == 400, response.content
    problems = " ".join(str(p) for p in response.json()["error"]["fields"]["package"])
    assert "name" in problems and "description" in problems and ".." in problems
    assert not Skill.objects.for_tenant(world.a.tenant).filter(source="tenant").exists()
    assert world.a.client("agent").post("/api/v1/skills", {"files": skill_files()}, format="json").status_code == 403


def test_listing_the_skills_files_as_resources_takes_one_query_whatever_the_number_of_skills(world):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from skills.mcp_resources import SkillResources

    client = world.a.client("admin")
    session = session_create(tenant=world.a.tenant, agent="support-bot")

    def listed_with_queries():
        warm = SkillResources().resources(session)  # fills the per-process snapshot
        with CaptureQueriesContext(connection) as queries:
            listed = SkillResources().resources(session)
        assert listed == warm
        return listed, len(queries)

    assert upload(client, skill_files()).status_code == 201
    one, one_queries = listed_with_queries()
    assert upload(client, skill_files(name="second-check", description="Another.")).status_code == 201
    two, two_queries = listed_with_queries()
    assert {r["uri"] for r in one} < {r["uri"] for r in two}
    assert "skill://second-check/notes/checklist.md" in {r["uri"] for r in two}
    assert two_queries == one_queries <= 2  # the catalog version, the files


def test_reset_tools_reports_the_groups_a_loaded_skill_keeps_on(world):
    """A model that switches off a group a loaded skill switched on is told it stays on, and why; the answer's
    active groups are the ones the session sees (docs/governance.md)."""
    assert upload(world.a.client("admin"), skill_files()).status_code == 201
    ToolGroup.objects.for_tenant(world.a.tenant).filter(name="ops").update(skill_ref="launch-check")
    session = session_create(tenant=world.a.tenant, agent="support-bot")
    assert load(session, "launch-check", "SKILL.md").status == "succeeded"
    session.refresh_from_db()
    assert "countdown" in names(session)

    [call] = calls_submit(session=session, calls=[{"name": "reset_tools", "input": {"ops": False}}])
    assert call.status == "succeeded", call.error
    answer = call.result["structured"]
    session.refresh_from_db()
    assert "countdown" in names(session)  # the skill's group stays on
    assert answer["active_groups"] == ["ops"]
    assert answer["deactivated"] == [] and answer["activated"] == []
    assert list(answer["kept_on"]) == ["ops"] and "launch-check" in answer["kept_on"]["ops"]
    assert "launch-check" in call.result["content"][0]["text"]  # what the model reads says so too

    [call] = calls_submit(session=session, calls=[{"name": "reset_tools", "input": {"math": True, "ops": True}}])
    answer = call.result["structured"]
    assert answer["active_groups"] == ["math", "ops"]
    assert answer["activated"] == ["math"] and answer["kept_on"] == {}  # ops was on already; chosen now
    session.refresh_from_db()
    assert {"calculate", "countdown"} <= set(names(session))

    [call] = calls_submit(session=session, calls=[{"name": "reset_tools", "input": {}}])
    answer = call.result["structured"]
    assert answer["active_groups"] == ["ops"] and answer["deactivated"] == ["math"]
    assert list(answer["kept_on"]) == ["ops"]
    session.refresh_from_db()
    assert "calculate" not in names(session) and "countdown" in names(session)

    other = session_create(tenant=world.a.tenant, agent="support-bot")  # no skill loaded: ops goes off
    calls_submit(session=other, calls=[{"name": "reset_tools", "input": {"ops": True}}])
    [call] = calls_submit(session=other, calls=[{"name": "reset_tools", "input": {"ops": False}}])
    answer = call.result["structured"]
    assert answer["active_groups"] == [] and answer["deactivated"] == ["ops"] and answer["kept_on"] == {}
    other.refresh_from_db()
    assert "countdown" not in names(other)
