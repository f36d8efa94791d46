"""A URL conf with one view that fails, for the test of the 500 page."""
from django.urls import path


def fails(request):
    raise RuntimeError("a secret detail that must not reach the client")


urlpatterns = [path("fails/", fails)]
