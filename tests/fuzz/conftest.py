import pytest


@pytest.fixture(scope="session", autouse=True)
def _close_stray_connections():
    """The fuzz run talks to a server process, never to the test database: the suite-wide fixture of this
    name (tests/conftest.py), which needs that database, does not apply here."""
    yield
