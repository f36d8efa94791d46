from rest_framework import serializers

from tools.models import AgentSession, BoundArgument, CallEvent, Tool, ToolCall, ToolGroup
from tools.registry import annotate_calls
from tools.selectors import FORMATS


class SessionCreateSerializer(serializers.Serializer):
    agent = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    user = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    context = serializers.DictField(required=False, default=dict)


class SessionSerializer(serializers.ModelSerializer):
    class Meta:
        model = AgentSession
        fields = ["id", "agent", "user", "context", "active_groups", "created_at"]


class ToolsQuerySerializer(serializers.Serializer):
    format = serializers.ChoiceField(choices=FORMATS, default="openai")


class CallSpecSerializer(serializers.Serializer):
    id = serializers.CharField(max_length=128, required=False, allow_blank=False)
    name = serializers.CharField(max_length=128)
    input = serializers.JSONField(required=False, default=dict)

    def validate_input(self, value):
        if not isinstance(value, dict):
            raise serializers.ValidationError("must be a JSON object")
        return value


class CallBatchSerializer(serializers.Serializer):
    """One call, or a batch under `calls`, with an optional `wait` in seconds."""

    calls = CallSpecSerializer(many=True, required=False)
    id = serializers.CharField(max_length=128, required=False)
    name = serializers.CharField(max_length=128, required=False)
    input = serializers.JSONField(required=False)
    wait = serializers.FloatField(required=False, default=0, min_value=0, max_value=60)

    def validate(self, attrs):
        from django.conf import settings

        if "calls" in attrs:
            if any(key in attrs for key in ("id", "name", "input")):
                raise serializers.ValidationError("send either one call or a `calls` list, not both")
            calls = attrs["calls"]
            if not calls:
                raise serializers.ValidationError({"calls": ["send at least one call"]})
            if len(calls) > settings.TOOLKEEPER_MAX_BATCH:
                raise serializers.ValidationError({"calls": [f"at most {settings.TOOLKEEPER_MAX_BATCH} calls"]})
        else:
            single = CallSpecSerializer(data={k: v for k, v in self.initial_data.items() if k != "wait"})
            single.is_valid(raise_exception=True)
            calls = [single.validated_data]
        return {"calls": [dict(call) for call in calls], "wait": attrs.get("wait", 0)}


class CallSerializer(serializers.ModelSerializer):
    tool = serializers.CharField(source="tool_name")
    approval = serializers.SerializerMethodField()

    class Meta:
        model = ToolCall
        fields = ["id", "call_id", "session", "tool", "input", "status", "decision", "result", "error",
                  "approval", "created_at", "finished_at"]

    def get_approval(self, call) -> dict | None:
        return self.context.get("extras", {}).get(call.pk, {}).get("approval")

    def to_representation(self, call) -> dict:
        # The hottest serializer of the API: built by hand, field by field as declared above.
        return {
            "id": str(call.pk), "call_id": call.call_id, "session": str(call.session_id), "tool": call.tool_name,
            "input": call.input, "status": call.status, "decision": call.decision, "result": call.result,
            "error": call.error, "approval": self.get_approval(call),
            "created_at": _timestamp(call.created_at), "finished_at": _timestamp(call.finished_at),
        }


def _timestamp(value) -> str | None:
    """As DRF's DateTimeField renders UTC times."""
    if value is None:
        return None
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def calls_data(calls) -> list[dict]:
    """Calls as the API shows them, with what other apps add (approval requests) in one query each."""
    calls = list(calls)
    return CallSerializer(calls, many=True, context={"extras": annotate_calls(calls)}).data


def call_data(call) -> dict:
    return calls_data([call])[0]


class CallEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = CallEvent
        fields = ["seq", "kind", "data", "at"]


class WaitQuerySerializer(serializers.Serializer):
    wait = serializers.FloatField(required=False, default=0, min_value=0, max_value=60)


class EventsQuerySerializer(serializers.Serializer):
    after = serializers.IntegerField(required=False, default=0, min_value=0)


class ToolSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tool
        fields = ["id", "name", "description", "input_schema", "output_schema", "source", "source_ref",
                  "read_only", "destructive", "idempotent", "concurrency_safe", "timeout_s", "enabled"]
        read_only_fields = ["name", "input_schema", "output_schema", "source", "source_ref", "read_only",
                            "destructive", "idempotent", "concurrency_safe", "description"]
        extra_kwargs = {"timeout_s": {"min_value": 0.1, "max_value": 86400}}


class ExternalToolSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=64)
    description = serializers.CharField(allow_blank=True, default="", max_length=4000)
    input_schema = serializers.DictField()
    read_only = serializers.BooleanField(default=False)
    destructive = serializers.BooleanField(default=False)
    idempotent = serializers.BooleanField(default=False)
    timeout_s = serializers.FloatField(default=30, min_value=0.1, max_value=86400)


class TenantToolField(serializers.SlugRelatedField):
    """Tools named by name, looked up in the request's tenant only."""

    def __init__(self, **kwargs):
        super().__init__(slug_field="name", **kwargs)

    def get_queryset(self):
        return Tool.objects.for_tenant(self.context["tenant"])


class GroupSerializer(serializers.ModelSerializer):
    tools = TenantToolField(many=True, required=False)

    class Meta:
        model = ToolGroup
        fields = ["id", "name", "description", "notes", "default_active", "switchable", "tools", "created_at"]


class BindingSerializer(serializers.ModelSerializer):
    tool = TenantToolField()
    value = serializers.JSONField(help_text="null (and value_hidden true) for reviewers and viewers")
    value_hidden = serializers.SerializerMethodField()

    class Meta:
        model = BoundArgument
        fields = ["id", "tool", "agent", "name", "value", "value_hidden", "created_at"]
        # binding_set replaces an existing binding; DRF's generated uniqueness check would also
        # query without the tenant.
        validators = []

    def get_value_hidden(self, binding) -> bool:
        return not self.context.get("sees_secrets", False)

    def to_representation(self, binding) -> dict:
        data = super().to_representation(binding)
        if data["value_hidden"]:
            data["value"] = None
        return data
