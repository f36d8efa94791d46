"""The app-facing API of ../shared/API.md, and the admin endpoints for tools, groups, bindings and MCP servers."""
from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from common.api import exception_handler
from common.errors import ServiceError
from tenancy.api.base import TenantModelViewSet, TenantScopedViewSet
from tenancy.grants import Grant, grant_of
from tenancy.models import ApiKey, Scope
from tenancy.permissions import sees_secrets
from tenancy.selectors import (
    access_object,
    access_row,
    key_sees_agent,
    key_sessions,
    member_with_email,
    versions_read_with,
)
from tenancy.signin.provider import ProviderUnreachable, TokenRefused, id_token_user, sso_enabled
from tenancy.versions import versions_known
from tenancy.web import acting_user
from toolkeeper.openapi import CONFLICT
from tools.api import serializers as s
from tools.calls import questions
from tools.calls import submit as tool_calls
from tools.calls.runtime import runtime
from tools.calls.waiting import WaitPlan, run_db
from tools.catalog import declared, selectors, services
from tools.models import SETTLED_STATUSES, TERMINAL_STATUSES, AgentSession, Tool, ToolCall
from tools.upstream import definitions
from tools.upstream import servers as mcp_servers


def access_session(request, session_id) -> AgentSession:
    """The session, if it is the request's tenant's and one its API key may see (tenancy.selectors.key_sessions)."""
    api_key = request.auth if isinstance(request.auth, ApiKey) else None
    session = access_row(AgentSession, request.tenant, session_id,
                         allowed=api_key and (lambda row: key_sees_agent(api_key, row.agent)))
    session.tenant = request.tenant  # already loaded with the key: save the query
    return session


def access_call(request, call_id) -> ToolCall:
    conditions = [key_sessions(request.auth, prefix="session__")] if isinstance(request.auth, ApiKey) else []
    return access_object(ToolCall, request.tenant, call_id, *conditions)


def calls_payload(calls: list[ToolCall]) -> dict:
    return {"calls": s.calls_data(calls)}  # reads what other apps add (approval requests)


def call_payload(calls: list[ToolCall]) -> dict:
    return s.calls_data(calls)[0]


class IdentityProviderUnavailable(APIException):
    status_code = 503
    default_code = "unavailable"
    default_detail = "The identity provider cannot be reached to verify the ID token; retry."


def verified_user(id_token: str, *, named: str) -> str:
    """The session's user an end user's ID token vouches for (docs/identity.md, "Verified users"); a 400 naming
    `user_id_token` for a token that does not verify, or that names someone else than `named`."""
    if not sso_enabled():
        raise ValidationError({"user_id_token": ["this deployment has no identity provider to verify ID tokens with"]})
    try:
        user = id_token_user(id_token)
    except TokenRefused as exc:
        raise ValidationError({"user_id_token": [str(exc)]}) from None
    except ProviderUnreachable:
        raise IdentityProviderUnavailable() from None
    if named and named.strip().lower() != user.lower():
        raise ValidationError({"user": ["the ID token vouches for someone else: leave `user` out, or name them"]})
    return user


class AgentView(APIView):
    required_scope = Scope.AGENT


class SessionCreateView(AgentView):
    @extend_schema(request=s.SessionCreateSerializer, responses={201: s.SessionSerializer})
    def post(self, request):
        api_key = request.auth if isinstance(request.auth, ApiKey) else None
        serializer = s.SessionCreateSerializer(data=request.data, agent_locked=bool(api_key and api_key.agent))
        serializer.is_valid(raise_exception=True)
        values = dict(serializer.validated_data)
        id_token = values.pop("user_id_token", None)
        if id_token is not None:
            user = verified_user(id_token, named=values.get("user", ""))
            values.update(user=user, user_verified=True, person=member_with_email(request.tenant, user))
        session = declared.session_create_declaring(tenant=request.tenant, api_key=api_key, **values)
        return Response(s.SessionSerializer(session).data, status=201)


class SessionDetailView(AgentView):
    @extend_schema(responses=s.SessionSerializer)
    def get(self, request, session_id):
        return Response(s.SessionSerializer(access_session(request, session_id)).data)

    @extend_schema(request=s.SessionToolsSerializer, responses=s.SessionSerializer)
    def patch(self, request, session_id):
        """Change the tools the app declared for the session (`tools` replaces the list) or their mode."""
        session = access_session(request, session_id)
        body = s.SessionToolsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        api_key = request.auth if isinstance(request.auth, ApiKey) else None
        declared.session_tools_declare(session=session, tools=data.get("tools", session.declared_tools),
                                       mode=data.get("tools_mode", session.declared_mode), api_key=api_key)
        return Response(s.SessionSerializer(session).data)


