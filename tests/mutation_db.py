"""The test session as `make mutate` runs it: a pytest plugin that mutmut loads (`pytest_add_cli_args` in
pyproject.toml), never part of `make test`.

mutmut runs the tests once per mutant, each time in a new process. Migrating a database there would cost more
than most mutants' tests, and copying one (CREATE DATABASE … TEMPLATE, then DROP) costs PostgreSQL a checkpoint
each, seconds a mutant. So the first run migrates a template; each process claims one of a few copies of it (a
file lock, freed when the process ends) and empties it, as pytest-django does after every transactional test:
whatever the last mutant's run left there, interrupted or not, never reaches the next. The hooks below order a
mutant's tests and count their time as mutmut needs (docs/notes/structure-and-testing.md, "The mutation score").
"""
import fcntl
from pathlib import Path

import pytest

MUTATION_TEMPLATE = "test_toolkeeper_mutation"
MUTATION_SLOTS = 8  # more than mutmut ever runs at once on this kind of machine
_slot_lock = None  # held for the life of the process: the kernel frees the slot when it ends, however it ends


def _claim_slot(data_dir: Path) -> int:
    global _slot_lock
    for slot in range(MUTATION_SLOTS):
        lock = open(data_dir / f"mutation-slot-{slot}.lock", "w")  # noqa: SIM115 - held until exit
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        _slot_lock = lock
        return slot
    raise RuntimeError(f"all {MUTATION_SLOTS} mutation databases are in use")


class MutationDatabase:
    """Registered once pytest-django is, so this `django_db_setup` is the one used: a plugin named with `-p`
    loads before the installed ones, and of two fixtures of one name the one registered last wins."""

    @pytest.fixture(scope="session")
    def django_db_setup(self, django_test_environment, django_db_blocker):
        from django.conf import settings
        from django.core.management import call_command
        from django.db import connection
        from django.test.utils import setup_databases

        if connection.vendor != "postgresql":
            raise RuntimeError("make mutate needs PostgreSQL (TEST_DATABASE_URL or 127.0.0.1:5432)")
        data_dir = Path(settings.DATA_DIR)
        ready = data_dir / "mutation-template.ready"  # removed by `make mutate`, so each run migrates afresh
        slot = _claim_slot(data_dir)
        name = f"{MUTATION_TEMPLATE}_{slot}"
        copied = data_dir / f"mutation-slot-{slot}.copied"  # this slot's copy is of the current template
        with django_db_blocker.unblock():
            with open(data_dir / "mutation-template.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # runs of two mutants at once: one migrates, the other waits
                connection.settings_dict["TEST"]["NAME"] = MUTATION_TEMPLATE
                if not ready.exists():
                    with connection._nodb_cursor() as cursor:  # the copies of the template before
                        cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                                       [f"{MUTATION_TEMPLATE}\\_%"])
                        for (old,) in cursor.fetchall():
                            cursor.execute(f'DROP DATABASE IF EXISTS "{old}" WITH (FORCE)')
                    for stale in data_dir.glob("mutation-slot-*.copied"):
                        stale.unlink()
                    setup_databases(verbosity=0, interactive=False, serialized_aliases=[])
                    ready.touch()
                if not copied.exists():
                    connection.settings_dict["NAME"] = MUTATION_TEMPLATE
                    connection.creation.clone_test_db(suffix=str(slot), verbosity=0)
                    copied.touch()
            connection.close()
            connection.settings_dict["NAME"] = settings.DATABASES["default"]["NAME"] = name
            call_command("flush", interactive=False, verbosity=0, database="default")
        yield


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    config.pluginmanager.register(MutationDatabase(), "toolkeeper-mutation-database")


def _collecting_stats() -> bool:
    from mutmut.mutation.trampoline import get_mutant_under_test

    return get_mutant_under_test() == "stats"


def pytest_collection_modifyitems(items):
    """mutmut hands a mutant's tests over in no particular order and stops at the first failure: run the quick
    ones first, so a mutant that a unit test kills is not first run through the slow end-to-end tests. A
    module's tests stay together (its fixtures may start servers); modules by their quickest test."""
    from mutmut.mutation.trampoline import get_mutant_under_test
    from mutmut.state import state

    if get_mutant_under_test() in (None, "", "stats", "fail"):
        return
    durations = state().duration_by_test
    module = {item.nodeid: item.nodeid.split("::", 1)[0] for item in items}
    quickest = {}
    for item in items:
        duration = durations.get(item.nodeid, float("inf"))
        quickest[module[item.nodeid]] = min(quickest.get(module[item.nodeid], float("inf")), duration)
    items.sort(key=lambda item: (quickest[module[item.nodeid]], module[item.nodeid],
                                 durations.get(item.nodeid, float("inf"))))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    """mutmut runs a mutant against the tests that reached its function. Counted from the test's own call, not
    its fixtures': a test whose only contact was building the shared world kills a mutant by crashing, not by
    checking it, and would cost every survivor of the call path a thousand runs."""
    from mutmut.state import state

    if _collecting_stats():
        state()._stats.clear()


def pytest_runtest_makereport(item, call):
    """mutmut times a test by its call alone and gives a mutant's run a multiple of its tests' time before
    calling it a timeout (a kill); the fixtures' time counts here too, or slow set-ups would look like hangs."""
    from mutmut.state import state

    if call.when != "call" and _collecting_stats():
        durations = state().duration_by_test
        durations[item.nodeid] = durations.get(item.nodeid, 0) + call.duration
