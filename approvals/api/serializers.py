from datetime import timedelta

from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from approvals.channel_kinds import channel_kind_choices
from approvals.grants import SCOPES, is_in_force
from approvals.models import (
    ApprovalRequest,
    Grant,
    Notification,
    NotificationChannel,
    PermissionRule,
    Queue,
    ReviewerNotifySetting,
    RuleBehavior,
    VoteDecision,
)
from approvals.notifications import CHANNEL_EVENTS
from approvals.services import BULK_DECISIONS, BULK_MAX
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
    session = serializers.UUIDField(required=False, allow_null=True, default=None,
                                    help_text="a session of the agent: its grants apply too (agent and user default "
                                              "to the session's)")


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


@extend_schema_field({
    "type": "object", "nullable": True, "additionalProperties": False, "required": ["scope"],
    "properties": {"scope": {"type": "string", "enum": list(SCOPES)},
                   "duration_s": {"type": "integer", "minimum": 60, "maximum": 30 * 86400},
                   "arg_match": {"type": "object", "additionalProperties": GLOBS}},
    "description": "approve or edit: also let such calls through without asking: once (nothing more), for this "
                   "session, for duration_s seconds, or for inputs matching arg_match (docs/governance.md, Grants)"})
class GrantSpecField(serializers.JSONField):
    """Checked in full by `services.request_decide`."""


class DecideSerializer(strict.Serializer):
    decision = serializers.ChoiceField(choices=VoteDecision.choices)
    input = serializers.JSONField(required=False, allow_null=True, default=None,
                                  help_text="edit: the input to run instead; respond: a structured answer")
    message = serializers.CharField(required=False, allow_blank=True, default="", max_length=10000,
                                    help_text="the reviewer's note to the model; respond needs a message or an input")
    add_rule = serializers.BooleanField(required=False, default=False,
                                        help_text="also add the suggested rule: always allow this tool for this agent")
    narrow_to_input = serializers.BooleanField(required=False, default=False)
    grant = GrantSpecField(required=False, allow_null=True, default=None)


class BulkDecideSerializer(strict.Serializer):
    ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2 ** 63 - 1), allow_empty=False, min_length=1,
        max_length=BULK_MAX, help_text=f"the approval requests to decide, each on its own (at most {BULK_MAX})",
        error_messages={"max_length": f"at most {BULK_MAX} requests at a time: narrow the list with its filters",
                        "empty": "name at least one request"})
    decision = serializers.ChoiceField(choices=list(BULK_DECISIONS))
    message = serializers.CharField(required=False, allow_blank=True, default="", max_length=10000,
                                    help_text="the reviewer's note; reject: the message for the model")


class BulkSkippedSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    reason = serializers.CharField()


class BulkDecidedSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    status = serializers.CharField(help_text="pending: the vote is recorded and the request waits for more approvals")


class BulkOutcomeSerializer(serializers.Serializer):
    decided = BulkDecidedSerializer(many=True)
    skipped = BulkSkippedSerializer(many=True)


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
    slack_signing_secret = serializers.CharField(write_only=True, required=False, max_length=200,
                                                 style={"input_type": "password"},
                                                 help_text="a Slack channel's Slack signing secret: interactive "
                                                           "messages (write-only)")

    class Meta:
        model = NotificationChannel
        fields = ["id", "queue", "name", "kind", "url", "signing_secret", "slack_signing_secret", "host", "events",
                  "quiet_from", "quiet_until", "action_links", "enabled", "public_id", "created_at"]
        read_only_fields = ["host", "public_id", "created_at"]
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


class GrantSerializer(serializers.ModelSerializer):
    session = serializers.UUIDField(source="session_id", allow_null=True, read_only=True)
    created_by = serializers.CharField(source="created_by_label", read_only=True)
    revoked_by = serializers.CharField(source="revoked_by_label", read_only=True)
    request = serializers.IntegerField(source="created_from_id", allow_null=True, read_only=True)
    call = serializers.SerializerMethodField()
    active = serializers.SerializerMethodField()

    class Meta:
        model = Grant
        fields = ["id", "agent", "tool_name", "scope", "session", "arg_match", "ask_rule", "expires_at", "active",
                  "created_by", "created_at", "request", "call", "revoked_at", "revoked_by", "uses", "last_used_at"]
        read_only_fields = fields

    def get_call(self, grant) -> str | None:
        """The call whose approval gave it."""
        request = grant.created_from
        return str(request.call_id) if request is not None else None

    def get_active(self, grant) -> bool:
        """Neither revoked nor expired."""
        return is_in_force(grant)
