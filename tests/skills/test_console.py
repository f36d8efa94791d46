"""Console pages of skills: the list, uploads (zip or folder; every problem shown, nothing stored on error),
a skill's page (front matter, body as text, files, versions), exposure, bound groups, roles, other tenants,
and the skills a session loaded on its page."""
import io
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils.html import escape

from audit.models import Event
from skills.archives import package_from_zip
from skills.models import Skill, SkillFile, SkillVersion
from skills.packages import PackageProblems
from skills.services import skill_upload
from skills.views import body_blocks, file_tree
from tools.calls.submit import calls_submit
from tools.catalog.selectors import session_tools
from tools.catalog.services import session_create
from tools.models import ToolGroup

pytestmark = pytest.mark.django_db

SKILL_MD = """---
name: {name}
description: {description}
license: Apache-2.0
compatibility: Toolkeeper sessions with the ops group.
metadata:
  author: acme-ops
allowed-tools: countdown no_such_tool
---
# Launch check

Count down with `countdown` before you launch.
{extra}"""


def skill_files(name="launch-check", description="Checks before a launch.", extra="", **more) -> dict:
    return {"SKILL.md": SKILL_MD.format(name=name, description=description, extra=extra),
            "notes/checklist.md": "1. fuel\n2. weather\n", **more}


def zip_of(files: dict, folder: str | None = "launch-check") -> bytes:
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as archive:
        for path, content in files.items():
            archive.writestr(f"{folder}/{path}" if folder else path, content)
    return data.getvalue()


def url(name, tenant="acme", **kwargs):
    return reverse(f"skills:{name}", kwargs={"tenant": tenant, **kwargs})


def upload_zip(client, data: bytes, tenant="acme"):
    return client.post(url("skill_list", tenant=tenant),
                       {"archive": SimpleUploadedFile("skill.zip", data, content_type="application/zip")})


def tenant_skills(tw):
    return Skill.objects.for_tenant(tw.tenant).filter(source="tenant")


def uploaded(tw, files=None, name="launch-check") -> Skill:
    skill_upload(tenant=tw.tenant, package=package_from_zip(zip_of(files or skill_files(name=name), folder=name)))
    return Skill.objects.for_tenant(tw.tenant).get(name=name)


# --- the list -----------------------------------------------------------------------------------------

def test_the_list_shows_the_tenants_skills_only(world):
    mine = uploaded(world.a, name="acme-launch")
    uploaded(world.b, skill_files(name="globex-secret", description="Globex only."), name="globex-secret")
    ToolGroup.objects.for_tenant(world.a.tenant).filter(name="ops").update(skill_ref="acme-launch")
    response = world.a.console("viewer").get(url("skill_list"))
    assert response.status_code == 200
    page = response.content.decode()
    assert "acme-launch" in page and "globex-secret" not in page and "Globex only." not in page
    assert reverse("skills:skill_detail", kwargs={"tenant": "acme", "skill_id": mine.pk}) in page
    for platform in Skill.objects.for_tenant(world.a.tenant).filter(source="platform"):
        assert platform.name in page
    row = page[page.index('data-skill="acme-launch"'):]
    row = row[:row.index("</tr>")]
    assert "tenant" in row and "v1" in row and "every agent" in row and ">ops</a>" in row
    assert "Checks before a launch." in row
    assert 'href="/t/acme/skills/"' in page  # the navigation's Skills link
    assert 'name="archive"' not in page  # viewers cannot upload


# --- uploads ------------------------------------------------------------------------------------------

def test_uploading_a_good_zip_creates_a_skill_and_its_first_version(world):
    client = world.a.console("operator")
    response = upload_zip(client, zip_of(skill_files()))
    skill = tenant_skills(world.a).get(name="launch-check")
    assert response.status_code == 302
    assert response["Location"] == url("skill_detail", skill_id=skill.pk)
    version = SkillVersion.objects.for_tenant(world.a.tenant).get(skill=skill)
    assert version.number == 1 and skill.current_version == 1
    assert version.created_by == world.a.users["operator"].username
    assert sorted(SkillFile.objects.for_tenant(world.a.tenant).filter(version=version).values_list("path", flat=True)) \
        == ["SKILL.md", "notes/checklist.md"]
    page = client.get(response["Location"]).content.decode()
    assert "launch-check: version 1 stored (2 files)" in page
    assert Event.objects.for_tenant(world.a.tenant).filter(verb="skill.uploaded").count() == 1


