from django.urls import path

from tenancy.api.views import GovernanceView, LimitsView

urlpatterns: list = [
    path("limits", LimitsView.as_view(), name="limits"),
    path("governance", GovernanceView.as_view(), name="governance"),
]
