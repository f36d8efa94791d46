"""Admin API of redaction rules: patterns removed from tool results before the model sees them."""
from rest_framework import serializers

from common import serializers as strict
from tenancy.api.base import TenantModelViewSet
from tenancy.web import acting_user
from tools.models import RedactionRule
from tools.redaction import rules as redaction


class RedactionRuleSerializer(strict.ModelSerializer):
    name = serializers.CharField(max_length=64)
    pattern = serializers.CharField(max_length=redaction.MAX_PATTERN_CHARS, trim_whitespace=False,
                                    help_text="a regular expression (RE2 syntax: no back-references or look-around)")
    replacement = serializers.CharField(max_length=redaction.MAX_REPLACEMENT_CHARS, required=False,
                                        allow_blank=True, trim_whitespace=False, default="[redacted]",
                                        help_text="the literal text each match becomes")
    tool_pattern = serializers.CharField(max_length=redaction.MAX_TOOL_PATTERN_CHARS, required=False,
                                         default="*", help_text="a tool name, or a pattern with *")
    keep_original = serializers.BooleanField(
        required=False, default=False,
        help_text="keep the unredacted result (encrypted, shown to admins) when only such rules matched it")

    class Meta:
        model = RedactionRule
        fields = ["id", "name", "pattern", "replacement", "tool_pattern", "keep_original", "enabled", "created_at"]


class RedactionRuleViewSet(TenantModelViewSet):
    """A tenant's redaction rules. A pattern is checked when it is saved: an invalid one is a 400."""

    serializer_class = RedactionRuleSerializer

    def perform_create(self, serializer):
        serializer.instance = redaction.redaction_rule_create(tenant=self.tenant, actor=acting_user(self.request),
                                                              **serializer.validated_data)

    def perform_update(self, serializer):
        serializer.instance = redaction.redaction_rule_update(rule=serializer.instance,
                                                              actor=acting_user(self.request),
                                                              **serializer.validated_data)

    def perform_destroy(self, instance):
        redaction.redaction_rule_delete(rule=instance, actor=acting_user(self.request))
