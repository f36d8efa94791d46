from datetime import timedelta

from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from approvals.channel_kinds import channel_kind_choices
from approvals.models import (
    ApprovalRequest,
    Notification,
    NotificationChannel,
    PermissionRule,
    Queue,
    ReviewerNotifySetting,
    RuleBehavior,
    VoteDecision,
)
from approvals.notifications import CHANNEL_EVENTS
from common import serializers as strict
from tenancy.models import Membership


class TenantQueueField(serializers.SlugRelatedField):
    def __init__(self, **kwargs):
        super().__init__(slug_field="name", **kwargs)

    def get_queryset(self):
        return Queue.objects.for_tenant(self.context["tenant"])


class MemberField(serializers.SlugRelatedField):
    """Users named by username, among the tenant's members only."""

    def __init__(self, **kwargs):
        super().__init__(slug_field="username", **kwargs)

    def get_queryset(self):
        members = Membership.objects.filter(tenant=self.context["tenant"]).values("user_id")
        return get_user_model().objects.filter(pk__in=members)


MAX_SECONDS = 90 * 86400


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": MAX_SECONDS, "nullable": True})
class SecondsField(serializers.IntegerField):
    """A duration as whole seconds, 1 s to 90 days."""

    MAX_S = MAX_SECONDS

    def __init__(self, **kwargs):
        super().__init__(allow_null=True, required=False, **kwargs)

    def to_representation(self, value):
        return int(value.total_seconds()) if value is not None else None

    def to_internal_value(self, data):
        if data is None:
            return None
        seconds = super().to_internal_value(data)
        if not 1 <= seconds <= self.MAX_S:
            raise serializers.ValidationError(f"between 1 and {self.MAX_S} seconds")
        return timedelta(seconds=seconds)


GLOBS = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]}


@extend_schema_field({"type": "object", "additionalProperties": GLOBS,
                      "description": "argument name → glob, or → list of globs; every entry must match"})
class ArgMatchField(serializers.DictField):
    """Checked in full by the rule service."""


def names_field(help_text: str) -> serializers.ListField:
    return serializers.ListField(child=serializers.CharField(trim_whitespace=False), required=False,
                                 help_text=help_text)


class RuleSerializer(strict.ModelSerializer):
    queue = TenantQueueField(required=False, allow_null=True)
    behavior = serializers.ChoiceField(choices=RuleBehavior.choices)
    arg_match = ArgMatchField(required=False)
    agents = names_field("agent names; empty means every agent")
    users = names_field("session users; empty means every user")
    user_verified = serializers.BooleanField(
        required=False, allow_null=True, default=None,
        help_text="true: the rule holds only for calls of a user Toolkeeper verified (an OAuth client's person, an "
                  "ID token); false: only for calls without one; null: for either")

    class Meta:
        model = PermissionRule
        fields = ["id", "behavior", "tool_pattern", "arg_match", "agents", "users", "user_verified", "queue",
                  "priority", "enabled", "note", "created_at", "updated_at"]


class EvaluateSerializer(strict.Serializer):
    tool = serializers.CharField(max_length=128)
    input = serializers.DictField(required=False, default=dict)
    agent = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    user = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class QueueSerializer(strict.ModelSerializer):
    reviewers = MemberField(many=True, required=False)
    escalation_reviewers = MemberField(many=True, required=False)
    expires_after = SecondsField()
    escalate_after = SecondsField()
    required_approvals = serializers.IntegerField(min_value=1, max_value=20, required=False)

    class Meta:
        model = Queue
        fields = ["id", "name", "description", "reviewers", "required_approvals", "four_eyes", "verified_requesters",
                  "expires_after", "escalate_after", "escalation_reviewers", "is_default", "created_at"]


