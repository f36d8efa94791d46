"""This suite runs on the database of the test settings (PostgreSQL where it answers) and, through
this test, once more on the other backend in a subprocess (tests.other_backend)."""
import pytest
from django.db import connection

from tests.other_backend import assert_expected_vendor, run_on_other_backend


@pytest.mark.sqlite_subprocess
def test_the_activity_suite_passes_on_the_other_backend(tmp_path):
    run_on_other_backend("tests/activity", tmp_path)


@pytest.mark.django_db
def test_the_expected_backend_is_in_use():
    assert_expected_vendor()
    assert connection.vendor in ("postgresql", "sqlite")
