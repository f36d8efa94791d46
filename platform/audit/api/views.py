from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.models import Event
from audit.selectors import BROKEN, INTACT, UNSIGNED, UNVERIFIABLE, audit_check
from tenancy.api.base import TenantScopedViewSet
from tenancy.models import Scope


class EventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label")

    class Meta:
        model = Event
        fields = ["id", "at", "actor", "verb", "target", "data", "hash", "strand"]


class AuditViewSet(mixins.ListModelMixin, TenantScopedViewSet):
    serializer_class = EventSerializer

    def safely_get_queryset(self, queryset):
        if target := self.request.query_params.get("target"):
            queryset = queryset.filter(target=target)
        return queryset


class StrandHeadSerializer(serializers.Serializer):
    strand = serializers.IntegerField()
    count = serializers.IntegerField()
    last_id = serializers.IntegerField(allow_null=True, help_text="The strand's newest entry.")
    hash = serializers.CharField(allow_blank=True, help_text="That entry's hash (empty for an empty strand).")


class HeadSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="Entries in all strands.")
    hash = serializers.CharField(help_text="One hash of every strand's head as it stands.")
    signed = serializers.BooleanField()
    strands = StrandHeadSerializer(many=True, help_text=(
        "Each strand's head. Noted elsewhere, each can be checked later: the strand still has at least that many "
        "entries, and its entry `last_id` (in `GET /api/v1/audit`) still has that hash."))


class ChainCheckSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=[INTACT, BROKEN, UNSIGNED, UNVERIFIABLE])
    intact = serializers.BooleanField()
    entries = serializers.IntegerField(help_text="Entries checked.")
    entry = serializers.IntegerField(allow_null=True, help_text="The first bad entry's id, when broken.")
    message = serializers.CharField()
    keyed = serializers.BooleanField()
    head = HeadSerializer(help_text="Note the head's count and hash elsewhere to pin the log as it stands.")


class AuditVerifyView(APIView):
    """Verify the tenant's audit chain (the same check as `manage.py verify_audit`)."""

    required_scope = Scope.ADMIN

    @extend_schema(responses=ChainCheckSerializer)
    def get(self, request):
        check = audit_check(tenant=request.tenant)
        return Response({
            "status": check.status, "intact": check.intact, "entries": check.entries, "entry": check.entry,
            "message": check.summary(), "keyed": check.keyed or check.head_signed,
            "head": {"count": check.head_count, "hash": check.head_hash, "signed": check.head_signed,
                     "strands": [{"strand": strand, "count": count, "last_id": last_id, "hash": digest}
                                 for strand, count, last_id, digest in check.heads]},
        })
