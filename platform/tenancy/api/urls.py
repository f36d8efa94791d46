from django.urls import path

from .views import LimitsView

urlpatterns: list = [
    path("limits", LimitsView.as_view(), name="limits"),
]
