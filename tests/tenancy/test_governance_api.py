"""`/api/v1/governance`: how the tenant decides and runs calls, read and changed through the admin API
(docs/api.md), each change audited; and the review of untrusted servers' tools, on for every tenant, new or
already there when the setting came (docs/governance.md)."""
import pytest

from audit.models import Event
from tenancy.services import tenant_create
from tests.migrating import database_env, run_steps

pytestmark = pytest.mark.django_db


def test_the_admin_api_reads_and_sets_the_decision_settings(world):
    admin = world.a.client("admin")
    assert admin.get("/api/v1/governance").json() == {
        "default_behavior": "allow", "auto_allow_read_only": True, "review_untrusted": True,
        "max_parallel_calls": world.a.tenant.max_parallel_calls, "tool_surface": "full"}
    patched = admin.patch("/api/v1/governance", {"review_untrusted": False}, format="json")
    assert patched.status_code == 200 and patched.json()["review_untrusted"] is False
    assert patched.json()["default_behavior"] == "allow"  # the others as they were
    world.a.tenant.refresh_from_db()
    assert world.a.tenant.review_untrusted is False
    event = Event.objects.for_tenant(world.a.tenant).get(verb="tenant.governance_set")
    assert event.actor_label == "apikey:admin" and event.data == {"review_untrusted": False}
    # the same value again changes nothing and records nothing
    assert admin.patch("/api/v1/governance", {"review_untrusted": False}, format="json").status_code == 200
    assert Event.objects.for_tenant(world.a.tenant).filter(verb="tenant.governance_set").count() == 1

    bad = admin.patch("/api/v1/governance", {"review_untrusted": True, "default_behavior": "maybe",
                                             "max_parallel_calls": 0}, format="json")
    assert bad.status_code == 400
    assert set(bad.json()["error"]["fields"]) == {"default_behavior", "max_parallel_calls"}
    for loose in (0, "false", "perhaps", None):  # JSON's own true and false only
        refused = admin.patch("/api/v1/governance", {"review_untrusted": loose}, format="json")
        assert refused.status_code == 400 and set(refused.json()["error"]["fields"]) == {"review_untrusted"}
    world.a.tenant.refresh_from_db()
    assert world.a.tenant.review_untrusted is False and world.a.tenant.default_behavior == "allow"
    world.b.tenant.refresh_from_db()
    assert world.b.tenant.review_untrusted is True


def test_only_admins_change_the_decision_settings(world):
    assert world.a.client("agent").patch("/api/v1/governance", {"review_untrusted": False},
                                         format="json").status_code == 403
    for role in ("reviewer", "viewer"):
        console = world.a.console(role)
        assert console.get("/api/v1/governance", HTTP_X_TENANT="acme").status_code in (200, 403)
        refused = console.patch("/api/v1/governance", {"review_untrusted": False}, content_type="application/json",
                                HTTP_X_TENANT="acme")
        assert refused.status_code == 403
    world.a.tenant.refresh_from_db()
    assert world.a.tenant.review_untrusted is True
    assert not Event.objects.for_tenant(world.a.tenant).filter(verb="tenant.governance_set").exists()


def test_a_new_tenant_reviews_untrusted_servers_tools():
    assert tenant_create(slug="fresh").review_untrusted is True


OLD_TENANT = ("INSERT INTO tenancy_tenant (slug, name, default_behavior, auto_allow_read_only, max_parallel_calls, "
              "key_requests_per_minute, tenant_requests_per_minute, key_calls_in_flight, tenant_calls_in_flight, "
              "created_at) VALUES ('old', 'Old', 'allow', 1, 8, 0, 0, 0, 0, '2026-01-01')")
COLUMNS = ("from django.db import connection; print([c.name for c in connection.introspection"
           ".get_table_description(connection.cursor(), 'tenancy_tenant')])")


@pytest.mark.django_db(databases=[])
def test_tenants_made_before_the_setting_get_it_on_and_going_back_drops_it(tmp_path):
    kept = ("from django.db import connection; c = connection.cursor(); "
            "c.execute(\"SELECT slug FROM tenancy_tenant WHERE slug = 'old'\"); print(c.fetchall())")
    outputs = run_steps(database_env(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite3'}"), [
        ["migrate", "-v0"],
        ["migrate", "tenancy", "0005", "-v0"],
        ["shell", COLUMNS],
        ["shell", f"from django.db import connection; connection.cursor().execute({OLD_TENANT!r})"],
        ["migrate", "-v0"],
        ["shell", "from tenancy.models import Tenant; print(Tenant.objects.get(slug='old').review_untrusted)"],
        ["migrate", "tenancy", "0005", "-v0"],
        ["shell", COLUMNS],
        ["shell", kept],
    ])
    before, turned_on, after, still_there = outputs[2], outputs[5], outputs[7], outputs[8]
    assert "review_untrusted" not in before and "'slug'" in before
    assert turned_on.strip() == "True"
    assert "review_untrusted" not in after and "'slug'" in after
    assert "old" in still_there