def test_a_bad_zip_shows_every_problem_and_stores_nothing(world):
    bad = zip_of({"SKILL.md": "---\nname: Bad_Name\ndescription: ''\nauthor: me\n---\nbody\n", "../evil.md": "x",
                  "notes\\win.md": "y"}, folder=None)
    with pytest.raises(PackageProblems) as refused:
        package_from_zip(bad)
    assert len(refused.value.problems) >= 4
    before = (Skill.objects.for_tenant(world.a.tenant).count(), SkillVersion.objects.for_tenant(world.a.tenant).count())
    response = upload_zip(world.a.console("operator"), bad)
    assert response.status_code == 400
    page = response.content.decode()
    assert "Nothing was stored" in page
    assert f"{len(refused.value.problems)} problems" in page
    for problem in refused.value.problems:
        assert f"<li>{escape(problem)}</li>" in page
    after = (Skill.objects.for_tenant(world.a.tenant).count(), SkillVersion.objects.for_tenant(world.a.tenant).count())
    assert after == before


def test_an_upload_needs_a_file_and_not_a_too_large_one(world, monkeypatch):
    client = world.a.console("operator")
    response = client.post(url("skill_list"), {})
    assert response.status_code == 400 and "Choose a .zip archive or a folder" in response.content.decode()
    monkeypatch.setattr("skills.forms.MAX_ARCHIVE_BYTES", 100)
    response = upload_zip(client, zip_of(skill_files()))
    assert response.status_code == 400 and "is too large" in response.content.decode()
    assert not tenant_skills(world.a).exists()


def test_a_platform_skills_name_is_refused_on_the_form(world):
    platform = Skill.objects.for_tenant(world.a.tenant).filter(source="platform").first()
    response = upload_zip(world.a.console("operator"), zip_of(skill_files(name=platform.name), folder=platform.name))
    assert response.status_code == 400
    assert "is a platform skill" in response.content.decode()
    assert Skill.objects.for_tenant(world.a.tenant).get(name=platform.name).source == "platform"


def test_a_folder_upload_sends_its_paths_beside_the_files(world):
    client = world.a.console("operator")
    files = skill_files()
    paths = [f"launch-check/{path}" for path in files]
    uploads = [SimpleUploadedFile(path.rsplit("/", 1)[-1], content.encode())
               for path, content in zip(paths, files.values(), strict=True)]
    response = client.post(url("skill_list"), {"files": uploads, "paths": paths})
    assert response.status_code == 302, response.content.decode()[-3000:]
    skill = tenant_skills(world.a).get(name="launch-check")
    assert sorted(SkillFile.objects.for_tenant(world.a.tenant).filter(version__skill=skill)
                  .values_list("path", flat=True)) == ["SKILL.md", "notes/checklist.md"]


def test_a_folder_upload_without_its_paths_is_refused(world):
    client = world.a.console("operator")
    files = [SimpleUploadedFile(name.rsplit("/", 1)[-1], content.encode()) for name, content in skill_files().items()]
    response = client.post(url("skill_list"), {"files": files})
    assert response.status_code == 400 and "Upload the skill as a .zip archive instead" in response.content.decode()
    files = [SimpleUploadedFile(name.rsplit("/", 1)[-1], content.encode()) for name, content in skill_files().items()]
    response = client.post(url("skill_list"), {"files": files, "paths": ["launch-check/SKILL.md", "x/other.md"]})
    assert response.status_code == 400 and "do not match the files" in response.content.decode()
    files = [SimpleUploadedFile("SKILL.md", skill_files()["SKILL.md"].encode()),
             SimpleUploadedFile("evil.md", b"x")]
    response = client.post(url("skill_list"), {"files": files, "paths": ["launch-check/SKILL.md",
                                                                            "launch-check/../evil.md"]})
    assert response.status_code == 400 and "Nothing was stored" in response.content.decode()
    assert not tenant_skills(world.a).exists()


def test_a_second_upload_is_version_two_and_the_page_shows_version_one(world):
    client = world.a.console("operator")
    assert upload_zip(client, zip_of(skill_files(**{"notes/old.md": "only in v1"}))).status_code == 302
    second = upload_zip(client, zip_of(skill_files(extra="\nThen check the weather TWICE-V2.\n")))
    skill = tenant_skills(world.a).get(name="launch-check")
    assert second.status_code == 302 and skill.current_version == 2
    same = upload_zip(client, zip_of(skill_files(extra="\nThen check the weather TWICE-V2.\n")))
    assert "nothing new was stored" in client.get(same["Location"]).content.decode()
    current = client.get(url("skill_detail", skill_id=skill.pk)).content.decode()
    assert "TWICE-V2" in current and "old.md" not in current
    first = client.get(url("skill_detail", skill_id=skill.pk), {"version": 1})
    assert first.status_code == 200
    page = first.content.decode()
    assert "old.md" in page and "TWICE-V2" not in page and "not the current one" in page
    file = client.get(url("skill_detail", skill_id=skill.pk), {"version": 1, "file": "notes/old.md"})
    assert "only in v1" in file.content.decode()
    for missing in ({"version": 3}, {"version": "x"}, {"version": "²"}, {"version": 1, "file": "notes/nope.md"}):
        assert client.get(url("skill_detail", skill_id=skill.pk), missing).status_code == 404, missing


