from django.urls import path
from rest_framework.routers import SimpleRouter

from approvals.api import views

router = SimpleRouter(trailing_slash=False)
router.register("rules", views.RuleViewSet, basename="rule")
router.register("queues", views.QueueViewSet, basename="queue")
router.register("approvals", views.ApprovalViewSet, basename="approval")
router.register("notify-channels", views.ChannelViewSet, basename="notify-channel")
router.register("notify-deliveries", views.DeliveryViewSet, basename="notify-delivery")
router.register("notify-settings", views.ReviewerNotifyViewSet, basename="notify-setting")
router.register("grants", views.GrantViewSet, basename="grant")

urlpatterns = [
    path("calls/<str:call_id>/result", views.CallResultView.as_view(), name="call-result"),
    *router.urls,
]
