"""The error pages a visitor sees: the friendly 404 and 500, never a traceback or the URL list."""
import pytest
from django.test import Client, override_settings

pytestmark = pytest.mark.django_db


@override_settings(ROOT_URLCONF="tests.toolkeeper.crash_urls")
def test_a_failing_page_shows_the_friendly_500_and_nothing_of_the_error():
    response = Client(raise_request_exception=False).get("/fails/")
    assert response.status_code == 500
    body = response.content.decode()
    assert "Something went wrong" in body
    assert "secret detail" not in body and "RuntimeError" not in body and "Traceback" not in body


def test_an_unknown_page_shows_the_friendly_404(world):
    response = world.a.console("viewer").get("/nowhere/")
    assert response.status_code == 404
    assert "There is nothing here" in response.content.decode()
