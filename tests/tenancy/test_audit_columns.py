"""The audit hash covers every column of an entry (audit.chain.HASHED_FIELDS, scheme 2): the user's id, the
strand and the algorithm were outside the first scheme, so an entry could be given to another user unseen.
Entries hashed with the first scheme (before the change) still verify, as they were written. A column added to
Event without a scheme that hashes it fails here."""
import hashlib
import importlib
import json
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db.migrations.loader import MigrationLoader

from audit.chain import (
    COVERED_OTHERWISE,
    HASHED_FIELDS,
    KEYED,
    PLAIN,
    SCHEME,
    entry_columns,
    entry_digest,
    entry_payload,
    head_signature,
)
from audit.models import ChainHead, Event
from audit.selectors import audit_check
from audit.services import audit_record
from tenancy.fastread import insert_row
from tenancy.services import tenant_create
from tests.tenancy.test_audit_verify import AUDIT_KEY, chain, keyed, remove, tamper, verify

pytestmark = pytest.mark.django_db
version_migration = importlib.import_module("audit.migrations.0004_event_version")


def changed(value):
    """Another value of the same kind as `value` (a new kind of column needs a line here)."""
    if value is None:
        return 1
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, dict):
        return {**value, "tampered": True}
    if isinstance(value, list):
        return [*value, 0]
    if hasattr(value, "isoformat"):
        return value + timedelta(microseconds=1)
    raise AssertionError(f"no way to change a {type(value).__name__}: add one")


# --- the rule, on the payload ----------------------------------------------------------------------------

def test_every_column_of_an_entry_is_hashed_or_covered_otherwise():
    """Fails when a column is added to Event and no scheme hashes it: give it a new scheme (audit.chain)."""
    columns = [field.name for field in Event._meta.concrete_fields]
    assert sorted(columns) == sorted([*HASHED_FIELDS[SCHEME], *COVERED_OTHERWISE])
    assert len(set(HASHED_FIELDS[SCHEME])) == len(HASHED_FIELDS[SCHEME])


def test_each_hashed_column_and_the_previous_entrys_id_change_the_payload(world):
    event = chain(world.a.tenant)[-1]
    entry = entry_columns(event)
    assert entry["version"] == SCHEME
    payload = entry_payload(entry, prev_id=7)
    for name in HASHED_FIELDS[SCHEME]:
        other = 1 if name == "version" else changed(entry[name])  # the scheme before, not an unknown one
        assert entry_payload({**entry, name: other}, prev_id=7) != payload, name
    assert entry_payload(entry, prev_id=8) != payload
    assert entry_payload(entry, prev_id=None) != payload


def test_the_first_scheme_hashes_what_it_always_hashed(world):
    """Its payload is the one entries were hashed with before: a list of those values, in that order."""
    entry = {**entry_columns(chain(world.a.tenant)[-1]), "version": 1}
    expected = [entry["prev_hash"], entry["tenant"], entry["actor_label"], entry["verb"], entry["target"],
                entry["data"], entry["at"].isoformat(), entry["seen"]]
    assert entry_payload(entry, prev_id=3) == json.dumps(expected, sort_keys=True, separators=(",", ":"),
                                                         default=str).encode()
    assert entry_payload({**entry, "actor": 99, "strand": 4}, prev_id=None) == entry_payload(entry, prev_id=3)


# --- tampering, found by the check -----------------------------------------------------------------------

