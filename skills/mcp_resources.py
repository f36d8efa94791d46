"""Skills as MCP resources on `/mcp/` (`skill://<name>/<path>`): the files of the skills a session sees,
in the version it reads. Reading a resource reads; it loads nothing (no group is switched on): that is
`load_skill_through_path`'s."""
import base64
import mimetypes
from urllib.parse import unquote, urlsplit

from skills.models import Skill, SkillFile
from skills.packages import SKILL_FILE, SkillPathError, skill_path
from skills.selectors import session_skill_paths, session_skill_version, session_skills
from tools.models import AgentSession

SCHEME = "skill"


def _mime(path: str) -> str:
    if path.endswith(".md"):
        return "text/markdown"
    return mimetypes.guess_type(path)[0] or "application/octet-stream"


class SkillResources:
    def resources(self, session: AgentSession) -> list[dict]:
        skills = session_skills(session)
        paths = session_skill_paths(session, skills)
        return [{"uri": f"{SCHEME}://{skill.name}/{path}", "name": f"{skill.name}/{path}", "mimeType": _mime(path),
                 **({"description": skill.description} if path == SKILL_FILE else {})}
                for skill in skills for path in sorted(paths[skill.id], key=lambda p: (p != SKILL_FILE, p))]

    def templates(self, session: AgentSession) -> list[dict]:
        return []

    def read(self, session: AgentSession, uri: str) -> list[dict] | None:
        parts = urlsplit(uri)
        if parts.scheme != SCHEME or parts.query or parts.fragment:
            return None
        view = next((v for v in session_skills(session) if v.name == parts.netloc), None)
        if view is None:
            return None
        skill = Skill.objects.for_tenant(session.tenant_id).get(pk=view.id)
        version, paths = session_skill_version(session, skill)
        try:
            path = skill_path(paths, unquote(parts.path.lstrip("/")))
        except SkillPathError:
            return None
        data = bytes(SkillFile.objects.for_tenant(session.tenant_id).get(version=version, path=path).data)
        content = {"uri": uri, "mimeType": _mime(path)}
        try:
            return [{**content, "text": data.decode("utf-8")}]
        except UnicodeDecodeError:
            return [{**content, "blob": base64.b64encode(data).decode("ascii")}]
