"""Console pages for skills (templates/skills/), mounted at /t/<tenant>/skills/.

Every page goes through `tenancy.web.tenant_view` (login, tenant membership, the skill the URL names —
`skill_id`: missing or another tenant's → 404 — then the method and the role: reading for any member,
changing for operators). Uploads become packages through `skills.archives` (every problem listed, nothing
stored unless the whole package passes) and versions through `skills.services.skill_upload`.

Uploaded content is shown as text, never as HTML: `body_blocks` splits a SKILL.md body into headings,
paragraphs, lists and code blocks, which the template renders with Django's escaping (no Markdown library,
no `|safe`).
"""
import re

from django.contrib import messages
from django.http import Http404
from django.shortcuts import render

from skills import selectors, services
from skills.forms import BindGroupForm, ExposureForm, UploadForm
from skills.models import Skill, SkillFile, SkillSource, SkillVersion
from skills.packages import SKILL_FILE, PackageProblems, allowed_tools_list
from tenancy.web import INVALID_STATUS, SERVICE_REFUSALS, acting_user, add_service_errors, tenant_redirect, tenant_view
from tools.catalog.services import group_update
from tools.models import Tool, ToolGroup

FRONT_MATTER_SHOWN = ("license", "compatibility")  # besides name, description, metadata and allowed-tools


# --- the list and uploads ----------------------------------------------------------------------------

def _list_page(request, upload_form, *, problems=(), status=200):
    bound = selectors.groups_by_skill(request.tenant)
    return render(request, "skills/skill_list.html", {
        "rows": [{"skill": skill, "groups": bound.get(skill.name, [])}
                 for skill in selectors.tenant_skills(request.tenant)],
        "upload_form": upload_form,
        "problems": list(problems),
    }, status=status)


@tenant_view(methods=("GET", "POST"))
def skill_list(request):
    """The tenant's skills; a POST uploads a zip or a folder: a new skill, or a new version of the tenant's
    skill of that name. All or nothing."""
    if request.method != "POST":
        return _list_page(request, UploadForm())
    form = UploadForm(request.POST, request.FILES)
    if not form.is_valid():
        return _list_page(request, form, status=INVALID_STATUS)
    try:
        package = form.package()
    except PackageProblems as exc:
        return _list_page(request, form, problems=exc.problems, status=INVALID_STATUS)
    before = Skill.objects.for_tenant(request.tenant).filter(name=package.name).values_list(
        "current_version", flat=True).first()
    try:
        version = services.skill_upload(tenant=request.tenant, package=package, actor=acting_user(request))
    except SERVICE_REFUSALS as exc:
        add_service_errors(form, exc)
        return _list_page(request, form, status=INVALID_STATUS)
    if before is not None and version.number <= before:
        messages.info(request, f"{package.name}: the same files as version {version.number}; nothing new was stored.")
    else:
        messages.success(request, f"{package.name}: version {version.number} stored ({len(package.files)} files).")
    return tenant_redirect(request, "skills:skill_detail", skill_id=version.skill_id)


# --- a skill's page -----------------------------------------------------------------------------------

def _number(text: str) -> int | None:
    """A positive id or version number from a query or a form, or None (what no row has)."""
    return int(text) if text.isascii() and text.isdigit() and 0 < len(text) <= 9 else None


def _shown_version(request, skill: Skill, versions: list[SkillVersion]) -> SkillVersion | None:
    """The version `?version=N` asks for (404 when the skill has none of that number), else the current one."""
    asked = request.GET.get("version")
    if asked in (None, ""):
        return next((v for v in versions if v.number == skill.current_version), versions[0] if versions else None)
    number = _number(asked)
    found = next((v for v in versions if v.number == number), None)
    if found is None:
        raise Http404("no such version")
    return found


