"""Routes that other services call, outside any login and any tenant's URL: each is trusted by its own signature.
Mounted under /integrations/."""
from django.urls import path

from approvals import views

urlpatterns = [
    path("slack/<uuid:public_id>/", views.slack_interaction, name="slack_interaction"),
]
