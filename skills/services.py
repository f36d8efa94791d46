"""Writes: platform skills synced into each tenant, uploads as new versions, exposure, and loading."""
import base64
import logging
from functools import lru_cache

from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from common.errors import Conflict, ServiceError
from skills.models import Skill, SkillFile, SkillSource, SkillVersion
from skills.packages import (
    SKILL_FILE,
    PackageProblems,
    SkillPackage,
    SkillPathMissing,
    SkillPathRefused,
    package_from_folder,
    platform_skill_folders,
    skill_path,
)
from skills.selectors import session_skill_version
from tenancy.fastread import tables_exist
from tenancy.models import Tenant
from tools.catalog.snapshot import catalog_bump, surface_announce
from tools.models import AgentSession
from tools.python.decorators import ToolError

logger = logging.getLogger("toolkeeper.skills")

@lru_cache(maxsize=1)
def shipped_packages() -> tuple[SkillPackage, ...]:
    """The platform skills shipped with this deployment, read once per process; a broken folder is logged and
    left out (the tests check that every shipped one is valid)."""
    packages = []
    for folder in platform_skill_folders():
        try:
            packages.append(package_from_folder(folder))
        except PackageProblems as exc:
            logger.error("platform skill %s left out: %s", folder.name, "; ".join(exc.problems))
    return tuple(packages)


def _version_store(*, skill: Skill, package: SkillPackage, actor: str) -> tuple[SkillVersion, bool]:
    """The skill's version holding exactly these files: the newest one if it does, else a new one."""
    digest = package.digest()
    newest = SkillVersion.objects.for_tenant(skill.tenant_id).filter(skill=skill).order_by("-number").first()
    if newest is not None and newest.digest == digest:
        return newest, False
    version = SkillVersion.objects.create(
        tenant_id=skill.tenant_id, skill=skill, number=(newest.number if newest else 0) + 1, digest=digest,
        description=package.description, front_matter=package.front_matter, body=package.body, created_by=actor)
    SkillFile.objects.bulk_create([
        SkillFile(tenant_id=skill.tenant_id, version=version, path=path, data=data, size=len(data))
        for path, data in sorted(package.files.items())])
    skill.current_version, skill.description = version.number, package.description
    skill.save(update_fields=["current_version", "description", "updated_at"])
    return version, True


@transaction.atomic
def platform_skills_sync(*, tenant) -> None:
    """Bring the tenant's copies of the platform skills in line with the shipped ones (off until enabled)."""
    changed = False
    for package in shipped_packages():
        skill, created = Skill.objects.get_or_create(
            tenant=tenant, name=package.name, defaults={"source": SkillSource.PLATFORM, "enabled": False})
        if skill.source != SkillSource.PLATFORM:
            continue  # the tenant's own skill of that name stays
        _, new = _version_store(skill=skill, package=package, actor="platform")
        changed = changed or new or created
    if changed:
        catalog_bump(tenant.pk)


def platform_skills_sync_all(**kwargs) -> None:
    if not tables_exist(Tenant, Skill, SkillVersion, SkillFile):
        return
    for tenant in Tenant.objects.only("pk", "slug"):  # columns every migration state has (tools.catalog.services)
        platform_skills_sync(tenant=tenant)


def actor_label(actor) -> str:
    return actor if isinstance(actor, str) else getattr(actor, "username", "") or str(actor or "")


@transaction.atomic
def skill_upload(*, tenant, package: SkillPackage, actor=None) -> SkillVersion:
    """A tenant's skill package: a new skill, or a new version of the skill of that name."""
    skill = Skill.objects.for_tenant(tenant).select_for_update().filter(name=package.name).first()
    if skill is not None and skill.source == SkillSource.PLATFORM:
        raise Conflict({"name": [f"{package.name!r} is a platform skill's name; choose another"]})
    if skill is None:
        skill = Skill.objects.create(tenant=tenant, name=package.name, source=SkillSource.TENANT, enabled=True)
    version, new = _version_store(skill=skill, package=package, actor=actor_label(actor))
    if new:
        audit_record(tenant=tenant, actor=actor, verb="skill.uploaded", target=f"skill:{skill.pk}",
                     data={"name": skill.name, "version": version.number, "files": len(package.files)})
        catalog_bump(tenant.pk)
    return version


@transaction.atomic
def skill_update(*, skill: Skill, actor=None, enabled: bool | None = None, agents=None) -> Skill:
    """Switch a skill on or off, or choose the agents that see it (empty: every agent)."""
    if agents is not None:
        if not isinstance(agents, list) or not all(isinstance(a, str) and 0 < len(a) <= 200 for a in agents):
            raise ServiceError({"agents": ["a list of agent names"]})
        skill.agents = sorted(set(agents))
    if enabled is not None:
        skill.enabled = bool(enabled)
    skill.save(update_fields=["enabled", "agents", "updated_at"])
    audit_record(tenant=skill.tenant, actor=actor, verb="skill.updated", target=f"skill:{skill.pk}",
                 data={"enabled": skill.enabled, "agents": skill.agents})
    catalog_bump(skill.tenant_id)
    return skill


# --- loading ------------------------------------------------------------------------------------

def skill_read(*, session: AgentSession, skill: Skill, path: str, actor=None) -> dict:
    """`load_skill_through_path`: the skill's instructions (SKILL.md), which load the skill into the session
    and so switch on its groups, or one of its resources. The session reads the version it loaded first."""
    version, paths = session_skill_version(session, skill)
    if version is None:
        raise ToolError(f"the skill {skill.name} has no version to read", error_type="NotFound")
    try:
        resolved = skill_path(paths, path)
    except SkillPathRefused as exc:
        raise ToolError(str(exc), error_type="InvalidPath") from None
    except SkillPathMissing as exc:
        raise ToolError(str(exc), error_type="NotFound") from None
    answer = {"skill": skill.name, "version": version.number, "path": resolved}
    if resolved == SKILL_FILE:
        _record_load(session=session, skill=skill, version=version, actor=actor)
        return {**answer, "content": version.body, "resources": [p for p in paths if p != SKILL_FILE]}
    data = bytes(SkillFile.objects.for_tenant(session.tenant_id).get(version=version, path=resolved).data)
    audit_record(tenant=session.tenant, actor=actor, verb="skill.read", target=f"skill:{skill.pk}",
                 data={"session": str(session.pk), "version": version.number, "path": resolved})
    try:
        return {**answer, "content": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {**answer, "encoding": "base64", "content": base64.b64encode(data).decode("ascii")}


def _record_load(*, session: AgentSession, skill: Skill, version: SkillVersion, actor) -> None:
    with transaction.atomic():
        row = AgentSession.objects.for_tenant(session.tenant_id).select_for_update().get(pk=session.pk)
        loaded = [entry for entry in row.loaded_skills or () if isinstance(entry, dict)]
        if any(entry.get("skill") == skill.name for entry in loaded):
            session.loaded_skills = loaded
            return
        loaded.append({"skill": skill.name, "version": version.number, "at": timezone.now().isoformat()})
        AgentSession.objects.for_tenant(session.tenant_id).filter(pk=session.pk).update(loaded_skills=loaded)
        session.loaded_skills = loaded
        surface_announce(session.tenant_id, session.pk)  # its bound groups are active for the session now
        audit_record(tenant=session.tenant, actor=actor, verb="skill.loaded", target=f"skill:{skill.pk}",
                     data={"session": str(session.pk), "version": version.number})
