"""The audit chain's strands: appends made at once take strands no other append holds instead of queueing on
one head, and the check still finds any strand changed, cut short, rewound or removed whole.

The concurrency tests hold a strand in a transaction of another thread and watch PostgreSQL's lock table, so
each step is written out, not left to timing."""
import importlib
import threading

import pytest
from django.db import connection, connections, transaction
from django.db.migrations.loader import MigrationLoader
from django.test import override_settings

from audit.chain import STRANDS, head_signature
from audit.models import ChainHead, Event
from audit.selectors import audit_check
from audit.services import audit_chain_sign, audit_record
from tenancy.models import Tenant
from tests.tenancy.test_audit_verify import AUDIT_KEY, chain, keyed, remove, tamper

pytestmark = pytest.mark.django_db(transaction=True)
on_postgres = pytest.mark.skipif(connection.vendor != "postgresql",
                                 reason="strands are taken with FOR UPDATE SKIP LOCKED; SQLite has one writer")
strands_migration = importlib.import_module("audit.migrations.0003_strands")


class Holder:
    """An append in a transaction of its own thread, kept open (its strand held) until `finish`."""

    def __init__(self, tenant, verb: str):
        self.tenant, self.verb = tenant, verb
        self.appended, self._release = threading.Event(), threading.Event()
        self.event: Event | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        try:
            with transaction.atomic():
                self.event = audit_record(tenant=self.tenant, verb=self.verb)
                self.appended.set()
                self._release.wait(30)
        except BaseException as exc:  # noqa: BLE001 - reported by `finish`
            self.error = exc
        finally:
            self.appended.set()
            connections.close_all()

    def hold(self) -> "Holder":
        assert self.appended.wait(10), f"{self.verb} did not append"
        assert self.error is None, self.error
        return self

    def finish(self) -> Event:
        self._release.set()
        self._thread.join(30)
        assert not self._thread.is_alive() and self.error is None, self.error
        return self.event


def waiting_on_a_lock() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock'")
        return cursor.fetchone()[0]


def until_one_waits() -> None:
    for _ in range(500):
        if waiting_on_a_lock():
            return
        threading.Event().wait(0.02)
    pytest.fail("no append came to wait on a lock")