def file_tree(files) -> list[dict]:
    """Rows of a file tree: SKILL.md first, then folders and files in path order, each with its depth."""
    rows, folders = [], set()
    for file in sorted(files, key=lambda f: (f.path != SKILL_FILE, f.path.split("/"))):
        parts = file.path.split("/")
        for depth, name in enumerate(parts[:-1]):
            folder = "/".join(parts[:depth + 1])
            if folder not in folders:
                folders.add(folder)
                rows.append({"name": f"{name}/", "depth": depth, "folder": True})
        rows.append({"name": parts[-1], "depth": len(parts) - 1, "folder": False, "path": file.path,
                     "size": file.size})
    return rows


def _file_shown(request, version: SkillVersion | None, paths: set[str]) -> dict | None:
    """The file `?file=<path>` asks for: its text, or a note that it is binary."""
    path = request.GET.get("file")
    if not path or version is None:
        return None
    if path not in paths:
        raise Http404("no such file in this version")
    data = bytes(SkillFile.objects.for_tenant(version.tenant_id).get(version=version, path=path).data)
    try:
        return {"path": path, "size": len(data), "text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"path": path, "size": len(data), "text": None}


def _exposure_initial(skill: Skill) -> dict:
    return {"enabled": skill.enabled, "agents": "\n".join(skill.agents or ())}


def _detail_page(request, skill: Skill, *, exposure_form=None, bind_form=None, status=200):
    versions = list(selectors.skill_versions(skill))
    version = _shown_version(request, skill, versions)
    files = list(selectors.version_files(version)) if version is not None else []
    front_matter = dict(version.front_matter or {}) if version is not None else {}
    allowed = allowed_tools_list(front_matter.get("allowed-tools"))
    known = set(Tool.objects.for_tenant(request.tenant).filter(name__in=allowed).values_list("name", flat=True))
    return render(request, "skills/skill_detail.html", {
        "skill": skill,
        "platform": skill.source == SkillSource.PLATFORM,
        "versions": versions,
        "version": version,
        "is_current": version is not None and version.number == skill.current_version,
        "front_matter": front_matter,
        "facts": [(key, front_matter[key]) for key in FRONT_MATTER_SHOWN if front_matter.get(key)],
        "metadata": sorted((front_matter.get("metadata") or {}).items()),
        "allowed_tools": [{"name": name, "known": name in known} for name in allowed],
        "blocks": body_blocks(version.body) if version is not None else [],
        "tree": file_tree(files),
        "total_size": sum(f.size for f in files),
        "file": _file_shown(request, version, {f.path for f in files}),
        "groups": selectors.groups_by_skill(request.tenant).get(skill.name, []),
        "exposure_form": exposure_form or ExposureForm(initial=_exposure_initial(skill)),
        "bind_form": bind_form or BindGroupForm(tenant=request.tenant, skill=skill),
        "upload_form": UploadForm(),
    }, status=status)


@tenant_view()
def skill_detail(request, skill):
    return _detail_page(request, skill)


@tenant_view(methods=("POST",))
def skill_exposure(request, skill):
    """Switch the skill on or off and choose the agents that see it."""
    form = ExposureForm(request.POST)
    if form.is_valid():
        try:
            services.skill_update(skill=skill, actor=acting_user(request), enabled=form.cleaned_data["enabled"],
                                  agents=form.cleaned_data["agents"])
        except SERVICE_REFUSALS as exc:
            add_service_errors(form, exc)
        else:
            seen_by = ", ".join(skill.agents) if skill.agents else "every agent"
            messages.success(request, f"{skill.name} is {'on' if skill.enabled else 'off'}; seen by {seen_by}.")
            return tenant_redirect(request, "skills:skill_detail", skill_id=skill.pk)
    return _detail_page(request, skill, exposure_form=form, status=INVALID_STATUS)


@tenant_view(methods=("POST",))
def skill_groups(request, skill):
    """Bind a tool group to the skill (`group`), or unbind one (`unbind`: the id of a group bound to it)."""
    if "unbind" in request.POST:
        number = _number(request.POST["unbind"])
        group = (ToolGroup.objects.for_tenant(request.tenant).filter(pk=number, skill_ref=skill.name).first()
                 if number is not None else None)
        if group is None:
            raise Http404("no such group bound to this skill")
        group_update(group=group, skill_ref="", actor=acting_user(request))
        messages.success(request, f"The group {group.name} is no longer bound to {skill.name}.")
        return tenant_redirect(request, "skills:skill_detail", skill_id=skill.pk)
    form = BindGroupForm(request.POST, tenant=request.tenant, skill=skill)
    if form.is_valid():
        group = form.cleaned_data["group"]
        try:
            group_update(group=group, skill_ref=skill.name, actor=acting_user(request))
        except SERVICE_REFUSALS as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"The group {group.name} is bound to {skill.name}: loading the skill switches "
                                      "it on for that session.")
            return tenant_redirect(request, "skills:skill_detail", skill_id=skill.pk)
    return _detail_page(request, skill, bind_form=form, status=INVALID_STATUS)


