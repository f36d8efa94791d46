from django.urls import path

from tenancy.api.views import LimitsView

urlpatterns: list = [
    path("limits", LimitsView.as_view(), name="limits"),
]