class SessionToolsView(AgentView):
    @extend_schema(parameters=[s.ToolsQuerySerializer], responses=s.ToolListSerializer)
    def get(self, request, session_id):
        session = access_session(request, session_id)
        # A plain dict: DRF would read an empty parameter (`?format=`) as absent, as for an HTML form.
        query = s.ToolsQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        return Response({"tools": selectors.session_tools(session, query.validated_data["format"])})


class SessionPromptView(AgentView):
    @extend_schema(responses=s.PromptSerializer)
    def get(self, request, session_id):
        return Response({"text": selectors.session_prompt(access_session(request, session_id))})


class CallSubmitView(AgentView):
    @extend_schema(request=s.CALL_SUBMIT_REQUEST, responses={200: s.CallListSerializer, 409: CONFLICT})
    def post(self, request, session_id):
        session = access_session(request, session_id)
        if not isinstance(request.data, dict):
            raise ValidationError("send a JSON object: one call, or {\"calls\": [...]}")
        validated = s.one_call_validated(request.data)
        if validated is None:
            batch = s.CallBatchSerializer(data=request.data)
            batch.is_valid(raise_exception=True)
            validated = batch.validated_data
        api_key = request.auth if isinstance(request.auth, ApiKey) else None
        wait = validated["wait"]
        request_tools = declared.request_declarations(session=session, tools=validated["tools"],
                                                      mode=validated["tools_mode"]) if "tools" in validated else None
        with versions_known(session.tenant_id, *versions_read_with(api_key)):
            calls = tool_calls.calls_submit(session=session, calls=validated["calls"], api_key=api_key,
                                            declared=request_tools, traceparent=request.headers.get("traceparent"))
        plan = WaitPlan(tenant_id=session.tenant_id, session_ids={session.pk}, calls=calls, timeout=wait,
                        until=SETTLED_STATUSES, grant=grant_of(request), render=calls_payload,
                        offline=s.calls_data_offline)
        # A call still to settle is waited for; the async front then builds the answer itself.
        response = Response({} if plan.waits() else {"calls": s.calls_data(calls)})
        response.wait_plan = plan
        return response


class CallDetailView(AgentView):
    required_scope = (Scope.AGENT, Scope.ADMIN)  # operators follow work they started, too

    @extend_schema(parameters=[s.WaitQuerySerializer], responses=s.CallSerializer)
    def get(self, request, call_id):
        call = access_call(request, call_id)
        query = s.WaitQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        plan = WaitPlan(tenant_id=call.tenant_id, session_ids={call.session_id}, calls=[call],
                        timeout=query.validated_data["wait"], until=TERMINAL_STATUSES, grant=grant_of(request),
                        render=call_payload, offline=s.calls_data_offline)
        response = Response({} if plan.waits() else s.call_data(call))
        response.wait_plan = plan
        return response


class CallEventsView(AgentView):
    required_scope = (Scope.AGENT, Scope.ADMIN)

    @extend_schema(parameters=[s.EventsQuerySerializer], responses=s.EventListSerializer)
    def get(self, request, call_id):
        call = access_call(request, call_id)
        query = s.EventsQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        events = selectors.call_events(call, after=query.validated_data["after"])[:1000]
        return Response({"events": s.CallEventSerializer(events, many=True).data})


class CallCancelView(AgentView):
    @extend_schema(request=None, responses={200: s.CallSerializer, 409: CONFLICT})
    def post(self, request, call_id):
        call = access_call(request, call_id)
        return Response(s.call_data(tool_calls.call_cancel(call=call, actor=acting_user(request))))


class CallAnswerView(AgentView):
    """The session's own user answers the question of a call that is `awaiting_user` (docs/api.md). Where the
    session's user is a verified person, only that person answers: their console login here (an app's key
    cannot speak for them), or their own client over /mcp/."""

    action = "answer"
    reviewer_actions = ("answer",)  # a console login: any member who reviews, then only the session's person

    @extend_schema(request=s.CallAnswerSerializer, responses={200: s.CallSerializer, 409: CONFLICT})
    def post(self, request, call_id):
        call = access_call(request, call_id)
        body = s.CallAnswerSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        questions.answer_permitted(session=call.session, api_key=request.auth if isinstance(request.auth, ApiKey)
                                   else None, user=None if isinstance(request.auth, ApiKey) else request.user)
        answered = questions.call_answer(call=call, action=body.validated_data["action"],
                                         content=body.validated_data["content"], actor=acting_user(request))
        return Response(s.call_data(answered))


