"""The audit log page (docs/notes/console.md): filters, links to what each entry names, integrity with the first
bad entry, exports of the filtered view, and a constant number of queries however long the log."""
import csv
import io
import json
from datetime import datetime, time, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import Event
from audit.services import audit_record
from tenancy.services import apikey_create
from tests.bulk import copy_rows
from tools.catalog.services import group_create
from tools.upstream.servers import mcp_server_create

pytestmark = pytest.mark.django_db


def _entries(response) -> list[int]:
    import re

    return [int(pk) for pk in re.findall(r'<tr id="entry-(\d+)">', response.content.decode())]


def _mine(tenant, **filters) -> list[int]:
    return list(Event.objects.for_tenant(tenant).filter(**filters).order_by("-id").values_list("pk", flat=True))


def test_the_filters_find_by_actor_action_target_and_day(world):
    a = world.a
    admin = a.console("operator")
    group_create(tenant=a.tenant, name="research", actor=a.users["admin"])
    apikey_create(tenant=a.tenant, name="bot", scopes=["agent"], created_by=a.users["operator"])
    assert _entries(admin.get("/t/acme/audit/", {"action": "group."})) == _mine(a.tenant, verb__startswith="group.")
    assert _entries(admin.get("/t/acme/audit/", {"actor": "acme-oper"})) == _mine(
        a.tenant, actor_label__icontains="acme-oper")
    assert _mine(a.tenant, actor_label__icontains="acme-oper")  # the filter found something to find
    assert _entries(admin.get("/t/acme/audit/", {"target": "group:research"})) == _mine(
        a.tenant, target="group:research")
    # The shared world may have been built before midnight: the days run from its first entry's to today.
    today = timezone.localdate()
    first = timezone.localdate(Event.objects.for_tenant(a.tenant).order_by("at").first().at)
    assert _entries(admin.get("/t/acme/audit/", {"since": first, "until": today})) == _mine(a.tenant)
    assert _entries(admin.get("/t/acme/audit/", {"since": today, "until": today})) == _mine(
        a.tenant, at__gte=timezone.make_aware(datetime.combine(today, time.min)))
    assert _entries(admin.get("/t/acme/audit/", {"until": first - timedelta(days=1)})) == []
    backwards = admin.get("/t/acme/audit/", {"since": today, "until": today - timedelta(days=1)})
    assert backwards.status_code == 400 and "the last day comes after the first" in backwards.content.decode()
    # another tenant's entry is not found by its id
    foreign = Event.objects.for_tenant(world.b.tenant).order_by("pk").first()
    assert _entries(admin.get("/t/acme/audit/", {"entry": foreign.pk})) == []


def test_each_entry_links_to_what_it_names_while_it_exists(world):
    a = world.a
    group = group_create(tenant=a.tenant, name="research", actor=a.users["admin"])
    server = mcp_server_create(tenant=a.tenant, name="docs", transport="streamable_http",
                               url="https://93.184.215.14/mcp", enabled=False)
    audit_record(tenant=a.tenant, verb="test.gone", target="tool:no_such_tool")
    page = a.console("admin").get("/t/acme/audit/").content.decode()
    assert f'<a href="/t/acme/groups/{group.pk}/">group:research</a>' in page
    assert f'<a href="/t/acme/mcp-servers/{server.pk}/">mcp_server:docs</a>' in page
    assert "<td data-label=\"Target\">tool:no_such_tool</td>" in page
    # B's tool of the same name is not A's to link to
    audit_record(tenant=a.tenant, verb="test.foreign", target="session:" + str(world.b.session.pk))
    page = a.console("admin").get("/t/acme/audit/").content.decode()
    assert f'/t/acme/sessions/{world.b.session.pk}/' not in page


