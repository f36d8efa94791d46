"""What console pages outside the skills app show of skills: the skills a session loaded."""
from django import template
from django.utils.dateparse import parse_datetime

from skills.models import Skill

register = template.Library()


def _moment(value):
    try:
        return parse_datetime(value) if isinstance(value, str) else None
    except ValueError:
        return None


@register.simple_tag
def loaded_skills(session) -> list[dict]:
    """The session's loaded skills in the order it loaded them: name, version, when (a datetime, or None), and
    the id of the tenant's skill of that name for a link (None when it is gone)."""
    entries = [entry for entry in session.loaded_skills or () if isinstance(entry, dict) and entry.get("skill")]
    if not entries:
        return []
    ids = dict(Skill.objects.for_tenant(session.tenant_id).filter(name__in=[str(e["skill"]) for e in entries])
               .values_list("name", "pk"))
    return [{"name": str(entry["skill"]), "version": entry.get("version"), "at": _moment(entry.get("at")),
             "skill_id": ids.get(str(entry["skill"]))} for entry in entries]
