"""Audit entries are written without a lock and sealed into the chain after they commit.

A tenant's writers no longer queue on the chain's head: an entry is one INSERT with a hash of its own
content, and the sealer gives committed entries their positions, previous hashes and chained hashes. The
chain's guarantees are checked here against that: commit order is not id order, sealers race, a process
stops before sealing, and rows are written behind the log's back.
"""
import hashlib
import threading
import time

import pytest
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test import override_settings

from audit.chain import KEYED, PLAIN, entry_payload
from audit.models import ChainHead, Event
from audit.selectors import audit_check
from audit.services import audit_record, audit_seal, audit_seal_pending, audit_verify
from tenancy.services import tenant_create
from tools.registry import periodic_jobs

AUDIT_KEY = "audit-key-for-tests-" + "s" * 24


def entries(tenant) -> list[Event]:
    return list(Event.objects.for_tenant(tenant).order_by("id"))


def in_thread(func, *args):
    """Start `func` in a thread that closes its database connection when done; returns the thread."""
    def run():
        try:
            func(*args)
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
def test_an_append_does_not_wait_for_another_writers_open_transaction():
    """Before, an append locked the chain's head until its transaction ended: a second writer of the same
    tenant waited for the first one's commit. Now it commits at once, and the chain follows commit order."""
    tenant = tenant_create(slug="unlocked")
    audit_seal(tenant.pk)
    first_written, let_first_commit = threading.Event(), threading.Event()

    def first_writer():
        with transaction.atomic():
            audit_record(tenant=tenant, verb="test.first", target="a")
            first_written.set()
            let_first_commit.wait(10)

    first = in_thread(first_writer)
    assert first_written.wait(10)
    second = in_thread(lambda: audit_record(tenant=tenant, verb="test.second", target="b"))
    second.join(5)
    try:
        assert not second.is_alive(), "the second writer waited for the first one's transaction"
        audit_seal(tenant.pk)  # (the background sealer may have been first) the first entry is not visible yet
        assert Event.objects.for_tenant(tenant).get(verb="test.second").position is not None
    finally:
        let_first_commit.set()
        first.join(10)
    audit_seal(tenant.pk)
    by_verb = {event.verb: event for event in entries(tenant)}
    first_entry, second_entry = by_verb["test.first"], by_verb["test.second"]
    assert first_entry.pk < second_entry.pk  # written first…
    assert first_entry.position == second_entry.position + 1  # …sealed after: the chain is in commit order
    assert first_entry.prev_hash == second_entry.hash
    check = audit_verify(tenant=tenant)
    assert (check.status, check.entries, check.pending) == ("intact", len(entries(tenant)), 0)
    head = ChainHead.objects.for_tenant(tenant).get()
    assert (head.count, head.last_id, head.hash) == (len(entries(tenant)), first_entry.pk, first_entry.hash)


@pytest.mark.django_db(transaction=True)
def test_the_sealer_seals_just_after_commit():
    tenant = tenant_create(slug="sealed-soon")
    event = audit_record(tenant=tenant, verb="test.event", target="x")  # autocommit: committed now
    deadline = time.monotonic() + 10
    while Event.objects.for_tenant(tenant).filter(position__isnull=True).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    event.refresh_from_db()
    assert event.position == len(entries(tenant))
    check = audit_check(tenant=tenant)  # no seal of its own: the background one did it
    assert (check.status, check.pending) == ("intact", 0)


@pytest.mark.django_db(transaction=True)
def test_racing_sealers_give_each_entry_one_position():
    tenant = tenant_create(slug="raced")
    with transaction.atomic():  # committed together, sealed by whichever sealer gets the head first
        for n in range(60):
            audit_record(tenant=tenant, verb="test.event", target=f"thing:{n}", data={"n": n})
    sealed = []
    threads = [in_thread(lambda: sealed.append(audit_seal(tenant.pk))) for _ in range(4)]
    for thread in threads:
        thread.join(20)
    assert sum(sealed) <= len(entries(tenant))  # none sealed twice
    audit_seal(tenant.pk)
    positions = sorted(event.position for event in entries(tenant))
    assert positions == list(range(1, len(positions) + 1))
    assert audit_check(tenant=tenant).status == "intact"


