"""API keys: a prefix to find them, a hash to check them, scopes, agent lock, revocation, last use."""
import pytest
from django.db import connection
from rest_framework.test import APIClient

from audit.models import Event
from common.errors import ServiceError
from tenancy.models import ApiKey
from tenancy.selectors import apikey_from_token
from tenancy.services import apikey_create, apikey_revoke


def _parts(key: str) -> tuple[str, str]:
    assert key.startswith("tk_")
    prefix, secret = key[3:].split("_", 1)
    return prefix, secret


def test_key_shape_and_storage(world):
    issued = apikey_create(tenant=world.a.tenant, name="ci", scopes=["agent", "external"])
    prefix, secret = _parts(issued.key)
    assert len(secret) >= 32
    row = ApiKey.objects.for_tenant(world.a.tenant).get(pk=issued.api_key.pk)
    assert row.prefix == prefix
    assert row.scopes == ["agent", "external"]
    assert secret not in row.secret_hash and row.secret_hash != secret
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM tenancy_apikey WHERE id = %s", [row.pk])
        stored = " ".join(str(value) for value in cursor.fetchone())
    assert secret not in stored
    assert issued.key not in stored
    audit = " ".join(str(e.data) + e.target for e in Event.objects.for_tenant(world.a.tenant))
    assert secret not in audit
    assert secret not in str(row) and secret not in repr(row)


def test_prefix_lookup(world):
    key = world.a.keys["agent"]
    prefix, secret = _parts(key)
    found = apikey_from_token(key)
    assert found is not None and found.pk == world.a.key_objects["agent"].pk
    assert found.tenant == world.a.tenant
    assert apikey_from_token(f"tk_{prefix}_{secret[:-1]}") is None
    assert apikey_from_token(f"tk_{prefix}_") is None
    assert apikey_from_token(f"{prefix}_{secret}") is None
    assert apikey_from_token("") is None
    b_prefix, _ = _parts(world.b.keys["agent"])
    assert apikey_from_token(f"tk_{b_prefix}_{secret}") is None


def test_prefixes_are_unique(world):
    prefixes = [apikey_create(tenant=world.a.tenant, name=f"k{i}", scopes=["agent"]).api_key.prefix
                for i in range(20)]
    assert len(set(prefixes)) == 20


def test_revocation(world):
    api_key = world.a.key_objects["agent"]
    client = world.a.client()
    assert client.get(f"/api/v1/sessions/{world.a.session.pk}").status_code == 200
    apikey_revoke(api_key=api_key, actor=world.a.users["admin"])
    assert apikey_from_token(world.a.keys["agent"]) is None
    assert client.get(f"/api/v1/sessions/{world.a.session.pk}").status_code == 401
    assert Event.objects.for_tenant(world.a.tenant).filter(verb="apikey.revoked",
                                                           target=f"apikey:{api_key.pk}").count() == 1
    first = ApiKey.objects.for_tenant(world.a.tenant).get(pk=api_key.pk).revoked_at
    apikey_revoke(api_key=api_key)  # idempotent
    assert ApiKey.objects.for_tenant(world.a.tenant).get(pk=api_key.pk).revoked_at == first
    # other keys keep working
    assert world.a.client("locked").get(f"/api/v1/sessions/{world.a.session.pk}").status_code == 200


def test_last_used_at_is_set(world):
    issued = apikey_create(tenant=world.a.tenant, name="fresh", scopes=["agent"])
    assert issued.api_key.last_used_at is None
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.key}")
    assert client.post("/api/v1/sessions", {"agent": "x"}, format="json").status_code == 201
    assert ApiKey.objects.for_tenant(world.a.tenant).get(pk=issued.api_key.pk).last_used_at is not None


@pytest.mark.parametrize("scopes", [[], ["root"], ["agent", "superuser"]])
def test_scopes_are_validated(world, scopes):
    with pytest.raises(ServiceError):
        apikey_create(tenant=world.a.tenant, name="bad", scopes=scopes)


def test_scopes_decide_the_endpoints(world):
    issued = apikey_create(tenant=world.a.tenant, name="all", scopes=["agent", "external", "admin"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.key}")
    assert client.get("/api/v1/groups").status_code == 200
    assert client.post("/api/v1/sessions", {"agent": "x"}, format="json").status_code == 201
    assert world.a.client("admin").get("/api/v1/groups").status_code == 200
