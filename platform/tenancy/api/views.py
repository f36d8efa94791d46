"""The tenant's own settings through the admin API: its rate limits."""
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from tenancy.models import Scope
from tenancy.services import LIMIT_FIELDS, LIMIT_MAX, tenant_limits_set


class LimitsSerializer(serializers.Serializer):
    key_requests_per_minute = serializers.IntegerField(min_value=0, max_value=LIMIT_MAX, required=False)
    tenant_requests_per_minute = serializers.IntegerField(min_value=0, max_value=LIMIT_MAX, required=False)
    key_calls_in_flight = serializers.IntegerField(min_value=0, max_value=LIMIT_MAX, required=False)
    tenant_calls_in_flight = serializers.IntegerField(min_value=0, max_value=LIMIT_MAX, required=False)


def limits_data(tenant) -> dict:
    return {name: getattr(tenant, name) for name in LIMIT_FIELDS}


class LimitsView(APIView):
    """Requests per minute and calls in flight, per API key and for the whole tenant; 0 is no limit."""

    required_scope = Scope.ADMIN

    @extend_schema(responses=LimitsSerializer)
    def get(self, request):
        return Response(limits_data(request.tenant))

    @extend_schema(request=LimitsSerializer, responses=LimitsSerializer)
    def patch(self, request):
        serializer = LimitsSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        tenant_limits_set(tenant=request.tenant, actor=request.user, **serializer.validated_data)
        return Response(limits_data(request.tenant))
