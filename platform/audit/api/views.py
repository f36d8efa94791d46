from rest_framework import mixins, serializers

from audit.models import Event
from tenancy.api.base import TenantScopedViewSet


class EventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label")

    class Meta:
        model = Event
        fields = ["id", "at", "actor", "verb", "target", "data", "hash"]


class AuditViewSet(mixins.ListModelMixin, TenantScopedViewSet):
    serializer_class = EventSerializer

    def safely_get_queryset(self, queryset):
        if target := self.request.query_params.get("target"):
            queryset = queryset.filter(target=target)
        return queryset