# --- the body, shown as text --------------------------------------------------------------------------

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_BULLET = re.compile(r"^ {0,3}[-*+][ \t]+(.*)$")
_NUMBERED = re.compile(r"^ {0,3}\d{1,9}[.)][ \t]+(.*)$")
_TABLE = re.compile(r"^ {0,3}\|")
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
HEADING_OFFSET = 2  # the page has its h1 and h2: a body's `#` is an h3


def _spans(text: str) -> list[dict]:
    """Text and `code` spans, for the template to escape one by one."""
    spans, start = [], 0
    for match in _INLINE_CODE.finditer(text):
        if match.start() > start:
            spans.append({"code": False, "text": text[start:match.start()]})
        spans.append({"code": True, "text": match.group(1)})
        start = match.end()
    if start < len(text):
        spans.append({"code": False, "text": text[start:]})
    return spans


def body_blocks(text: str) -> list[dict]:
    """A Markdown body as blocks of plain text: headings, paragraphs (line breaks kept), bullet and numbered
    lists, fenced code and tables (both shown preformatted). Nothing is interpreted as HTML."""
    blocks: list[dict] = []
    paragraph: list[str] = []
    lines = text.splitlines()

    def flush():
        if paragraph:
            blocks.append({"kind": "paragraph", "spans": _spans("\n".join(paragraph))})
            paragraph.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        if fence := _FENCE.match(line):
            flush()
            marker, code = fence.group(1), []
            i += 1
            while i < len(lines) and not lines[i].lstrip().startswith(marker):
                code.append(lines[i])
                i += 1
            blocks.append({"kind": "code", "text": "\n".join(code)})
            i += 1
        elif heading := _HEADING.match(line):
            flush()
            level = min(len(heading.group(1)) + HEADING_OFFSET, 6)
            blocks.append({"kind": "heading", "level": level, "spans": _spans(heading.group(2) or "")})
            i += 1
        elif _TABLE.match(line):
            flush()
            rows = []
            while i < len(lines) and _TABLE.match(lines[i]):
                rows.append(lines[i].strip())
                i += 1
            blocks.append({"kind": "code", "text": "\n".join(rows)})
        elif _BULLET.match(line) or _NUMBERED.match(line):
            flush()
            pattern = _NUMBERED if _NUMBERED.match(line) else _BULLET
            items: list[list[str]] = []
            while i < len(lines):
                if item := pattern.match(lines[i]):
                    items.append([item.group(1)])
                elif items and lines[i].strip() and lines[i][:1] in " \t":  # a continuation or a nested item
                    items[-1].append(lines[i].strip())
                else:
                    break
                i += 1
            blocks.append({"kind": "list", "ordered": pattern is _NUMBERED,
                           "items": [_spans("\n".join(item)) for item in items]})
        elif not line.strip():
            flush()
            i += 1
        else:
            paragraph.append(line)
            i += 1
    flush()
    return blocks