def test_entries_a_stopped_process_left_unsealed_are_sealed_by_the_periodic_sweep(world):
    """In a test's transaction nothing runs on commit: exactly like a process that stopped before its seal."""
    audit_record(tenant=world.a.tenant, verb="test.event", target="x")
    pending = Event.all_tenants.filter(position__isnull=True).count()
    assert pending >= 2  # both tenants' set-up entries and this one
    assert audit_check(tenant=world.a.tenant).pending > 0
    assert "audit.seal" in periodic_jobs()
    func, _every_s = periodic_jobs()["audit.seal"]
    assert func() == pending
    assert not Event.all_tenants.filter(position__isnull=True).exists()
    for tenant in (world.a.tenant, world.b.tenant):
        check = audit_check(tenant=tenant)
        assert (check.status, check.pending, check.entries) == ("intact", 0, len(entries(tenant)))
    assert audit_seal_pending() == 0


def _forged(tenant, *, prev_hash: str, key: bytes = b"") -> Event:
    """A row written straight into the table, unsealed, with a hash its writer computed."""
    forged = Event(tenant=tenant, actor_label="mallory", verb="tenant.deleted", target=f"tenant:{tenant.slug}",
                   data={}, at=Event.objects.for_tenant(tenant).latest("id").at, prev_hash=prev_hash,
                   algorithm=PLAIN)
    payload = entry_payload(prev_hash=prev_hash, tenant_id=tenant.pk, actor_label=forged.actor_label,
                            verb=forged.verb, target=forged.target, data=forged.data, at=forged.at)
    forged.hash = hashlib.sha256(payload).hexdigest()
    forged.save()
    return forged


def test_a_row_with_a_wrong_hash_is_never_sealed_and_later_entries_still_are(world):
    tenant = world.a.tenant
    audit_seal(tenant.pk)
    forged = _forged(tenant, prev_hash=entries(tenant)[-1].hash)  # hashed as if chained: not as the log writes
    later = audit_record(tenant=tenant, verb="test.later", target="y")
    audit_seal(tenant.pk)
    forged.refresh_from_db()
    later.refresh_from_db()
    assert forged.position is None and later.position is not None
    check = audit_verify(tenant=tenant)
    assert (check.status, check.entry) == ("broken", forged.pk)
    assert "not written through the log" in check.reason


def test_with_the_key_a_plain_row_is_not_sealed_into_a_signed_chain(world):
    """Anyone with database access can compute a plain hash; only the key's holder can write a keyed one."""
    with override_settings(TOOLKEEPER_AUDIT_KEY=AUDIT_KEY):
        tenant = tenant_create(slug="keyed-seal")
        audit_record(tenant=tenant, verb="test.event", target="x")
        audit_seal(tenant.pk)
        assert ChainHead.objects.for_tenant(tenant).get().signature
        forged = _forged(tenant, prev_hash="")  # its own hash is right, but plain
        keyed = audit_record(tenant=tenant, verb="test.keyed", target="y")
        check = audit_verify(tenant=tenant)
        forged.refresh_from_db()
        keyed.refresh_from_db()
    assert forged.position is None and keyed.position is not None and keyed.algorithm == KEYED
    assert (check.status, check.entry) == ("broken", forged.pk)
    assert "without the audit key after keyed entries" in check.reason


def test_an_unsealed_entry_changed_before_its_seal_is_refused(world):
    event = audit_record(tenant=world.a.tenant, verb="test.event", target="x", data={"amount": 1})
    Event.objects.for_tenant(world.a.tenant).filter(pk=event.pk).update(data={"amount": 1000})
    check = audit_verify(tenant=world.a.tenant)
    assert (check.status, check.entry) == ("broken", event.pk)
    event.refresh_from_db()
    assert event.position is None


@pytest.mark.django_db(transaction=True)
def test_the_migration_numbers_existing_chains_in_id_order_and_goes_back():
    tenant = tenant_create(slug="migrated")
    for n in range(3):
        audit_record(tenant=tenant, verb="test.event", target=f"thing:{n}")
    audit_seal(tenant.pk)
    before = [(event.pk, event.hash) for event in entries(tenant)]
    executor = MigrationExecutor(connection)
    executor.migrate([("audit", "0002_chain_head")])
    with connection.cursor() as cursor:
        columns = [column.name for column in connection.introspection.get_table_description(cursor, "audit_event")]
    assert "position" not in columns
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    after = entries(tenant)
    assert [(event.pk, event.hash) for event in after] == before
    assert [event.position for event in after] == list(range(1, len(before) + 1))
    assert audit_check(tenant=tenant).status == "intact"