def test_giving_an_entry_to_another_user_is_found_by_verify_audit(world):
    events = chain(world.a.tenant)
    victim = events[len(events) // 2]
    other = world.a.users["admin"].pk if victim.actor_id != world.a.users["admin"].pk else world.a.users["viewer"].pk
    tamper(victim, actor=other)  # the label stays: only the user's id changes
    code, output = verify("--tenant", "acme")
    assert code == 1
    assert f"acme: broken at entry #{victim.pk}: its hash does not match its content" in output


@pytest.fixture
def keyed_chain(world):
    """A keyed chain e0 e1 e2 e3 of one user, with another tenant's entry between e1 and e2 (a free id)."""
    user_model = get_user_model()
    with keyed:
        tenant = tenant_create(slug="columns")
        author = user_model.objects.create(username="columns-author")
        for n in range(2):
            audit_record(tenant=tenant, actor=author, verb="test.event", target=f"thing:{n}", data={"n": n})
        between = audit_record(tenant=world.b.tenant, verb="test.elsewhere")
        for n in range(2, 4):
            audit_record(tenant=tenant, actor=author, verb="test.event", target=f"thing:{n}", data={"n": n})
    return {"tenant": tenant, "between": between, "other_tenant": world.b.tenant,
            "mallory": user_model.objects.create(username="columns-mallory")}


def tamper_column(name: str, victim: Event, facts: dict) -> None:
    """Change one column of `victim` in the database, and nothing else."""
    if name == "id":
        remove(facts["between"])  # its id is free now, and lies between the victim's neighbours
        Event.all_tenants.filter(pk=victim.pk).update(id=facts["between"].pk)
        return
    value = getattr(victim, Event._meta.get_field(name).attname)
    new = {"tenant": facts["other_tenant"].pk, "actor": facts["mallory"].pk, "strand": 3, "algorithm": PLAIN,
           "version": 1, "hash": "0" * 64, "prev_hash": "0" * 64}.get(name)
    Event.all_tenants.filter(pk=victim.pk).update(**{Event._meta.get_field(name).attname: new or changed(value)})


@pytest.mark.parametrize("name", [field.name for field in Event._meta.concrete_fields])
def test_a_change_to_any_column_of_a_keyed_entry_is_found(keyed_chain, name):
    tenant = keyed_chain["tenant"]
    events = chain(tenant)
    victim = events[-2]  # one in the middle: the newest is also pinned by its head
    with keyed:
        assert audit_check(tenant=tenant).status == "intact"
        tamper_column(name, victim, keyed_chain)
        check = audit_check(tenant=tenant)
    assert check.status == "broken", (name, check)


def test_a_new_id_between_the_neighbours_is_found_by_the_next_entrys_hash(keyed_chain):
    """The id is covered by the next entry of the strand: renumbered within its gap, nothing else moves."""
    tenant = keyed_chain["tenant"]
    events = chain(tenant)
    victim, after = events[-2], events[-1]
    assert victim.pk > keyed_chain["between"].pk
    tamper_column("id", victim, keyed_chain)
    with keyed:
        check = audit_check(tenant=tenant)
    assert (check.status, check.entry) == ("broken", after.pk)
    assert "its hash does not match its content" in check.reason


def test_claiming_the_first_scheme_for_an_entry_of_the_second_is_found(keyed_chain):
    """Scheme 1 leaves the user out; an entry cannot be moved there to change its user: its hash was made
    over the payload of scheme 2."""
    tenant = keyed_chain["tenant"]
    victim = chain(tenant)[-2]
    tamper(victim, version=1, actor=keyed_chain["mallory"].pk)
    with keyed:
        check = audit_check(tenant=tenant)
    assert (check.status, check.entry) == ("broken", victim.pk)


def test_an_unknown_scheme_is_named(world):
    victim = chain(world.a.tenant)[2]
    tamper(victim, version=9)
    check = audit_check(tenant=world.a.tenant)
    assert (check.status, check.entry, check.reason) == ("broken", victim.pk, "its hash scheme 9 is unknown")


# --- entries of the first scheme ----------------------------------------------------------------------------

def as_first_scheme(tenant, key: bytes = b"") -> list[Event]:
    """The tenant's chain as the version before wrote it: each entry hashed with scheme 1, its head following
    (signed when a key is given)."""
    events = chain(tenant)
    assert {event.strand for event in events} == {0}
    prev_hash = ""
    for event in events:
        event.version, event.prev_hash = 1, prev_hash
        event.hash = entry_digest(entry_payload(entry_columns(event), prev_id=None), algorithm=event.algorithm,
                                  key=key)
        tamper(event, version=1, prev_hash=prev_hash, hash=event.hash)
        prev_hash = event.hash
    signature = head_signature(key=key, tenant_id=tenant.pk, strand=0, count=len(events), last_id=events[-1].pk,
                               hash=prev_hash) if key else ""
    ChainHead.objects.for_tenant(tenant).filter(strand=0).update(hash=prev_hash, signature=signature)
    return events


def test_entries_of_the_first_scheme_still_verify_and_new_ones_follow_them(world):
    old = as_first_scheme(world.a.tenant)
    assert audit_check(tenant=world.a.tenant).status == "intact"
    audit_record(tenant=world.a.tenant, actor=world.a.users["admin"], verb="test.after", target="x")
    events = chain(world.a.tenant)
    assert [event.version for event in events] == [1] * len(old) + [SCHEME]
    assert verify("--tenant", "acme") == (0, f"acme: intact ({len(events)} entries)\n")
    tamper(old[3], verb="tenant.deleted")  # what the first scheme covers is still covered
    assert f"broken at entry #{old[3].pk}: its hash does not match its content" in verify("--tenant", "acme")[1]


def test_keyed_entries_of_the_first_scheme_still_verify():
    with keyed:
        tenant = tenant_create(slug="keyed-first")
        for n in range(3):
            audit_record(tenant=tenant, verb="test.event", data={"n": n})
        old = as_first_scheme(tenant, key=AUDIT_KEY.encode())
        assert {event.algorithm for event in old} == {KEYED}
        assert audit_check(tenant=tenant).status == "intact"
        audit_record(tenant=tenant, verb="test.after")
        check = audit_check(tenant=tenant)
        assert (check.status, check.entries, check.head_signed) == ("intact", len(old) + 1, True)
        tamper(old[1], data={"n": "rewritten"})
        check = audit_check(tenant=tenant)
    assert (check.status, check.entry) == ("broken", old[1].pk)


def test_an_entry_written_without_naming_its_scheme_is_of_the_first(world):
    """What a server of the version before writes during an upgrade (it does not know the column)."""
    last = chain(world.a.tenant)[-1]
    columns = {"tenant": world.a.tenant.pk, "actor": None, "actor_label": "system", "verb": "test.old_server",
               "target": "", "data": {}, "at": last.at, "prev_hash": "", "algorithm": PLAIN, "strand": 5,
               "seen": None}
    digest = hashlib.sha256(entry_payload({**columns, "version": 1}, prev_id=None)).hexdigest()
    pk = insert_row(Event, **columns, hash=digest)
    assert Event.objects.for_tenant(world.a.tenant).get(pk=pk).version == 1


# --- the migration ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def apps():
    return MigrationLoader(None, ignore_no_migrations=True).project_state(("audit", "0004_event_version")).apps


def test_the_migration_goes_back_only_while_every_entry_is_of_the_first_scheme(world, apps):
    with pytest.raises(RuntimeError, match="cannot verify them without rewriting their hashes"):
        version_migration.refuse_while_newer_entries(apps, None)
    for tenant in (world.a.tenant, world.b.tenant):
        as_first_scheme(tenant)
    version_migration.refuse_while_newer_entries(apps, None)  # nothing in the way