class ApprovalSerializer(serializers.ModelSerializer):
    queue = serializers.CharField(source="queue.name", allow_null=True, default=None)
    call = serializers.SerializerMethodField()
    votes = serializers.SerializerMethodField()
    tool = serializers.CharField(source="tool_name")

    class Meta:
        model = ApprovalRequest
        fields = ["id", "status", "queue", "agent", "tool", "rule", "reason", "opened_at", "expires_at",
                  "escalated_at", "decided_at", "votes", "call"]

    def get_call(self, request) -> dict:
        call = request.call
        return {"id": str(call.pk), "call_id": call.call_id, "session": str(call.session_id), "input": call.input,
                "status": call.status, "user": call.session.user}

    def get_votes(self, request) -> list:
        return [{"reviewer": v.reviewer_label, "decision": v.decision, "message": v.message, "input": v.input,
                 "at": v.at} for v in request.votes.all()]


class DecideSerializer(strict.Serializer):
    decision = serializers.ChoiceField(choices=VoteDecision.choices)
    input = serializers.JSONField(required=False, allow_null=True, default=None,
                                  help_text="edit: the input to run instead; respond: a structured answer")
    message = serializers.CharField(required=False, allow_blank=True, default="", max_length=10000,
                                    help_text="the reviewer's note to the model; respond needs a message or an input")
    add_rule = serializers.BooleanField(required=False, default=False,
                                        help_text="also add the suggested rule: always allow this tool for this agent")
    narrow_to_input = serializers.BooleanField(required=False, default=False)


@extend_schema_field({"type": "object", "properties": {"type": {"type": "string", "enum": ["text"]},
                                                        "text": {"type": "string"}}, "required": ["type", "text"]})
class TextPartField(serializers.DictField):
    """Checked by ResultSerializer.validate_content."""


class ResultSerializer(strict.Serializer):
    state = serializers.ChoiceField(choices=["success", "error"])
    content = serializers.ListField(child=TextPartField(), required=False, default=list, max_length=100)
    structured = serializers.JSONField(required=False, allow_null=True, default=None)

    def validate_content(self, value):
        for part in value:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise serializers.ValidationError('each part is {"type": "text", "text": "..."}')
        return value


class ChannelSerializer(strict.ModelSerializer):
    """A queue's notification channel. `url` and `signing_secret` are write-only: never in a response; left out of
    an update, they stay as they are."""

    queue = TenantQueueField()
    kind = serializers.ChoiceField(choices=[])
    events = serializers.ListField(child=serializers.ChoiceField(choices=CHANNEL_EVENTS), min_length=1)
    url = serializers.CharField(write_only=True, required=False, max_length=2000)
    signing_secret = serializers.CharField(write_only=True, required=False, max_length=200,
                                           style={"input_type": "password"})

    class Meta:
        model = NotificationChannel
        fields = ["id", "queue", "name", "kind", "url", "signing_secret", "host", "events", "quiet_from",
                  "quiet_until", "action_links", "enabled", "created_at"]
        read_only_fields = ["host", "created_at"]
        validators = []  # the service checks the name's uniqueness in the queue

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["kind"].choices = channel_kind_choices()  # the kinds registered when the serializer is used


class DeliverySerializer(serializers.ModelSerializer):
    channel = serializers.CharField(source="channel.name")
    queue = serializers.CharField(source="channel.queue.name")

    class Meta:
        model = Notification
        fields = ["id", "queue", "channel", "event", "request", "recipient", "status", "attempts", "next_attempt_at",
                  "last_error", "created_at", "sent_at"]


class TenantChannelField(serializers.PrimaryKeyRelatedField):
    def get_queryset(self):
        return NotificationChannel.objects.for_tenant(self.context["tenant"])


class ReviewerNotifySerializer(strict.ModelSerializer):
    user = MemberField()
    excluded = TenantChannelField(many=True, required=False)

    class Meta:
        model = ReviewerNotifySetting
        fields = ["id", "user", "muted", "excluded"]
        validators = []  # one per member: the view refuses a second
