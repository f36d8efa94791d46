from rest_framework import serializers

from common import serializers as strict
from skills.models import Skill, SkillVersion

MAX_UPLOAD_FILES = 200


class SkillSerializer(strict.ModelSerializer):
    class Meta:
        model = Skill
        fields = ["id", "name", "source", "enabled", "agents", "description", "current_version", "created_at",
                  "updated_at"]
        read_only_fields = ["name", "source", "description", "current_version", "created_at", "updated_at"]


class SkillUpdateSerializer(strict.Serializer):
    enabled = serializers.BooleanField(required=False)
    agents = serializers.ListField(child=serializers.CharField(max_length=200), required=False, max_length=1000,
                                   help_text="the agents that see the skill; empty: every agent")


class SkillVersionSerializer(strict.ModelSerializer):
    files = serializers.SerializerMethodField()

    class Meta:
        model = SkillVersion
        fields = ["number", "digest", "description", "front_matter", "created_by", "created_at", "files"]

    def get_files(self, version) -> list[dict]:
        return [{"path": path, "size": size} for path, size in version.files.values_list("path", "size")]


class SkillDetailSerializer(SkillSerializer):
    versions = serializers.SerializerMethodField()
    bound_groups = serializers.SerializerMethodField()

    class Meta(SkillSerializer.Meta):
        fields = [*SkillSerializer.Meta.fields, "versions", "bound_groups"]

    def get_versions(self, skill) -> list[dict]:
        versions = SkillVersion.objects.for_tenant(skill.tenant_id).filter(skill=skill).order_by("-number")
        return SkillVersionSerializer(versions, many=True).data

    def get_bound_groups(self, skill) -> list[str]:
        return self.context.get("bound_groups", [])


class SkillUploadSerializer(strict.Serializer):
    """A skill package: a zip archive (base64), or its files as text by relative path."""
    archive = serializers.CharField(required=False, help_text="the package as a zip archive, base64-encoded")
    files = serializers.DictField(child=serializers.CharField(allow_blank=True, trim_whitespace=False),
                                  required=False, help_text="the package's files as UTF-8 text, by relative path")

    def validate(self, data):
        if ("archive" in data) == ("files" in data):
            raise serializers.ValidationError("send either archive or files")
        if len(data.get("files") or {}) > MAX_UPLOAD_FILES:
            raise serializers.ValidationError(f"at most {MAX_UPLOAD_FILES} files")
        return data
