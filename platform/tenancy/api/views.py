"""The tenant's own settings through the admin API: its rate limits, and how it decides and runs calls."""
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from common.serializers import Serializer as StrictSerializer
from tenancy.models import Behavior, Scope, ToolSurface
from tenancy.services import (
    GOVERNANCE_FIELDS,
    LIMIT_FIELDS,
    LIMIT_MAX,
    PARALLEL_MAX,
    tenant_governance_set,
    tenant_limits_set,
)


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


class GovernanceSerializer(StrictSerializer):
    default_behavior = serializers.ChoiceField(
        choices=Behavior.choices, required=False, help_text="the decision of a call that no rule decides")
    auto_allow_read_only = serializers.BooleanField(
        required=False, help_text="read-only tools of trusted sources run unless a deny or ask rule matches")
    review_untrusted = serializers.BooleanField(
        required=False, help_text="a call of an untrusted MCP server's tool that no rule decides asks a reviewer, "
                                  "even when the default is allow")
    max_parallel_calls = serializers.IntegerField(
        min_value=1, max_value=PARALLEL_MAX, required=False, help_text="the tenant's calls that run at once")
    tool_surface = serializers.ChoiceField(
        choices=ToolSurface.choices, required=False,
        help_text="what a session is listed: its whole surface (`full`), or the core and the tool search (`search`)")


def governance_data(tenant) -> dict:
    return {name: getattr(tenant, name) for name in GOVERNANCE_FIELDS}


class GovernanceView(APIView):
    """How the tenant decides and runs calls, and what a session is listed (docs/governance.md); each change is
    audited."""

    required_scope = Scope.ADMIN

    @extend_schema(responses=GovernanceSerializer)
    def get(self, request):
        return Response(governance_data(request.tenant))

    @extend_schema(request=GovernanceSerializer, responses=GovernanceSerializer)
    def patch(self, request):
        serializer = GovernanceSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        tenant_governance_set(tenant=request.tenant, actor=request.user, **serializer.validated_data)
        return Response(governance_data(request.tenant))
