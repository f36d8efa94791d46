"""Ending access in the distributed mode (daphne with the Redis channel layer, Celery workers,
PostgreSQL): a key revoked, or a member removed, from another process (a shell) reaches daphne's open
sockets and waiting requests within seconds."""
import pytest

from tests.distributed.support import (
    removing_a_member_closes_their_console_socket,
    revoking_a_key_ends_its_socket_and_wait,
)

pytestmark = [pytest.mark.live, pytest.mark.postgres, pytest.mark.xdist_group("distributed")]


def test_revoking_a_key_closes_its_socket_and_ends_its_wait(deployment):
    revoking_a_key_ends_its_socket_and_wait(deployment.url, deployment.stack.shell, deployment.a.slug,
                                            deployment.a.api_key)


def test_removing_a_member_closes_their_console_socket(deployment):
    removing_a_member_closes_their_console_socket(deployment.url, deployment.stack.shell, deployment.a.slug,
                                                  deployment.a.api_key)
