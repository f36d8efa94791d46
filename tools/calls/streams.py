"""The WebSocket streams of calls (docs/notes/realtime.md): an app follows its session; the console follows the
tenant's calls, one session or one call. The shared machinery is `realtime.consumers`.
"""
import uuid

from django.urls import path

from realtime.consumers import AppStream, ConsoleStream
from realtime.groups import calls_group, session_group
from realtime.routing import console_socket
from tenancy.selectors import key_sessions
from tools.catalog.selectors import call_events_since
from tools.models import AgentSession, ToolCall


def _one(queryset, pk):
    try:
        return queryset.filter(pk=pk).first()
    except Exception:  # a malformed id is simply not found
        return None


class AppSessionStream(AppStream):
    """`/ws/api/sessions/<id>/`: an app follows its session, authenticated by its API key."""

    def authorize(self):
        api_key = self.agent_key()
        if api_key is None:
            return None
        sessions = AgentSession.objects.for_tenant(api_key.tenant).filter(key_sessions(api_key))
        session = _one(sessions, self.scope["url_route"]["kwargs"]["session_id"])
        if session is None:
            return None
        self.tenant_id, self.session_id = api_key.tenant_id, session.pk
        self.group = session_group(self.tenant_id, self.session_id)
        return session

    def read_query(self, query: dict) -> None:
        super().read_query(query)
        call = query.get("call")
        self.call_filter = str(uuid.UUID(call)) if call is not None else None

    def replay(self, after: int) -> list[dict]:
        return call_events_since(tenant_id=self.tenant_id, session_id=self.session_id, after=after,
                                 call_id=self.call_filter)


class ConsoleCallsStream(ConsoleStream):
    """Every call of the tenant: the calls list and the dashboard."""

    def authorize(self):
        tenant = self.member_tenant()
        if tenant is None:
            return None
        self.tenant_id = tenant.pk
        self.group = calls_group(tenant.pk)
        return tenant


class ConsoleSessionStream(ConsoleStream):
    def authorize(self):
        tenant = self.member_tenant()
        if tenant is None:
            return None
        session = _one(AgentSession.objects.for_tenant(tenant), self.scope["url_route"]["kwargs"]["session_id"])
        if session is None:
            return None
        self.tenant_id, self.session_id = tenant.pk, session.pk
        self.group = session_group(tenant.pk, session.pk)
        return session

    def replay(self, after: int) -> list[dict]:
        return call_events_since(tenant_id=self.tenant_id, session_id=self.session_id, after=after)


class ConsoleCallStream(ConsoleStream):
    def authorize(self):
        tenant = self.member_tenant()
        if tenant is None:
            return None
        call = _one(ToolCall.objects.for_tenant(tenant), self.scope["url_route"]["kwargs"]["call_id"])
        if call is None:
            return None
        self.tenant_id, self.call_filter = tenant.pk, str(call.pk)
        self.group = session_group(tenant.pk, call.session_id)
        return call

    def replay(self, after: int) -> list[dict]:
        return call_events_since(tenant_id=self.tenant_id, call_id=self.call_filter, after=after)


websocket_urlpatterns = [
    path("ws/api/sessions/<str:session_id>/", AppSessionStream.as_asgi()),
    console_socket("ws/console/<slug:tenant>/calls/", ConsoleCallsStream),
    console_socket("ws/console/<slug:tenant>/calls/<str:call_id>/", ConsoleCallStream),
    console_socket("ws/console/<slug:tenant>/sessions/<str:session_id>/", ConsoleSessionStream),
]
