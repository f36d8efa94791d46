import pytest

from tests.live.conftest import _report
from tests.live.server import LiveServer

# A tools/call that waits for a reviewer gives up after this long on /mcp/: a call the MCP fuzz should never
# have let through does not hold the run for the default five minutes.
MCP_MAX_WAIT_S = "5"


@pytest.fixture(scope="session", autouse=True)
def _close_stray_connections():
    """The fuzz run talks to a server process, never to the test database: the suite-wide fixture of this
    name (tests/conftest.py), which needs that database, does not apply here."""
    yield


@pytest.fixture(scope="package")
def fuzz_server():
    """The live embedded server (as tests/live/conftest.py's `toolkeeper_server` starts it) that the REST fuzz
    and the MCP fuzz share; their modules are one xdist group, so one worker runs both against it."""
    with LiveServer(extra_env={"TOOLKEEPER_MCP_MAX_WAIT_S": MCP_MAX_WAIT_S}) as server:
        yield server
        _report(server)
