"""The tenant's max_parallel_calls holds across Celery worker processes."""
import pytest

pytestmark = [pytest.mark.live, pytest.mark.postgres, pytest.mark.xdist_group("distributed")]

CALLS = 3


def _run_batch(deployment, label: str) -> list[tuple]:
    """CALLS countdowns, each in its own session, submitted together; returns (started_at, finished_at)."""
    api = deployment.api(deployment.b)
    sessions = [api.new_session(f"cap-{label}-{n}") for n in range(CALLS)]
    calls = [api.submit(session, "countdown", {"seconds": 2}) for session in sessions]
    finished = [api.wait_terminal(call["id"], timeout=60) for call in calls]
    assert {c["status"] for c in finished} == {"succeeded"}, finished
    rows = deployment.stack.sql(
        "SELECT started_at, finished_at FROM tools_toolcall WHERE id = ANY(%s::uuid[]) ORDER BY started_at",
        [[c["id"] for c in calls]])
    assert len(rows) == CALLS and all(start and end for start, end in rows)
    return rows


def _max_overlap(intervals: list[tuple]) -> int:
    points = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
                    key=lambda p: (p[0], p[1]))  # an end before a start at the same instant
    running = peak = 0
    for _, delta in points:
        running += delta
        peak = max(peak, running)
    return peak


def test_max_parallel_calls_holds_in_celery_mode(deployment):
    slug = deployment.b.slug
    (cap,), = deployment.stack.sql("SELECT max_parallel_calls FROM tenancy_tenant WHERE slug = %s", [slug])
    assert cap >= 2
    # Control: with the default cap, the two worker processes run the calls side by side.
    assert _max_overlap(_run_batch(deployment, "free")) >= 2

    deployment.stack.sql("UPDATE tenancy_tenant SET max_parallel_calls = 1 WHERE slug = %s", [slug])
    try:
        intervals = _run_batch(deployment, "capped")
    finally:
        deployment.stack.sql("UPDATE tenancy_tenant SET max_parallel_calls = %s WHERE slug = %s", [cap, slug])
    assert _max_overlap(intervals) == 1
    for (_, previous_end), (start, _) in zip(intervals, intervals[1:], strict=False):
        assert start >= previous_end
