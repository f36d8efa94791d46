"""The embedded SQLite backend keeps each statement's placeholder conversion: it must convert exactly as
Django's cursor does, and a kept conversion must never carry one execution's values into the next."""
import pytest
from django.db.backends.sqlite3.base import SQLiteCursorWrapper

from common.sqlite3.base import CursorWrapper, DatabaseWrapper, _qmark


@pytest.fixture
def connection(django_db_blocker):
    """A connection of the embedded backend, whatever database the suite runs on."""
    wrapper = DatabaseWrapper({
        "NAME": ":memory:", "OPTIONS": {}, "TIME_ZONE": None, "CONN_MAX_AGE": 0, "CONN_HEALTH_CHECKS": False,
        "AUTOCOMMIT": True, "ATOMIC_REQUESTS": False, "USER": "", "PASSWORD": "", "HOST": "", "PORT": "",
        "TEST": {},
    }, alias="embedded_check")
    with django_db_blocker.unblock():
        yield wrapper
        wrapper.close()


STATEMENTS = [
    "SELECT %s",
    "SELECT %s, %s WHERE 'a%%' LIKE 'a%%'",
    "SELECT '100%%' || %s",
    "SELECT 1",
]


@pytest.mark.parametrize("sql", STATEMENTS)
def test_the_conversion_is_djangos(sql):
    assert CursorWrapper.convert_query(None, sql) == SQLiteCursorWrapper.convert_query(None, sql)


def test_one_statement_with_different_values_answers_each(connection):
    _qmark.cache_clear()
    with connection.cursor() as cursor:
        answers = []
        for value in ("first", "second", "%s", "100%"):
            cursor.execute("SELECT %s || '%%'", [value])
            answers.append(cursor.fetchone()[0])
    assert answers == ["first%", "second%", "%s%", "100%%"]
    assert _qmark.cache_info().hits >= 3  # the conversion ran once


def test_named_parameters_still_convert(connection):
    with connection.cursor() as cursor:
        cursor.execute("SELECT %(a)s || %(b)s", {"a": "x", "b": "y"})
        assert cursor.fetchone()[0] == "xy"
