"""Skills as MCP resources on `/mcp/` (`skill://<name>/<path>`): the files of the skills a session sees,
in the version it reads. Reading a resource reads; it loads nothing (no group is switched on): that is
`load_skill_through_path`'s."""
import base64
import hashlib
import mimetypes
from urllib.parse import unquote, urlsplit

from skills.models import Skill, SkillFile
from skills.packages import SKILL_FILE, SkillPathError, skill_path
from skills.selectors import session_skill_files, session_skill_paths, session_skill_version, session_skills
from tools.models import AgentSession

SCHEME = "skill"

# A skill file's row never changes once stored (a new version stores new rows): the digest of its contents, by
# its id, is read once per process. Bounded: cleared when it grows past MAX_DIGESTS.
MAX_DIGESTS = 10_000
_digests: dict[int, str] = {}


def _file_digests(tenant_id: int, file_ids: set[int]) -> dict[int, str]:
    missing = file_ids - _digests.keys()
    if missing:
        if len(_digests) + len(missing) > MAX_DIGESTS:
            _digests.clear()
        for pk, data in SkillFile.objects.for_tenant(tenant_id).filter(pk__in=missing).values_list("pk", "data"):
            _digests[pk] = hashlib.sha256(bytes(data)).hexdigest()[:24]
    return {pk: _digests[pk] for pk in file_ids if pk in _digests}


def _mime(path: str) -> str:
    if path.endswith(".md"):
        return "text/markdown"
    return mimetypes.guess_type(path)[0] or "application/octet-stream"


def _parts(uri: str):
    """The parts of a `skill://` URI, or None for any other (or one that is no URI at all)."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return None
    return parts if parts.scheme == SCHEME and not parts.query and not parts.fragment else None


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
        parts = _parts(uri)
        if parts is None:
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

    def stamps(self, session: AgentSession, uris: list[str]) -> dict[str, str | None]:
        """For resource subscriptions: the digest of each URI's file in the version the session reads (a new
        version that changes the file, or a skill the session no longer sees, changes it), None for what it may
        not read; a query for the files, and one for the contents of those not digested before."""
        ours = {uri: parts for uri in uris if (parts := _parts(uri)) is not None}
        stamps: dict[str, str | None] = dict.fromkeys(uris)
        if not ours:
            return stamps
        named = {parts.netloc for parts in ours.values()}
        files = session_skill_files(session, [view for view in session_skills(session) if view.name in named])
        paths: dict[str, list[str]] = {}
        for name, path in files:
            paths.setdefault(name, []).append(path)
        found: dict[str, int] = {}
        for uri, parts in ours.items():
            try:
                path = skill_path(paths.get(parts.netloc, []), unquote(parts.path.lstrip("/")))
            except SkillPathError:
                continue
            found[uri] = files[(parts.netloc, path)]
        digests = _file_digests(session.tenant_id, set(found.values()))
        for uri, file_id in found.items():
            if file_id in digests:
                stamps[uri] = f"skill-file:{digests[file_id]}"
        return stamps
