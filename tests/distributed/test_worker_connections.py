"""Celery workers keep their database connection from one call to the next (CELERY_DB_REUSE_MAX)."""
import time

import pytest

pytestmark = [pytest.mark.live, pytest.mark.postgres, pytest.mark.xdist_group("distributed")]

CALLS = 12


def _sessions_opened(deployment) -> int:
    (count,), = deployment.stack.sql("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
    return count


def test_workers_do_not_open_a_connection_per_call(deployment):
    api = deployment.api(deployment.a)
    session = api.new_session("connections")
    before = _sessions_opened(deployment)
    for _ in range(CALLS):
        call = api.submit(session, "current_time", {}, wait=30)
        assert call["status"] == "succeeded", call
    time.sleep(1.5)  # closed sessions report their statistics as they end
    opened = _sessions_opened(deployment) - before
    # A connection per task would open at least CALLS; kept ones open none. A few for the checks themselves.
    assert opened < CALLS // 2, f"{opened} database sessions were opened for {CALLS} calls"