def no_lock_waits():
    """Inside a transaction: a lock wait fails the statement at once instead of waiting."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '1ms'")


def braided(tenant) -> dict[str, Event]:
    """Entries in two strands, interleaved by id: a0 b0 b1 a1 a2 (a in strand 0, b in strand 1)."""
    holder = Holder(tenant, "a0").hold()
    with transaction.atomic():
        entries = {verb: audit_record(tenant=tenant, verb=verb) for verb in ("b0", "b1")}
    entries["a0"] = holder.finish()
    entries |= {verb: audit_record(tenant=tenant, verb=verb) for verb in ("a1", "a2")}
    assert {verb: e.strand for verb, e in entries.items()} == {"a0": 0, "b0": 1, "b1": 1, "a1": 0, "a2": 0}
    return entries


@on_postgres
def test_an_append_does_not_wait_for_one_in_flight(world):
    holder = Holder(world.a.tenant, "test.first").hold()
    with transaction.atomic():
        no_lock_waits()  # with one head for the chain this append would wait on it, and fail
        second = audit_record(tenant=world.a.tenant, verb="test.second")
    first = holder.finish()
    assert (first.strand, second.strand) == (0, 1)
    check = audit_check(tenant=world.a.tenant)
    assert (check.status, check.entries) == ("intact", len(chain(world.a.tenant)))


@on_postgres
def test_a_transaction_appends_again_to_the_strand_it_holds(world):
    holder = Holder(world.a.tenant, "test.other").hold()
    with transaction.atomic():
        no_lock_waits()
        mine = [audit_record(tenant=world.a.tenant, verb=f"test.mine.{n}") for n in range(3)]
    holder.finish()
    assert [event.strand for event in mine] == [1, 1, 1]
    assert [e.verb for e in chain(world.a.tenant) if e.strand == 1] == ["test.mine.0", "test.mine.1", "test.mine.2"]
    assert audit_check(tenant=world.a.tenant).intact


@on_postgres
def test_when_every_strand_is_held_an_append_waits_for_one(world):
    holders = [Holder(world.a.tenant, f"test.hold.{n}") for n in range(STRANDS)]
    for holder in holders:
        holder.hold()
    assert sorted(holder.event.strand for holder in holders) == list(range(STRANDS))
    late = Holder(world.a.tenant, "test.late")
    until_one_waits()
    assert not late.appended.is_set()
    for holder in holders:
        holder.finish()
    assert late.finish().verb == "test.late"
    check = audit_check(tenant=world.a.tenant)
    assert (check.status, check.entries) == ("intact", len(chain(world.a.tenant)))


@on_postgres
def test_the_first_appends_of_a_chain_make_its_strands_once():
    tenant = Tenant.objects.create(slug="fresh", name="Fresh")
    assert not ChainHead.objects.for_tenant(tenant).exists()
    first = Holder(tenant, "test.first").hold()  # made the heads; they are not committed yet
    second = Holder(tenant, "test.second")
    until_one_waits()  # on the first appends' advisory lock
    first.finish()
    assert second.finish().strand == 0  # after the first committed, its strand is free again
    assert sorted(ChainHead.objects.for_tenant(tenant).values_list("strand", flat=True)) == list(range(STRANDS))
    check = audit_check(tenant=tenant)
    assert (check.status, check.entries) == ("intact", 2)


@on_postgres
def test_a_braided_chain_is_intact_and_its_head_pins_every_strand(world):
    before = audit_check(tenant=world.a.tenant)
    braided(world.a.tenant)
    check = audit_check(tenant=world.a.tenant)
    assert (check.status, check.entries, check.head_count) == ("intact", before.entries + 5, before.entries + 5)
    assert check.head_hash != before.head_hash
    ChainHead.objects.for_tenant(world.a.tenant).filter(strand=1).update(count=1)
    assert audit_check(tenant=world.a.tenant).head_hash != check.head_hash


@on_postgres
@pytest.mark.parametrize("damage,victim,found", [
    ("remove", "b0", "broken at entry #{b1}: it does not follow the entry before it"),
    # the newest of strand 1, or all of it: a1, appended after them, saw them
    ("remove", "b1", "broken at entry #{a1}: it saw 2 entries in strand 1, which has 1 before it"),
    ("strand", "b0", "broken at entry #{a1}: it saw 2 entries in strand 1, which has 0 before it"),
    ("move", "b1", "broken at entry #{b1}: it does not follow the entry before it"),
    ("head", "", "broken: the heads of strands [5] are missing: a strand was removed"),
    ("change", "a1", "broken at entry #{a1}: its hash does not match its content"),
])
def test_damage_to_one_strand_is_found(world, damage, victim, found):
    entries = braided(world.a.tenant)
    if damage == "remove":
        remove(entries[victim])
    elif damage == "move":
        tamper(entries[victim], strand=0)
    elif damage == "strand":  # the whole strand, entries and head
        remove(entries["b0"])
        remove(entries["b1"])
        ChainHead.objects.for_tenant(world.a.tenant).filter(strand=1).delete()
    elif damage == "head":  # an empty strand's head: only the fixed set of strands shows it
        ChainHead.objects.for_tenant(world.a.tenant).filter(strand=5).delete()
    else:
        tamper(entries[victim], data={"tampered": True})
    check = audit_check(tenant=world.a.tenant)
    assert check.status == "broken"
    assert found.format(**{verb: e.pk for verb, e in entries.items()}) in check.summary()


@on_postgres
def test_a_strand_cut_back_to_empty_cannot_borrow_another_strands_signature():
    """Each head's signature names its strand: an empty strand's signed head fits no other strand. (The entry
    removed here is the newest of all, which no later entry saw: the signature is what shows it.)"""
    with keyed:
        tenant = Tenant.objects.create(slug="keyed-braid", name="Keyed")
        audit_record(tenant=tenant, verb="test.start")  # the chain's heads, made by its first append
        holder = Holder(tenant, "a0").hold()
        with transaction.atomic():
            newest = audit_record(tenant=tenant, verb="b0")
        holder.finish()
        assert newest.strand == 1 and audit_check(tenant=tenant).status == "intact"
    remove(newest)
    empty_of_2 = ChainHead.objects.for_tenant(tenant).get(strand=2)
    assert (empty_of_2.count, empty_of_2.signature != "") == (0, True)
    ChainHead.objects.for_tenant(tenant).filter(strand=1).update(count=0, last_id=None, hash="",
                                                                 signature=empty_of_2.signature)
    with keyed:
        check = audit_check(tenant=tenant)
    assert check.status == "broken" and "the chain's head signature does not match" in check.reason


@on_postgres
@pytest.mark.parametrize("with_key", [True, False], ids=["keyed", "plain"])
def test_a_strand_set_back_to_an_earlier_state_of_its_own_is_found(with_key):
    """The replay of a strand's own earlier head (here the signed empty one it was made with): its entries
    removed, everything else left. Every later entry recorded how many entries each strand had."""
    context = keyed if with_key else override_settings()
    with context:
        tenant = Tenant.objects.create(slug="rewound", name="Rewound")
        audit_record(tenant=tenant, verb="test.start")
        saved = ChainHead.objects.for_tenant(tenant).values("count", "last_id", "hash", "signature").get(strand=1)
        entries = braided(tenant)  # a1 and a2 come after b0 and b1, and saw strand 1 with 2 entries
        assert audit_check(tenant=tenant).intact
    remove(entries["b0"])
    remove(entries["b1"])
    ChainHead.objects.for_tenant(tenant).filter(strand=1).update(**saved)
    with context:
        check = audit_check(tenant=tenant)
    assert (check.status, check.entry) == ("broken", entries["a1"].pk)
    assert "it saw 2 entries in strand 1, which has 0 before it" in check.reason
    assert [entries[v].seen[1] for v in ("a0", "b0", "b1", "a1", "a2")] == [0, 0, 1, 2, 2]
    assert [entries[v].seen[0] for v in ("a0", "b0", "b1", "a1", "a2")] == [1, 1, 1, 2, 3]
    # The strand grows again from the head put back (strand 0 held, so new entries land in strand 1): the
    # entries a1 saw are still missing before it.
    with context:
        holder = Holder(tenant, "later.0").hold()
        with transaction.atomic():
            regrown = [audit_record(tenant=tenant, verb=f"later.1.{n}") for n in range(3)]
        holder.finish()
        assert [event.strand for event in regrown] == [1, 1, 1]
        check = audit_check(tenant=tenant)
    assert (check.status, check.entry) == ("broken", entries["a1"].pk)


@on_postgres
def test_an_entry_whose_record_of_the_strands_was_changed_is_found(world):
    """Its record is covered by its hash: lowering what it saw of another strand (to hide that strand's
    removed entries) changes the hash."""
    entries = braided(world.a.tenant)
    seen = list(entries["a2"].seen)
    seen[1] = 0
    tamper(entries["a2"], seen=seen)
    check = audit_check(tenant=world.a.tenant)
    assert (check.status, check.entry) == ("broken", entries["a2"].pk)
    assert "its hash does not match its content" in check.reason


@on_postgres
def test_signing_a_braided_chain_begun_before_the_key(world):
    braided(world.a.tenant)
    with keyed:
        audit_record(tenant=world.a.tenant, verb="test.after_key")
        assert audit_check(tenant=world.a.tenant).status == "unsigned"
        check = audit_chain_sign(tenant=world.a.tenant)
        assert (check.status, check.entries) == ("intact", len(chain(world.a.tenant)))
        assert not ChainHead.objects.for_tenant(world.a.tenant).filter(signature="").exists()


# --- the migration that made strands of each tenant's single chain ---------------------------------------

@pytest.fixture(scope="module")
def apps():
    """The models as the migration sees them (plain managers, not the tenant-scoped ones)."""
    return MigrationLoader(None, ignore_no_migrations=True).project_state(("audit", "0003_strands")).apps


def as_before_strands(tenant) -> None:
    """A chain as it was before strands: its entries in strand 0 and one head."""
    assert not Event.objects.for_tenant(tenant).filter(strand__gt=0).exists()
    ChainHead.objects.for_tenant(tenant).filter(strand__gt=0).delete()


def test_the_migration_gives_every_chain_its_strands(world, apps):
    as_before_strands(world.a.tenant)
    assert audit_check(tenant=world.a.tenant).status == "broken"  # strands missing
    strands_migration.heads_for_every_strand(apps, None)
    heads = ChainHead.objects.for_tenant(world.a.tenant)
    assert sorted(heads.values_list("strand", flat=True)) == list(range(STRANDS))
    assert set(heads.values_list("signature", flat=True)) == {""}
    check = audit_check(tenant=world.a.tenant)
    assert (check.status, check.entries) == ("intact", len(chain(world.a.tenant)))
    audit_record(tenant=world.a.tenant, verb="test.after")
    assert audit_check(tenant=world.a.tenant).intact


def test_the_migration_signs_the_new_strands_of_a_signed_chain(apps):
    with keyed:
        tenant = Tenant.objects.create(slug="keyed-old", name="Keyed")
        for n in range(3):
            audit_record(tenant=tenant, verb="test.event", data={"n": n})
        as_before_strands(tenant)
        strands_migration.heads_for_every_strand(apps, None)
        check = audit_check(tenant=tenant)
    assert (check.status, check.entries, check.head_signed) == ("intact", 3, True)
    empty = ChainHead.objects.for_tenant(tenant).get(strand=5)
    assert empty.signature == head_signature(key=AUDIT_KEY.encode(), tenant_id=tenant.pk, strand=5, count=0,
                                             last_id=None, hash="")


def test_the_migration_reverses_only_while_no_entry_was_appended_with_strands(world, apps):
    """Entries appended with strands hash their strand's place and every strand's count: going back would
    leave hashes the single chain cannot check. Entries from before the strands go back as they came."""
    with pytest.raises(RuntimeError, match="cannot hold them without rewriting their hashes"):
        strands_migration.one_head_per_tenant(apps, None)
    assert ChainHead.objects.for_tenant(world.a.tenant).count() == STRANDS
    Event.all_tenants.update(seen=None)  # as if every entry were from before the strands
    strands_migration.one_head_per_tenant(apps, None)
    assert list(ChainHead.objects.for_tenant(world.a.tenant).values_list("strand", flat=True)) == [0]
    strands_migration.heads_for_every_strand(apps, None)
    Event.objects.for_tenant(world.a.tenant).filter(pk=chain(world.a.tenant)[-1].pk).update(strand=3)
    with pytest.raises(RuntimeError, match="cannot hold them without rewriting their hashes"):
        strands_migration.one_head_per_tenant(apps, None)



def test_the_migration_refuses_to_leave_a_signed_chain_unsigned(apps):
    """Run without the key, new heads of a signed chain would be unsigned for good: the migration says so."""
    with keyed:
        tenant = Tenant.objects.create(slug="keyed-nokey", name="Keyed")
        audit_record(tenant=tenant, verb="test.event")
        as_before_strands(tenant)
    with pytest.raises(RuntimeError, match="run this migration with TOOLKEEPER_AUDIT_KEY set"):
        strands_migration.heads_for_every_strand(apps, None)
    assert ChainHead.objects.for_tenant(tenant).count() == 1
