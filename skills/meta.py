"""`load_skill_through_path`, the skills' meta tool on a session's surface (through `tools.catalog.registry`)."""
from skills.models import Skill
from skills.selectors import session_skills
from skills.services import SKILL_FILE, skill_read
from tools.catalog.registry import META_LOAD_SKILL
from tools.catalog.snapshot import ExposedTool
from tools.models import AgentSession, ToolCall
from tools.python.decorators import ToolError

DESCRIPTION = (
    "Load a skill: packaged instructions for a kind of task. Call it with path \"SKILL.md\" when a task matches "
    "a skill's description: you get its instructions and its tools are switched on for this session. Then read "
    "the resources the instructions name, by their relative path."
)


class SkillLoader:
    name = META_LOAD_SKILL

    def exposed(self, session: AgentSession, catalog) -> ExposedTool | None:
        skills = session_skills(session, catalog.version)
        if not skills:
            return None
        schema = {
            "type": "object",
            "properties": {
                "skillId": {"type": "string", "enum": [skill.name for skill in skills],
                            "description": "The skill's name."},
                "path": {"type": "string", "minLength": 1, "maxLength": 255,
                         "description": f"{SKILL_FILE}, or a resource's path relative to the skill's folder."},
            },
            "required": ["skillId", "path"],
            "additionalProperties": False,
        }
        return ExposedTool(name=self.name, description=DESCRIPTION, schema=schema, catalog=catalog,
                           annotations={"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True})

    def run(self, *, call: ToolCall, session: AgentSession):
        arguments = call.effective_input or {}
        name = arguments.get("skillId")
        seen = {skill.name: skill for skill in session_skills(session)}
        if name not in seen:
            raise ToolError(f"no skill {name!r} here; available: {', '.join(sorted(seen)) or 'none'}",
                            error_type="InvalidInput")
        skill = Skill.objects.for_tenant(session.tenant_id).get(pk=seen[name].id)
        return skill_read(session=session, skill=skill, path=arguments.get("path", ""),
                          actor=f"session:{session.pk}")

    def prompt_section(self, session: AgentSession) -> str:
        skills = session_skills(session)
        if not skills:
            return ""
        lines = [f"- {skill.name}: {skill.description}" for skill in skills]
        return (f"## Skills\nWhen a task matches a skill, load it first: {META_LOAD_SKILL}(skillId, "
                f"\"{SKILL_FILE}\").\n" + "\n".join(lines))
