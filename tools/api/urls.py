from django.urls import path
from rest_framework.routers import SimpleRouter

from tools.accounts.api import OAuthProviderViewSet
from tools.api import views
from tools.http_tools import api as http_tools
from tools.redaction.api import RedactionRuleViewSet

router = SimpleRouter(trailing_slash=False)
router.register("tools", views.ToolViewSet, basename="tool")
router.register("groups", views.GroupViewSet, basename="group")
router.register("bindings", views.BindingViewSet, basename="binding")
router.register("mcp-servers", views.McpServerViewSet, basename="mcp-server")
router.register("redaction-rules", RedactionRuleViewSet, basename="redaction-rule")
router.register("http-tools", http_tools.HttpToolViewSet, basename="http-tool")
router.register("oauth-providers", OAuthProviderViewSet, basename="oauth-provider")

urlpatterns = [
    path("sessions", views.SessionCreateView.as_view(), name="session-create"),
    path("sessions/<str:session_id>", views.SessionDetailView.as_view(), name="session-detail"),
    path("sessions/<str:session_id>/tools", views.SessionToolsView.as_view(), name="session-tools"),
    path("sessions/<str:session_id>/prompt", views.SessionPromptView.as_view(), name="session-prompt"),
    path("sessions/<str:session_id>/calls", views.waiting(views.CallSubmitView), name="session-calls"),
    path("calls/<str:call_id>", views.waiting(views.CallDetailView), name="call-detail"),
    path("calls/<str:call_id>/events", views.CallEventsView.as_view(), name="call-events"),
    path("calls/<str:call_id>/cancel", views.CallCancelView.as_view(), name="call-cancel"),
    path("calls/<str:call_id>/answer", views.CallAnswerView.as_view(), name="call-answer"),
    *router.urls,
]
