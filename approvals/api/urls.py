from django.urls import path
from rest_framework.routers import SimpleRouter

from . import views

router = SimpleRouter(trailing_slash=False)
router.register("rules", views.RuleViewSet, basename="rule")
router.register("queues", views.QueueViewSet, basename="queue")
router.register("approvals", views.ApprovalViewSet, basename="approval")

urlpatterns = [
    path("calls/<str:call_id>/result", views.CallResultView.as_view(), name="call-result"),
    *router.urls,
]
