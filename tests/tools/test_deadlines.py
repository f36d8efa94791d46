"""The executor's deadline thread: each armed action fires once, after its delay, in deadline order;
a disarmed one never fires; a slow action does not hold back the next."""
import threading

from tests.tools.support import poll
from tools.calls.executors import Deadlines


def test_actions_fire_once_in_deadline_order_and_disarmed_ones_never():
    deadlines = Deadlines()
    fired: list[str] = []
    done = threading.Event()
    deadlines.arm(1.0, fired.append, "late")
    deadlines.arm(0.1, fired.append, "early")
    dropped = deadlines.arm(0.05, fired.append, "disarmed")
    deadlines.arm(1.1, lambda: done.set())
    deadlines.disarm(dropped)
    assert done.wait(10)
    poll(lambda: len(fired) == 2, message="both armed actions")
    assert fired == ["early", "late"]
    deadlines.disarm(dropped)  # disarming twice, or after the deadline, is harmless


def test_an_action_that_blocks_does_not_delay_the_next():
    deadlines = Deadlines()
    release = threading.Event()
    second = threading.Event()
    deadlines.arm(0.01, release.wait)  # blocks until the test ends
    deadlines.arm(0.05, second.set)
    try:
        assert second.wait(10)
    finally:
        release.set()


def test_a_nearer_deadline_armed_later_wakes_the_thread():
    deadlines = Deadlines()
    near = threading.Event()
    far = deadlines.arm(3600, near.set)
    deadlines.arm(0.01, near.set)
    assert near.wait(10)
    deadlines.disarm(far)
