"""Reads: which skills a session sees, from a per-process snapshot kept as fresh as the tenant's catalog."""
from dataclasses import dataclass
from functools import reduce
from operator import or_

from django.db.models import Count, Q

from skills.models import Skill, SkillFile, SkillVersion
from tenancy.versions import VersionedCache
from tools.models import AgentSession, CatalogVersion, ToolGroup


@dataclass(frozen=True)
class SkillView:
    id: int
    name: str
    description: str
    agents: tuple[str, ...]
    current_version: int

    def seen_by(self, agent: str) -> bool:
        return not self.agents or agent in self.agents


def _load(tenant_id: int, version: int) -> list[SkillView]:
    return [SkillView(id=row.pk, name=row.name, description=row.description, agents=tuple(row.agents or ()),
                      current_version=row.current_version)
            for row in Skill.objects.for_tenant(tenant_id).filter(enabled=True, current_version__gt=0)
            .only("id", "name", "description", "agents", "current_version").order_by("name")]


# Every write to a skill bumps the tenant's catalog version (the surface depends on it).
_snapshots: VersionedCache[list[SkillView]] = VersionedCache(CatalogVersion)


def session_skills(session: AgentSession, catalog_version: int | None = None) -> list[SkillView]:
    """The enabled skills the session's agent sees, by name. A caller holding the tenant's catalog snapshot
    passes its version, which saves reading it again."""
    return [skill for skill in _snapshots.get(session.tenant_id, _load, catalog_version)
            if skill.seen_by(session.agent)]


def loaded_version(session: AgentSession, name: str) -> int | None:
    """The version of the skill `name` that the session loaded, if it loaded it."""
    return next((entry.get("version") for entry in session.loaded_skills or ()
                 if isinstance(entry, dict) and entry.get("skill") == name), None)


def session_skill_version(session: AgentSession, skill: Skill) -> tuple[SkillVersion | None, list[str]]:
    """The version of the skill this session reads (the one it loaded, else the current one) and its paths."""
    number = loaded_version(session, skill.name) or skill.current_version
    version = SkillVersion.objects.for_tenant(session.tenant_id).filter(skill=skill, number=number).first()
    if version is None:
        return None, []
    return version, list(SkillFile.objects.for_tenant(session.tenant_id).filter(version=version)
                         .values_list("path", flat=True))


def session_skill_paths(session: AgentSession, skills: list[SkillView]) -> dict[int, list[str]]:
    """The file paths of each of these skills in the version the session reads, by skill id: one query."""
    if not skills:
        return {}
    wanted = reduce(or_, (Q(version__skill_id=skill.id,
                            version__number=loaded_version(session, skill.name) or skill.current_version)
                          for skill in skills))
    paths: dict[int, list[str]] = {skill.id: [] for skill in skills}
    for skill_id, path in (SkillFile.objects.for_tenant(session.tenant_id).filter(wanted)
                           .order_by("path").values_list("version__skill_id", "path")):
        paths[skill_id].append(path)
    return paths


def session_skill_files(session: AgentSession, skills: list[SkillView]) -> dict[tuple[str, str], int]:
    """The files of these skills in the version the session reads, as {(skill name, path): file id}: one query.
    A stored file never changes (a new version stores new ones)."""
    if not skills:
        return {}
    wanted = reduce(or_, (Q(version__skill_id=skill.id,
                            version__number=loaded_version(session, skill.name) or skill.current_version)
                          for skill in skills))
    names = {skill.id: skill.name for skill in skills}
    return {(names[skill_id], path): pk for pk, skill_id, path in (
        SkillFile.objects.for_tenant(session.tenant_id).filter(wanted).values_list("pk", "version__skill_id", "path"))}


def tenant_skills(tenant):
    return Skill.objects.for_tenant(tenant).order_by("name")


# --- the console's reads ------------------------------------------------------------------------

def skill_versions(skill: Skill):
    """The skill's versions, newest first, each with its number of files."""
    return (SkillVersion.objects.for_tenant(skill.tenant_id).filter(skill=skill)
            .annotate(file_count=Count("files")).order_by("-number"))


def version_files(version: SkillVersion):
    """The version's files by path, without their content."""
    return SkillFile.objects.for_tenant(version.tenant_id).filter(version=version).only("path", "size").order_by("path")


def groups_by_skill(tenant) -> dict[str, list[ToolGroup]]:
    """The tenant's skill-bound groups, by the name of the skill they are bound to."""
    bound: dict[str, list[ToolGroup]] = {}
    for group in ToolGroup.objects.for_tenant(tenant).exclude(skill_ref="").order_by("name"):
        bound.setdefault(group.skill_ref, []).append(group)
    return bound
