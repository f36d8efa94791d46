"""Reads: which skills a session sees, from a per-process snapshot kept as fresh as the tenant's catalog."""
from dataclasses import dataclass

from tenancy.versions import VersionedCache
from tools.models import AgentSession, CatalogVersion

from .models import Skill


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


def session_skills(session: AgentSession) -> list[SkillView]:
    """The enabled skills the session's agent sees, by name."""
    return [skill for skill in _snapshots.get(session.tenant_id, _load) if skill.seen_by(session.agent)]


def tenant_skills(tenant):
    return Skill.objects.for_tenant(tenant).order_by("name")
