from django.db.models import Prefetch
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals import grants, notifications, selectors, services
from approvals.api import serializers as s
from approvals.models import ApprovalRequest, RequestStatus, ReviewerNotifySetting, Vote
from tenancy.api.base import TenantModelViewSet, TenantScopedViewSet
from tenancy.models import ApiKey, Scope
from tenancy.web import acting_user
from toolkeeper.openapi import CONFLICT
from tools.api.serializers import CallSerializer, DecisionSerializer, call_data
from tools.api.views import access_call


class RuleViewSet(TenantModelViewSet):
    serializer_class = s.RuleSerializer

    def safely_get_queryset(self, queryset):
        return queryset.select_related("queue")

    def perform_create(self, serializer):
        serializer.instance = services.rule_create(tenant=self.tenant, actor=acting_user(self.request),
                                                   **serializer.validated_data)

    def perform_update(self, serializer):
        serializer.instance = services.rule_update(rule=serializer.instance, actor=acting_user(self.request),
                                                   **serializer.validated_data)

    def perform_destroy(self, instance):
        services.rule_delete(rule=instance, actor=acting_user(self.request))

    @extend_schema(request=s.EvaluateSerializer, responses=DecisionSerializer)
    @action(detail=False, methods=["post"])
    def evaluate(self, request):
        """Decide a hypothetical call with the engine that decides real ones (bound arguments applied)."""
        query = s.EvaluateSerializer(data=request.data)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        agent, user, session = data["agent"], data["user"], None
        if data["session"] is not None:
            session = grants.session_of(tenant=self.tenant, session_id=data["session"])
            if session is None:
                raise ValidationError({"session": ["no such session"]})
            if agent and agent != session.agent:
                raise ValidationError({"agent": [f"the session is agent {session.agent!r}'s"]})
            agent, user = session.agent, user or session.user
        decision = selectors.simulate(tenant=self.tenant, tool_name=data["tool"], tool_input=data["input"],
                                      agent=agent, user=user, session=session)
        return Response(decision.as_dict())


class QueueViewSet(TenantModelViewSet):
    serializer_class = s.QueueSerializer

    def safely_get_queryset(self, queryset):
        return queryset.prefetch_related("reviewers", "escalation_reviewers")

    def perform_create(self, serializer):
        serializer.instance = services.queue_save(tenant=self.tenant, actor=acting_user(self.request),
                                                  **serializer.validated_data)

    def perform_update(self, serializer):
        serializer.instance = services.queue_save(tenant=self.tenant, queue=serializer.instance,
                                                  actor=acting_user(self.request), **serializer.validated_data)

    def perform_destroy(self, instance):
        services.queue_delete(queue=instance, actor=acting_user(self.request))


class ApprovalViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    serializer_class = s.ApprovalSerializer
    reviewer_actions = ("decide", "decide_many")

    @extend_schema(parameters=[OpenApiParameter(name, str) for name in ("status", "queue", "agent", "tool")])
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    def safely_get_queryset(self, queryset):
        params = self.request.query_params
        if self.action == "list":
            status = params.get("status", RequestStatus.PENDING)
            queryset = selectors.inbox_requests(tenant=self.tenant, statuses=[status], queue=params.get("queue", ""),
                                                agent=params.get("agent", ""), tool=params.get("tool", ""))
        votes = Prefetch("votes", queryset=Vote.objects.for_tenant(self.tenant).order_by("at"))
        return queryset.select_related("queue", "call", "call__session").prefetch_related(votes)

    @extend_schema(request=s.DecideSerializer, responses={200: s.ApprovalSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def decide(self, request, pk=None):
        approval: ApprovalRequest = self.get_object()
        body = s.DecideSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        add_rule = data["add_rule"] and data["decision"] in ("approve", "edit")
        if add_rule:
            # Checked before the vote, so a refused suggestion changes nothing.
            membership = getattr(request, "membership", None)
            if isinstance(request.auth, ApiKey) or membership is None or not membership.can_operate:
                raise PermissionDenied("adding rules needs an operator or admin login")
            blocking = services.rule_suggestion_blocked_by(approval)
            if blocking is not None:
                raise ValidationError({"add_rule": [f"rule #{blocking.pk} asks for every such call and ask beats "
                                                    "allow: change that rule instead"]})
        services.request_decide(request=approval, reviewer=request.user, decision=data["decision"],
                                new_input=data["input"], message=data["message"], grant=data["grant"])
        if add_rule:
            services.rule_from_approval(request=approval, actor=request.user, narrow_to_input=data["narrow_to_input"])
        return Response(s.ApprovalSerializer(self.get_queryset().get(pk=approval.pk)).data)

    @extend_schema(request=s.BulkDecideSerializer, responses={200: s.BulkOutcomeSerializer})
    @action(detail=False, methods=["post"], url_path="decide")
    def decide_many(self, request):
        """Approve or reject many requests, each decided on its own as `{id}/decide` would; the ones this reviewer
        may not decide are skipped with the reason (another tenant's id: "not found")."""
        body = s.BulkDecideSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        outcome = services.requests_decide_bulk(tenant=self.tenant, request_ids=data["ids"], reviewer=request.user,
                                                decision=data["decision"], message=data["message"])
        return Response({
            "decided": [{"id": approval.pk, "status": approval.status} for approval in outcome.decided],
            "skipped": [{"id": skipped.id, "reason": skipped.reason} for skipped in outcome.skipped],
        })


class GrantViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """Grants reviewers gave while approving (docs/governance.md, Grants), newest first; `revoke` ends one."""

    serializer_class = s.GrantSerializer
    reviewer_actions = ("revoke",)

    @extend_schema(parameters=[
        OpenApiParameter("session", str, description="a session's id: its grants only"),
        OpenApiParameter("active", bool, description="true: in force; false: revoked or expired"),
        OpenApiParameter("agent", str)])
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    def safely_get_queryset(self, queryset):
        if self.action != "list":
            return queryset.select_related("created_from")
        params = self.request.query_params
        session = None
        if params.get("session"):
            session = grants.session_of(tenant=self.tenant, session_id=params["session"])
            if session is None:
                raise ValidationError({"session": ["no such session"]})
        active = {"true": True, "false": False, "": None}.get(params.get("active", "").lower(), "?")
        if active == "?":
            raise ValidationError({"active": ["true or false"]})
        return grants.grants_list(tenant=self.tenant, session=session, active=active, agent=params.get("agent", ""))

    @extend_schema(request=None, responses={200: s.GrantSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        grant = services.grant_revoke(grant=self.get_object(), actor=request.user)
        return Response(s.GrantSerializer(grant).data)


class CallResultView(APIView):
    """An external system (or a script) posts the result of an external tool's call. A key with the `agent` scope
    may post the result of a call of a tool its app declared (for the session or the request), not of others."""

    required_scope = (Scope.EXTERNAL, Scope.AGENT)

    @extend_schema(request=s.ResultSerializer, responses={200: CallSerializer, 409: CONFLICT})
    def post(self, request, call_id):
        call = access_call(request, call_id)
        key = request.auth if isinstance(request.auth, ApiKey) else None
        if key is not None and not key.has_scope(Scope.EXTERNAL) and call.declared_tool is None:
            raise PermissionDenied("Only a key with the external scope posts the result of a catalog tool's call.")
        body = s.ResultSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        services.external_result_post(call=call, actor=request.user, state=data["state"], content=data["content"],
                                      structured=data["structured"])
        call.refresh_from_db()
        return Response(call_data(call))


class ChannelViewSet(TenantModelViewSet):
    """A queue's notification channels; `test` sends a test message (see the delivery log)."""

    serializer_class = s.ChannelSerializer

    def safely_get_queryset(self, queryset):
        queryset = queryset.select_related("queue")
        queue = self.request.query_params.get("queue")
        return queryset.filter(queue__name=queue) if queue else queryset

    def perform_create(self, serializer):
        data = dict(serializer.validated_data)
        serializer.instance = notifications.channel_save(queue=data.pop("queue"), actor=acting_user(self.request),
                                                         **data)

    def perform_update(self, serializer):
        data = dict(serializer.validated_data)
        queue = data.pop("queue", serializer.instance.queue)
        if queue.pk != serializer.instance.queue_id:
            raise ValidationError({"queue": ["a channel stays in its queue"]})
        serializer.instance = notifications.channel_save(queue=queue, channel=serializer.instance,
                                                         actor=acting_user(self.request), **data)

    def perform_destroy(self, instance):
        notifications.channel_delete(channel=instance, actor=acting_user(self.request))

    @extend_schema(request=None, responses={202: s.DeliverySerializer})
    @action(detail=True, methods=["post"])
    def test(self, request, pk=None):
        notification = notifications.channel_test(channel=self.get_object(), actor=request.user)
        return Response(s.DeliverySerializer(notification).data, status=202)


class DeliveryViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """The delivery log: every notification, newest first, with its status, attempts and last error."""

    serializer_class = s.DeliverySerializer

    @extend_schema(parameters=[OpenApiParameter(name, str) for name in ("queue", "channel", "status")])
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    def safely_get_queryset(self, queryset):
        params = self.request.query_params
        queryset = queryset.select_related("channel", "channel__queue")
        for param, field in (("queue", "channel__queue__name"), ("channel", "channel__name"), ("status", "status")):
            if params.get(param):
                queryset = queryset.filter(**{field: params[param]})
        return queryset


class ReviewerNotifyViewSet(TenantModelViewSet):
    """Reviewers' own notification settings (mute, channels opted out of), kept by an admin key."""

    serializer_class = s.ReviewerNotifySerializer

    def safely_get_queryset(self, queryset):
        return queryset.select_related("user").prefetch_related("excluded")

    def _save(self, serializer, user):
        data = serializer.validated_data
        instance = serializer.instance
        serializer.instance = notifications.reviewer_setting_save(
            tenant=self.tenant, user=user, muted=data.get("muted", instance.muted if instance else False),
            excluded=data.get("excluded", list(instance.excluded.all()) if instance else []))

    def perform_create(self, serializer):
        user = serializer.validated_data["user"]
        if ReviewerNotifySetting.objects.for_tenant(self.tenant).filter(user=user).exists():
            raise ValidationError({"user": ["this member has settings already: change them"]})
        self._save(serializer, user)

    def perform_update(self, serializer):
        user = serializer.validated_data.get("user", serializer.instance.user)
        if user.pk != serializer.instance.user_id:
            raise ValidationError({"user": ["settings stay with their member"]})
        self._save(serializer, user)
