"""Skills (docs/notes/knowledge-and-skills.md): packaged know-how an agent loads when a task calls for it.

A skill belongs to a tenant: one it uploaded, or a platform skill (shipped in the repository's `skills/`
folder) copied into every tenant's catalog, off until an operator enables it. Each upload or change of a
platform skill's files is a new `SkillVersion` whose files are kept as they were: a session keeps the
version it loaded. A tool group is bound to a skill by naming it (`tools.ToolGroup.skill_ref`).
"""
from django.db import models

from tenancy.scoping import TenantOwned


class SkillSource(models.TextChoices):
    PLATFORM = "platform"
    TENANT = "tenant"


class Skill(TenantOwned):
    name = models.CharField(max_length=64)
    source = models.CharField(max_length=10, choices=SkillSource.choices)
    enabled = models.BooleanField(default=True)
    agents = models.JSONField(default=list, blank=True, help_text="The agents that see it; empty: every agent.")
    description = models.TextField(default="", blank=True)  # the current version's
    current_version = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="skill_name_per_tenant")]

    def __str__(self):
        return self.name

    def seen_by(self, agent: str) -> bool:
        return self.enabled and (not self.agents or agent in self.agents)


class SkillVersion(TenantOwned):
    skill = models.ForeignKey(Skill, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    digest = models.CharField(max_length=64)
    description = models.TextField()
    front_matter = models.JSONField(default=dict)
    body = models.TextField()
    created_by = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["skill", "-number"]
        constraints = [models.UniqueConstraint(fields=["skill", "number"], name="skill_version_number")]

    def __str__(self):
        return f"{self.skill_id} v{self.number}"


class SkillFile(TenantOwned):
    version = models.ForeignKey(SkillVersion, on_delete=models.CASCADE, related_name="files")
    path = models.CharField(max_length=255)
    data = models.BinaryField()
    size = models.PositiveIntegerField()

    class Meta:
        ordering = ["path"]
        constraints = [models.UniqueConstraint(fields=["version", "path"], name="skill_file_path_per_version")]

    def __str__(self):
        return self.path
