"""Ending access on the embedded server (daphne, SQLite, the in-process channel layer, the local
executor): a key revoked, or a member removed, from another process (a shell) reaches the server's open
sockets and waiting requests within seconds."""
import json

import pytest

from tests.distributed.support import (
    removing_a_member_closes_their_console_socket,
    revoking_a_key_ends_its_socket_and_wait,
)

pytestmark = [pytest.mark.live]


@pytest.fixture
def shell(toolkeeper_server):
    return lambda code: json.loads(toolkeeper_server.manage("shell", "-c", code).strip().splitlines()[-1])


def test_revoking_a_key_closes_its_socket_and_ends_its_wait(toolkeeper_server, shell):
    revoking_a_key_ends_its_socket_and_wait(toolkeeper_server.url, shell, "demo", toolkeeper_server.api_key)


def test_removing_a_member_closes_their_console_socket(toolkeeper_server, shell):
    removing_a_member_closes_their_console_socket(toolkeeper_server.url, shell, "demo", toolkeeper_server.api_key)