def _render(view, request, *args, **kwargs):
    response = view(request, *args, **kwargs)
    if hasattr(response, "render"):
        response.render()
    return response


def waiting(view_class):
    """An async front for a DRF view whose response may declare calls to wait for (`response.wait_plan`).

    The runtime's waiter (`tools.calls.waiting`) arms its watch before the view runs, keyed by the session or
    call id in the URL, then waits and renders the answer; a wait refused because the request's key was
    revoked or its user's membership removed answers as that refusal.
    """
    inner = view_class.as_view()

    async def view(request, *args, **kwargs):
        waiter = runtime().waiter
        with waiter.watching(kwargs.get("session_id") or kwargs.get("call_id")) as watch:
            response = await run_db(_render, inner, request, *args, **kwargs)
            plan: WaitPlan | None = getattr(response, "wait_plan", None)
            if plan is None or response.status_code >= 300 or not plan.waits():
                return response
            answer = await waiter.answer(plan, watch)
        if answer.refused:
            return _refusal(plan.grant)
        return _json(answer.payload, response.status_code)

    view.cls = view_class  # lets the schema generator describe the DRF view behind it
    view.initkwargs = {}
    view.view_class = view_class
    return csrf_exempt(view)


def _json(payload, status: int) -> HttpResponse:
    return HttpResponse(JSONRenderer().render(payload), status=status, content_type="application/json")


def _refusal(grant: Grant) -> HttpResponse:
    refused = exception_handler(grant.refusal(), {})
    response = _json(refused.data, refused.status_code)
    if refused.has_header("WWW-Authenticate"):
        response["WWW-Authenticate"] = refused["WWW-Authenticate"]
    return response


# --- admin endpoints ---------------------------------------------------------------------------

class ToolViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.UpdateModelMixin,
                  TenantScopedViewSet):
    serializer_class = s.ToolSerializer
    lookup_field = "pk"

    @extend_schema(request=s.ExternalToolSerializer, responses={201: s.ToolSerializer})
    def create(self, request):
        """Define an external (schema-only) tool."""
        body = s.ExternalToolSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        tool = services.tool_external_create(tenant=self.tenant, actor=acting_user(request), **body.validated_data)
        return Response(s.ToolSerializer(tool).data, status=201)

    def perform_update(self, serializer):
        changes = {k: v for k, v in serializer.validated_data.items()}
        serializer.instance = services.tool_update(tool=serializer.instance, actor=acting_user(self.request), **changes)


class GroupViewSet(TenantModelViewSet):
    serializer_class = s.GroupSerializer

    def safely_get_queryset(self, queryset):
        return queryset.prefetch_related("tools")

    def perform_create(self, serializer):
        data = dict(serializer.validated_data)
        tools = data.pop("tools", [])
        serializer.instance = services.group_create(tenant=self.tenant, tools=tools, actor=acting_user(self.request),
                                                    **data)

    def perform_update(self, serializer):
        data = dict(serializer.validated_data)
        tools = data.pop("tools", None)
        serializer.instance = services.group_update(group=serializer.instance, tools=tools,
                                                    actor=acting_user(self.request), **data)

    def perform_destroy(self, instance):
        services.group_delete(group=instance, actor=acting_user(self.request))


class BindingViewSet(TenantModelViewSet):
    serializer_class = s.BindingSerializer
    http_method_names = ["get", "post", "put", "patch", "delete"]

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "sees_secrets": sees_secrets(self.request)}

    @extend_schema(parameters=[OpenApiParameter("tool", str), OpenApiParameter("agent", str)])
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    def safely_get_queryset(self, queryset):
        queryset = queryset.select_related("tool")
        if tool := self.request.query_params.get("tool"):
            queryset = queryset.filter(tool__name=tool)
        if "agent" in self.request.query_params:
            queryset = queryset.filter(agent=self.request.query_params["agent"])
        return queryset

    def perform_create(self, serializer):
        serializer.instance = services.binding_set(tenant=self.tenant, actor=acting_user(self.request),
                                                   **serializer.validated_data)

    def perform_update(self, serializer):
        data = {**{f: getattr(serializer.instance, f) for f in ("tool", "agent", "name", "value")},
                **serializer.validated_data}
        if (data["tool"], data["agent"], data["name"]) != (serializer.instance.tool, serializer.instance.agent,
                                                         serializer.instance.name):
            services.binding_delete(binding=serializer.instance, actor=acting_user(self.request))
        serializer.instance = services.binding_set(tenant=self.tenant, actor=acting_user(self.request), **data)

    def perform_destroy(self, instance):
        services.binding_delete(binding=instance, actor=acting_user(self.request))