def test_integrity_names_the_first_bad_entry(world):
    a = world.a
    admin = a.console("operator")
    page = admin.get("/t/acme/audit/").content.decode()
    assert 'data-audit-status="intact"' in page and "first-bad-entry" not in page
    victim = Event.objects.for_tenant(a.tenant).order_by("pk")[2]
    Event.objects.for_tenant(a.tenant).filter(pk=victim.pk).update(data={"rewritten": True})
    assert admin.post("/t/acme/audit/").status_code == 302  # check now, not the cached result
    page = admin.get("/t/acme/audit/").content.decode()
    assert 'data-audit-status="broken"' in page
    assert f'href="?entry={victim.pk}">#{victim.pk}</a>' in page
    assert _entries(admin.get("/t/acme/audit/", {"entry": victim.pk})) == [victim.pk]


def test_the_exports_hold_the_filtered_view_and_no_formulas(world):
    a = world.a
    client = a.console("operator")
    audit_record(tenant=a.tenant, verb="test.formula", target="=HYPERLINK(\"http://evil\")",
                 data={"note": "=1+1"})
    csv_response = client.get("/t/acme/audit/export.csv", {"action": "test."})
    assert csv_response["Content-Type"].startswith("text/csv")
    assert "attachment" in csv_response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(b"".join(csv_response).decode())))
    assert [row["verb"] for row in rows] == ["test.formula"]
    assert rows[0]["target"] == "'=HYPERLINK(\"http://evil\")"
    assert json.loads(rows[0]["data"]) == {"note": "=1+1"}  # a JSON object starts with {, never a formula
    lines = b"".join(client.get("/t/acme/audit/export.jsonl")).decode().splitlines()
    exported = [json.loads(line) for line in lines]
    assert [row["id"] for row in exported] == _mine(a.tenant)
    assert {row["verb"] for row in exported} >= {"test.formula", "tenant.created"}
    assert not any(row["id"] in _mine(world.b.tenant) for row in exported)


def test_an_export_streams_past_one_chunk(world, monkeypatch):
    from audit import pages

    monkeypatch.setattr(pages, "EXPORT_CHUNK", 3)
    lines = b"".join(world.a.console("operator").get("/t/acme/audit/export.jsonl")).decode()
    assert [json.loads(line)["id"] for line in lines.splitlines()] == _mine(world.a.tenant)
    assert len(_mine(world.a.tenant)) > 3


def test_reviewers_and_viewers_do_not_see_the_audit_log(world):
    for role in ("reviewer", "viewer"):
        client = world.a.console(role)
        for path in ("/t/acme/audit/", "/t/acme/audit/export.csv", "/t/acme/audit/export.jsonl"):
            assert client.get(path).status_code == 403


BULK_TARGETS = ["tool:calculate", "group:math", "session:00000000-0000-0000-0000-000000000000", "apikey:1",
                "mcp_server:none", "rule:1", "queue:default", "dataset:none", "skill:1", "user:nobody", "call:x"]


def _bulk_events(tenant, count: int) -> None:
    """`count` entries with targets of every kind (copies of one: no chain, only the list is read)."""
    first = audit_record(tenant=tenant, verb="bulk.made", target=BULK_TARGETS[0])
    cases = " ".join("WHEN %s THEN %s" for _ in BULK_TARGETS)
    params = [value for index, target in enumerate(BULK_TARGETS) for value in (index, target)]
    copy_rows(first, count - 1, {"target": (f"CASE n %% {len(BULK_TARGETS)} {cases} END", params)})


def _queries(client, path: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(path).status_code == 200
    return len(captured)


def test_the_audit_list_takes_as_many_queries_for_100k_entries_as_for_100(world):
    client = world.a.console("operator")
    _bulk_events(world.a.tenant, 100)
    client.get("/t/acme/audit/")  # the integrity check, made once and kept for a few minutes
    paths = ["/t/acme/audit/?page=2", "/t/acme/audit/?action=bulk.&target=tool:&page=1"]
    few = [_queries(client, path) for path in paths]
    _bulk_events(world.a.tenant, 100_000)
    assert Event.objects.for_tenant(world.a.tenant).count() > 100_000
    paths[0] = "/t/acme/audit/?page=1500"
    assert [_queries(client, path) for path in paths] == few
