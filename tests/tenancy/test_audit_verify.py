"""Checking the audit log: `manage.py verify_audit`, `GET /api/v1/audit/verify` and the dashboard's line.

A change to any entry, or the removal of any entry (the newest included), is found and the first bad entry
is named. With TOOLKEEPER_AUDIT_KEY the chain is keyed, so rewriting it needs more than database access.
"""
import hashlib

import pytest
from django.core.cache import cache
from django.core.management import CommandError, call_command
from django.test import override_settings

from audit import selectors
from audit.chain import KEYED, PLAIN, SCHEME, STRANDS, entry_columns, entry_payload, heads_digest
from audit.models import ChainHead, Event
from audit.selectors import audit_check
from audit.services import audit_record
from tenancy.services import tenant_create

pytestmark = pytest.mark.django_db

AUDIT_KEY = "audit-key-for-tests-" + "k" * 24
keyed = override_settings(TOOLKEEPER_AUDIT_KEY=AUDIT_KEY)


def verify(*args: str) -> tuple[int, str]:
    """(exit code, what the command printed) of `manage.py verify_audit ARGS`."""
    from io import StringIO

    out = StringIO()
    try:
        call_command("verify_audit", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue() + str(exc)
    return 0, out.getvalue()


def chain(tenant) -> list[Event]:
    return list(Event.objects.for_tenant(tenant).order_by("id"))


def tamper(event: Event, **changes) -> None:
    Event.objects.for_tenant(event.tenant_id).filter(pk=event.pk).update(**changes)


def remove(event: Event) -> None:
    Event.all_tenants.filter(pk=event.pk)._raw_delete(Event.all_tenants.db)


def test_an_intact_log_exits_0(world):
    code, output = verify()
    assert code == 0, output
    assert f"acme: intact ({len(chain(world.a.tenant))} entries)" in output
    assert "globex: intact" in output
    assert verify("--tenant", "acme")[0] == 0


@pytest.mark.parametrize("change", [{"data": {"tampered": True}}, {"verb": "tenant.deleted"},
                                    {"actor_label": "mallory"}, {"target": "tenant:elsewhere"}])
def test_a_changed_entry_is_named(world, change):
    events = chain(world.a.tenant)
    victim = events[len(events) // 2]
    tamper(victim, **change)
    code, output = verify("--tenant", "acme")
    assert code == 1
    assert f"acme: broken at entry #{victim.pk}: its hash does not match its content" in output
    assert verify("--tenant", "globex")[0] == 0


def test_a_removed_middle_entry_is_found_at_the_next_one(world):
    events = chain(world.a.tenant)
    remove(events[3])
    code, output = verify("--tenant", "acme")
    assert code == 1
    assert f"broken at entry #{events[4].pk}: it does not follow the entry before it" in output


def test_a_removed_newest_entry_is_named(world):
    events = chain(world.a.tenant)
    remove(events[-1])
    code, output = verify("--tenant", "acme")
    assert code == 1
    assert f"broken at entry #{events[-1].pk}: it is missing" in output
    check = audit_check(tenant=world.a.tenant)
    assert (check.status, check.entry, check.entries) == ("broken", events[-1].pk, len(events) - 1)


def test_the_newest_entries_removed_together_are_named(world):
    events = chain(world.a.tenant)
    for event in events[-3:]:
        remove(event)
    assert f"broken at entry #{events[-1].pk}: it is missing" in verify("--tenant", "acme")[1]


def test_an_entry_added_behind_the_logs_back_is_found(world):
    """A row inserted with a correct plain hash, but not through the log (the head does not know it)."""
    last = chain(world.a.tenant)[-1]
    forged = Event(tenant=world.a.tenant, actor_label="mallory", verb="tenant.deleted", target="tenant:acme",
                   data={}, at=last.at, prev_hash=last.hash, algorithm=PLAIN, version=SCHEME)
    forged.hash = hashlib.sha256(_payload(forged, last.pk)).hexdigest()
    forged.save()
    code, output = verify("--tenant", "acme")
    assert code == 1 and f"broken at entry #{forged.pk}: it is newer than the chain's head" in output


def test_an_append_that_commits_while_the_check_walks_is_not_a_break(world, monkeypatch):
    """The head is read, then the chain walked: an entry appended in between (with its head) is newer than
    the head the walk started from, yet written through the log. Before, that was reported as a break."""
    real_walk = selectors._walk

    def append_first(*args):
        audit_record(tenant=world.a.tenant, verb="test.meanwhile", target="x")
        return real_walk(*args)

    monkeypatch.setattr(selectors, "_walk", append_first)
    check = audit_check(tenant=world.a.tenant)
    assert (check.status, check.entries) == ("intact", len(chain(world.a.tenant)) - 1)
    monkeypatch.undo()
    assert audit_check(tenant=world.a.tenant).entries == len(chain(world.a.tenant))


def test_the_head_is_kept_with_every_append(world):
    audit_record(tenant=world.a.tenant, verb="test.event", target="x")
    events = chain(world.a.tenant)
    heads = list(ChainHead.objects.for_tenant(world.a.tenant).order_by("strand"))
    assert [head.strand for head in heads] == list(range(STRANDS))
    head = heads[0]  # appends one after another all take the first strand
    assert (head.count, head.last_id, head.hash, head.signature) == (len(events), events[-1].pk, events[-1].hash, "")
    assert {(h.count, h.last_id, h.hash) for h in heads[1:]} == {(0, None, "")}
    assert [(e.algorithm, e.strand) for e in events] == [(PLAIN, 0)] * len(events)


# --- the keyed chain -------------------------------------------------------------------------------

def _payload(event: Event, prev_id: int | None) -> bytes:
    return entry_payload(entry_columns(event), prev_id=prev_id)


def keyed_tenant(slug: str = "keyed"):
    with keyed:
        tenant = tenant_create(slug=slug)
        for n in range(5):
            audit_record(tenant=tenant, verb="test.event", target=f"thing:{n}", data={"n": n})
    return tenant


def rewrite_plainly(events: list[Event], *, start: int, mark_plain: bool) -> str:
    """What an attacker with database access can do: change entries from `start` on and recompute every
    hash after it with plain SHA-256 (the only hash they can compute). Returns the new newest hash."""
    prev_hash = events[start - 1].hash if start else ""
    for position, event in enumerate(events[start:], start):
        event.prev_hash = prev_hash
        event.algorithm = PLAIN if mark_plain else event.algorithm  # hashed too
        event.hash = hashlib.sha256(_payload(event, events[position - 1].pk if position else None)).hexdigest()
        tamper(event, data=event.data, prev_hash=event.prev_hash, hash=event.hash, algorithm=event.algorithm)
        prev_hash = event.hash
    return prev_hash


def test_a_keyed_chain_is_keyed_and_intact():
    tenant = keyed_tenant()
    assert {e.algorithm for e in chain(tenant)} == {KEYED}
    with keyed:
        check = audit_check(tenant=tenant)
        assert check.status == "intact" and check.head_signed
        assert verify("--tenant", "keyed") == (0, f"keyed: intact ({len(chain(tenant))} entries, keyed)\n")


@pytest.mark.parametrize("start,mark_plain,unsign,code,found", [
    (2, True, False, 1, "keyed: broken at entry #{victim}"),  # marked as plain entries after keyed ones
    (2, False, False, 1, "keyed: broken at entry #{victim}: its hash does not match"),  # still marked keyed
    # Every entry rewritten and the head's signature removed: nothing left to contradict it but the key's
    # presence, so a chain that should be signed and is not is reported as such.
    (0, True, True, 2, "keyed: not signed with the audit key"),
])
def test_a_keyed_chain_rewritten_with_plain_sha256_is_found(start, mark_plain, unsign, code, found):
    tenant = keyed_tenant()
    events = chain(tenant)
    events[2].data = {"n": "rewritten"}
    newest_hash = rewrite_plainly(events, start=start, mark_plain=mark_plain)
    ChainHead.objects.for_tenant(tenant).filter(strand=0).update(hash=newest_hash)  # the head follows the rewrite
    if unsign:
        ChainHead.objects.for_tenant(tenant).update(signature="")
    with keyed:
        exit_code, output = verify("--tenant", "keyed")
    assert exit_code == code
    assert found.format(victim=events[2].pk) in output


def test_a_keyed_chain_rewound_by_its_head_is_found():
    """Remove the newest entry and set the head back to the one before: only the key can sign a head."""
    tenant = keyed_tenant()
    events = chain(tenant)
    remove(events[-1])
    ChainHead.objects.for_tenant(tenant).filter(strand=0).update(count=len(events) - 1, last_id=events[-2].pk,
                                                                 hash=events[-2].hash)
    with keyed:
        code, output = verify("--tenant", "keyed")
    assert code == 1
    assert f"broken at entry #{events[-2].pk}: the chain's head signature does not match" in output


def test_a_keyed_chain_without_the_key_cannot_be_verified_but_is_not_called_broken():
    tenant = keyed_tenant()
    code, output = verify("--tenant", "keyed")
    assert code == 2
    assert "keyed: cannot be verified without the audit key" in output
    assert "broken" not in output
    remove(chain(tenant)[2])  # what is visible without the key is still checked
    code, output = verify("--tenant", "keyed")
    assert code == 1 and "broken at entry" in output


def test_a_wrong_key_finds_the_chain_broken():
    tenant = keyed_tenant()
    with override_settings(TOOLKEEPER_AUDIT_KEY="another key"):
        check = audit_check(tenant=tenant)
    assert (check.status, check.entry) == ("broken", chain(tenant)[0].pk)


def test_entries_written_before_the_key_stay_verifiable(world):
    plain = chain(world.a.tenant)
    with keyed:
        audit_record(tenant=world.a.tenant, verb="test.after_key", target="x")
        assert chain(world.a.tenant)[-1].algorithm == KEYED
        code, output = verify("--tenant", "acme")
        assert code == 2 and "acme: not signed with the audit key" in output  # nobody vouched for the old part
        code, output = verify("--tenant", "acme", "--sign")
        assert code == 0 and "acme: intact" in output
        assert chain(world.a.tenant)[-1].verb == "audit.signed"
        assert verify("--tenant", "acme")[0] == 0
        tamper(plain[1], data={"tampered": True})
        code, output = verify("--tenant", "acme")
    assert code == 1 and f"broken at entry #{plain[1].pk}: its hash does not match its content" in output


def test_signing_refuses_a_broken_chain(world):
    events = chain(world.a.tenant)
    tamper(events[1], verb="tenant.deleted")
    with keyed:
        code, output = verify("--tenant", "acme", "--sign")
    assert code == 1 and f"broken at entry #{events[1].pk}" in output
    assert set(ChainHead.objects.for_tenant(world.a.tenant).values_list("signature", flat=True)) == {""}


def test_a_plain_entry_after_keyed_ones_is_found():
    """An append made without the key (a server started without it) cannot extend a keyed chain validly."""
    tenant = keyed_tenant()
    audit_record(tenant=tenant, verb="test.without_key", target="x")
    with keyed:
        check = audit_check(tenant=tenant)
    assert (check.status, check.entry) == ("broken", chain(tenant)[-1].pk)
    assert "written without the audit key after keyed entries" in check.reason


# --- the endpoint and the dashboard -------------------------------------------------------------------

def test_the_verify_endpoint_answers_admins_with_their_own_chain_only(world):
    b_events = chain(world.b.tenant)
    tamper(b_events[2], verb="tenant.deleted")
    response = world.a.client("admin").get("/api/v1/audit/verify")
    assert response.status_code == 200
    body = response.json()
    a_events = chain(world.a.tenant)
    assert body == {"status": "intact", "intact": True, "entries": len(a_events), "entry": None,
                    "message": f"intact ({len(a_events)} entries)", "keyed": False,
                    "head": {"count": len(a_events), "signed": False,
                             "hash": heads_digest(ChainHead.objects.for_tenant(world.a.tenant).order_by("strand")),
                             "strands": [{"strand": 0, "count": len(a_events), "last_id": a_events[-1].pk,
                                          "hash": a_events[-1].hash}]
                             + [{"strand": n, "count": 0, "last_id": None, "hash": ""} for n in range(1, STRANDS)]}}
    assert not {str(e.pk) for e in b_events} & set(response.content.decode().split('"'))
    assert all(e.hash not in response.content.decode() for e in b_events)
    b_body = world.b.client("admin").get("/api/v1/audit/verify").json()
    assert (b_body["status"], b_body["entry"]) == ("broken", b_events[2].pk)
    assert world.a.client("agent").get("/api/v1/audit/verify").status_code == 403
    assert world.a.client("external").get("/api/v1/audit/verify").status_code == 403


def test_the_dashboard_shows_the_chains_state(world):
    cache.clear()
    page = world.a.console("viewer").get("/t/acme/").content.decode()
    assert 'data-audit-status="intact"' in page
    assert f"intact ({len(chain(world.a.tenant))} entries)" in page
    events = chain(world.a.tenant)
    tamper(events[1], data={"tampered": True})
    cache.clear()  # the dashboard re-checks a few minutes after its last check
    page = world.a.console("viewer").get("/t/acme/").content.decode()
    assert 'data-audit-status="broken"' in page
    assert f"broken at entry #{events[1].pk}" in page
    assert 'data-audit-status="intact"' in world.b.console("viewer").get("/t/globex/").content.decode()
