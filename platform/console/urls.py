from django.urls import path

from . import views

app_name = "console"

urlpatterns = [
    path("", views.home, name="home"),
    path("t/<slug:tenant>/", views.home, name="dashboard"),
]