# --- a skill's page -----------------------------------------------------------------------------------

def test_the_page_shows_front_matter_body_files_and_versions(world):
    skill = uploaded(world.a, skill_files(**{"assets/logo.png": b"\x89PNG\r\n\x1a\n\x00\xff"}))
    page = world.a.console("viewer").get(url("skill_detail", skill_id=skill.pk)).content.decode()
    for text in ("Checks before a launch.", "Apache-2.0", "Toolkeeper sessions with the ops group.",
                 "author: acme-ops", "<h3>Launch check</h3>", "<code>countdown</code>", "it grants no permission",
                 "no such tool here", "checklist.md", "assets/", "logo.png", "v1"):
        assert text in page, text
    assert 'name="enabled"' not in page and 'name="group"' not in page  # viewers only read
    binary = world.a.console("viewer").get(url("skill_detail", skill_id=skill.pk), {"file": "assets/logo.png"})
    assert "Not UTF-8 text" in binary.content.decode()


def test_uploaded_content_is_escaped(world):
    hostile = "<script>alert('body')</script>\n\n- <img src=x onerror=alert(1)>\n\n```\n<b>code</b>\n```\n"
    skill = uploaded(world.a, skill_files(description="<i>desc</i>", extra=hostile,
                                          **{"notes/x.md": "<script>alert('file')</script>"}))
    client = world.a.console("admin")
    page = client.get(url("skill_detail", skill_id=skill.pk)).content.decode()
    assert "<script>alert(" not in page and "<img src=x" not in page and "<b>code</b>" not in page
    assert "<i>desc</i>" not in page
    assert "&lt;script&gt;alert(&#x27;body&#x27;)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "&lt;b&gt;code&lt;/b&gt;" in page
    listing = client.get(url("skill_list")).content.decode()
    assert "<i>desc</i>" not in listing and "&lt;i&gt;desc&lt;/i&gt;" in listing
    file = client.get(url("skill_detail", skill_id=skill.pk), {"file": "notes/x.md"}).content.decode()
    assert "<script>alert('file')" not in file and "&lt;script&gt;alert(&#x27;file&#x27;)" in file


def test_enable_disable_and_the_agents(world):
    skill = uploaded(world.a)
    client = world.a.console("operator")
    response = client.post(url("skill_exposure", skill_id=skill.pk), {"agents": "ops-bot\nsupport-bot, ops-bot"})
    assert response.status_code == 302
    skill.refresh_from_db()
    assert skill.enabled is False and skill.agents == ["ops-bot", "support-bot"]
    assert "load_skill_through_path" not in [t["name"] for t in session_tools(
        session_create(tenant=world.a.tenant, agent="ops-bot"), "mcp")]
    client.post(url("skill_exposure", skill_id=skill.pk), {"enabled": "on", "agents": ""})
    skill.refresh_from_db()
    assert skill.enabled is True and skill.agents == []
    page = client.get(url("skill_detail", skill_id=skill.pk)).content.decode()
    assert "every agent" in page
    too_long = client.post(url("skill_exposure", skill_id=skill.pk), {"enabled": "on", "agents": "x" * 201})
    assert too_long.status_code == 400 and "at most 200 characters" in too_long.content.decode()
    assert Event.objects.for_tenant(world.a.tenant).filter(verb="skill.updated").count() == 2


def test_bind_and_unbind_a_group(world):
    skill = uploaded(world.a)
    ops = ToolGroup.objects.for_tenant(world.a.tenant).get(name="ops")
    client = world.a.console("operator")
    page = client.get(url("skill_detail", skill_id=skill.pk)).content.decode()
    assert f'value="{ops.pk}"' in page and ">basic<" not in page  # the reserved group is always on
    response = client.post(url("skill_groups", skill_id=skill.pk), {"group": ops.pk})
    assert response.status_code == 302
    ops.refresh_from_db()
    assert ops.skill_ref == "launch-check"
    page = client.get(url("skill_detail", skill_id=skill.pk)).content.decode()
    assert reverse("console:group_edit", kwargs={"tenant": "acme", "group_id": ops.pk}) in page

    session = session_create(tenant=world.a.tenant, agent="support-bot")
    [call] = calls_submit(session=session, calls=[
        {"name": "load_skill_through_path", "input": {"skillId": "launch-check", "path": "SKILL.md"}}])
    assert call.status == "succeeded", call.error
    session.refresh_from_db()
    assert "countdown" in [t["name"] for t in session_tools(session, "mcp")]

    b_group = world.b.groups["math"]
    assert client.post(url("skill_groups", skill_id=skill.pk), {"group": b_group.pk}).status_code == 400
    assert client.post(url("skill_groups", skill_id=skill.pk), {"unbind": b_group.pk}).status_code == 404
    assert client.post(url("skill_groups", skill_id=skill.pk), {"unbind": "x"}).status_code == 404
    response = client.post(url("skill_groups", skill_id=skill.pk), {"unbind": ops.pk})
    assert response.status_code == 302
    ops.refresh_from_db()
    assert ops.skill_ref == ""
    b_group.refresh_from_db()
    assert b_group.skill_ref == ""


