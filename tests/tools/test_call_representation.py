"""The hand-written call representation matches what DRF's generic fields would render."""
import json

from rest_framework import serializers
from rest_framework.renderers import JSONRenderer

from tools.api.serializers import CallSerializer, calls_data
from tools.models import ToolCall


class GenericCallSerializer(serializers.ModelSerializer):
    tool = serializers.CharField(source="tool_name")
    approval = serializers.SerializerMethodField()
    trace_id = serializers.SerializerMethodField()  # an untraced call's empty id is null

    class Meta:
        model = ToolCall
        fields = CallSerializer.Meta.fields

    def get_approval(self, call):
        return None

    def get_trace_id(self, call):
        return call.trace_id or None


def test_hand_written_representation_equals_the_generic_one(world):
    calls = list(ToolCall.objects.for_tenant(world.a.tenant)) + list(ToolCall.objects.for_tenant(world.b.tenant))
    assert len(calls) == 4
    calls[0].trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"  # a traced call shows its id
    def rendered(data):
        return json.loads(JSONRenderer().render(data))

    generic = rendered(GenericCallSerializer(calls, many=True).data)
    assert rendered(CallSerializer(calls, many=True).data) == generic
    assert rendered(calls_data(calls)) == generic  # what the calls endpoints answer
    finished = [c for c in calls if c.finished_at is not None]
    assert finished and all(CallSerializer(c).data["finished_at"].endswith("Z") for c in finished)
    assert [c["trace_id"] for c in generic] == ["4bf92f3577b34da6a3ce929d0e0e4736", None, None, None]