class McpServerViewSet(TenantModelViewSet):
    """A tenant's MCP servers. Credentials (`headers`, `env`) are write-only: answers give their names."""

    serializer_class = s.McpServerSerializer

    def list(self, request, *args, **kwargs):
        page = self.paginate_queryset(self.get_queryset())
        tools = mcp_servers.mcp_tools_by_server(self.tenant, page)
        context = {**self.get_serializer_context(), "tools_by_server": tools}
        return self.get_paginated_response(s.McpServerSerializer(page, many=True, context=context).data)

    def retrieve(self, request, *args, **kwargs):
        return Response(self.represent(self.get_object()))

    def represent(self, server) -> dict:
        context = {**self.get_serializer_context(),
                   "tools_by_server": mcp_servers.mcp_tools_by_server(self.tenant, [server])}
        return s.McpServerSerializer(server, context=context).data

    def create(self, request, *args, **kwargs):
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        server = mcp_servers.mcp_server_create(tenant=self.tenant, actor=acting_user(request), **body.validated_data)
        return Response(self.represent(server), status=201)

    def update(self, request, *args, **kwargs):
        server = self.get_object()
        body = self.get_serializer(server, data=request.data, partial=kwargs.get("partial", False))
        body.is_valid(raise_exception=True)
        server = mcp_servers.mcp_server_update(server=server, actor=acting_user(request), **body.validated_data)
        return Response(self.represent(server))

    def perform_destroy(self, instance):
        mcp_servers.mcp_server_delete(server=instance, actor=acting_user(self.request))

    @extend_schema(request=None, responses=s.McpSyncResultSerializer)
    @action(detail=True, methods=["post"])
    def sync(self, request, pk=None):
        """List the server's tools into the catalog now. A server that cannot be reached is no error of this
        request: the answer is 200 with `sync.status` "error" and the reason, also kept as `last_error`."""
        server = self.get_object()
        result = mcp_servers.mcp_server_sync(server=server, actor=acting_user(request))
        result = {**result, "skipped": [{"name": name, "reason": reason} for name, reason in result["skipped"]],
                  "prompts": {**result["prompts"], "skipped": [{"name": name, "reason": reason}
                                                               for name, reason in result["prompts"]["skipped"]]}}
        return Response({"server": self.represent(server), "sync": result})

    @extend_schema(request=None, responses=s.McpDefinitionChangeSerializer(many=True))
    @action(detail=True, methods=["get"])
    def changes(self, request, pk=None):
        """The server's tools withheld for review: each with the accepted and the proposed definition."""
        return Response(s.McpDefinitionChangeSerializer([
            {"tool": tool.name, "review": "changed" if tool.pinned_hash else "new", "hash": tool.proposed_hash,
             "since": tool.proposed_at, "pinned": tool.pinned, "proposed": tool.proposed}
            for tool in definitions.withheld_tools(self.get_object())], many=True).data)

    @extend_schema(request=s.McpDefinitionAcceptSerializer, responses={200: s.McpServerSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def accept(self, request, pk=None):
        """Accept a tool's proposed definition, named by its hash (a newer proposal is a 409: review it first)."""
        server = self.get_object()
        body = s.McpDefinitionAcceptSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        tool = Tool.objects.for_tenant(self.tenant).filter(mcp_server=server, name=body.validated_data["tool"]).first()
        if tool is None:
            raise ServiceError({"tool": ["no tool of this server has that name"]})
        definitions.tool_definition_accept(tool=tool, expected_hash=body.validated_data["hash"],
                                           actor=acting_user(request))
        return Response(self.represent(server))

    @extend_schema(request=None, responses=s.McpTestResultSerializer)
    @action(detail=True, methods=["post"])
    def test(self, request, pk=None):
        """Connect to the server and say whether it answers; a failure is a 400 saying why, in plain words."""
        server = self.get_object()
        return Response(mcp_servers.mcp_server_probe(server=server, actor=acting_user(request)))