def test_a_viewer_cannot_upload_or_change(world):
    skill = uploaded(world.a)
    ops = ToolGroup.objects.for_tenant(world.a.tenant).get(name="ops")
    for role in ("viewer", "reviewer"):
        client = world.a.console(role)
        assert upload_zip(client, zip_of(skill_files(name="other"), folder="other")).status_code == 403
        assert client.post(url("skill_exposure", skill_id=skill.pk), {"agents": "x"}).status_code == 403
        assert client.post(url("skill_groups", skill_id=skill.pk), {"group": ops.pk}).status_code == 403
    skill.refresh_from_db()
    ops.refresh_from_db()
    assert skill.enabled and skill.agents == [] and ops.skill_ref == ""
    assert not Skill.objects.for_tenant(world.a.tenant).filter(name="other").exists()


def test_another_tenants_skill_is_404(world):
    b_skill = uploaded(world.b, skill_files(name="globex-secret"), name="globex-secret")
    client = world.a.console("admin")
    for name in ("skill_detail", "skill_exposure", "skill_groups"):
        assert client.get(url(name, skill_id=b_skill.pk)).status_code == 404
        assert client.post(url(name, skill_id=b_skill.pk), {"enabled": "on"}).status_code == 404
    assert client.get(url("skill_list", tenant="globex")).status_code == 404
    b_skill.refresh_from_db()
    assert b_skill.enabled is True


# --- the session page ---------------------------------------------------------------------------------

def test_the_session_page_shows_the_skills_it_loaded(world):
    skill = uploaded(world.a)
    session = session_create(tenant=world.a.tenant, agent="support-bot")
    client = world.a.console("viewer")
    page = client.get(reverse("console:session_detail", kwargs={"tenant": "acme", "session_id": session.pk}))
    assert 'id="session-skills"><span class="muted">none</span>' in page.content.decode()
    calls_submit(session=session, calls=[
        {"name": "load_skill_through_path", "input": {"skillId": "launch-check", "path": "SKILL.md"}}])
    session.refresh_from_db()
    [entry] = session.loaded_skills
    page = client.get(reverse("console:session_detail", kwargs={"tenant": "acme", "session_id": session.pk}))
    text = page.content.decode()
    assert 'data-skill="launch-check"' in text and " v1</span>" in text
    assert f"{url('skill_detail', skill_id=skill.pk)}?version=1" in text
    assert entry["at"][:10] in text and "<time datetime=" in text


# --- the body as text ---------------------------------------------------------------------------------

def test_body_blocks():
    blocks = body_blocks("# Title #\n\nOne line\nnext line with `code`.\n\n- a\n  more of a\n- b\n\n1. x\n2) y\n\n"
                         "```python\nprint('<x>')\n```\n| a | b |\n|---|---|\n####### seven\n")
    assert blocks[0] == {"kind": "heading", "level": 3, "spans": [{"code": False, "text": "Title"}]}
    assert blocks[1]["kind"] == "paragraph" and blocks[1]["spans"][-2] == {"code": True, "text": "code"}
    assert blocks[2] == {"kind": "list", "ordered": False, "items": [[{"code": False, "text": "a\nmore of a"}],
                                                                       [{"code": False, "text": "b"}]]}
    assert blocks[3]["ordered"] is True and len(blocks[3]["items"]) == 2
    assert blocks[4] == {"kind": "code", "text": "print('<x>')"}
    assert blocks[5] == {"kind": "code", "text": "| a | b |\n|---|---|"}
    assert blocks[6]["kind"] == "paragraph"  # seven hashes are no heading
    assert body_blocks("```\nnever closed") == [{"kind": "code", "text": "never closed"}]
    assert body_blocks("") == []


def test_file_tree():
    class F:
        def __init__(self, path, size=1):
            self.path, self.size = path, size

    rows = file_tree([F("notes/b.md"), F("notes.txt"), F("SKILL.md"), F("notes/deep/c.md"), F("a.md")])
    assert [(r["name"], r["depth"]) for r in rows] == [
        ("SKILL.md", 0), ("a.md", 0), ("notes/", 0), ("b.md", 1), ("deep/", 1), ("c.md", 2), ("notes.txt", 0)]

