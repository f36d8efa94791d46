"""Reads: which skills a session sees, from a per-process snapshot kept as fresh as the tenant's catalog."""
from dataclasses import dataclass

from django.db.models import Count

from tenancy.versions import VersionedCache
from tools.models import AgentSession, CatalogVersion, ToolGroup

from .models import Skill, SkillFile, SkillVersion


@dataclass(frozen=True)
class SkillView:
    id: int
    name: str
    description: str
    agents: tuple[str, ...]

    def seen_by(self, agent: str) -> bool:
        return not self.agents or agent in self.agents


def _load(tenant_id: int, version: int) -> list[SkillView]:
    return [SkillView(id=row.pk, name=row.name, description=row.description, agents=tuple(row.agents or ()))
            for row in Skill.objects.for_tenant(tenant_id).filter(enabled=True, current_version__gt=0)
            .only("id", "name", "description", "agents").order_by("name")]


# Every write to a skill bumps the tenant's catalog version (the surface depends on it).
_snapshots: VersionedCache[list[SkillView]] = VersionedCache(CatalogVersion)


def session_skills(session: AgentSession, catalog_version: int | None = None) -> list[SkillView]:
    """The enabled skills the session's agent sees, by name. A caller holding the tenant's catalog snapshot
    passes its version, which saves reading it again."""
    return [skill for skill in _snapshots.get(session.tenant_id, _load, catalog_version)
            if skill.seen_by(session.agent)]


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
