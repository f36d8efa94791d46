"""Per-tenant versions and per-process caches (tenancy.versions): one mechanism for the tool catalog and
the compiled rules."""
import time

import pytest
from django.db import transaction

from approvals.engine import index_cache
from approvals.models import PolicyVersion
from tenancy import versions
from tenancy.selectors import apikey_from_token, versions_read_with
from tenancy.versions import VersionedCache, version_bump, version_of, versions_known
from tools.catalog.snapshot import _snapshots
from tools.models import CatalogVersion


class Builds:
    def __init__(self):
        self.versions: list[int] = []

    def __call__(self, tenant_id: int, version: int) -> tuple[int, int]:
        self.versions.append(version)
        return tenant_id, version


def test_catalog_snapshots_and_rule_indexes_are_kept_by_the_same_cache():
    assert isinstance(_snapshots, VersionedCache) and _snapshots.model is CatalogVersion
    assert isinstance(index_cache, VersionedCache) and index_cache.model is PolicyVersion


@pytest.mark.parametrize("model", [CatalogVersion, PolicyVersion])
def test_a_value_is_built_once_per_version_of_its_tenant(world, model):
    cache, build = VersionedCache(model), Builds()
    a, b = world.a.tenant.pk, world.b.tenant.pk
    assert cache.get(a, build) == cache.get(a, build) == (a, version_of(model, a))
    assert len(build.versions) == 1
    version_bump(model, b)  # another tenant's change
    cache.get(a, build)
    assert len(build.versions) == 1
    version_bump(model, a)
    assert cache.get(a, build) == (a, version_of(model, a))
    assert len(build.versions) == 2 and build.versions[0] != build.versions[1]


def test_what_a_rolled_back_change_built_is_not_served_after_it(world):
    cache, build = VersionedCache(PolicyVersion), Builds()
    tenant = world.a.tenant.pk
    before = cache.get(tenant, build)
    with pytest.raises(RuntimeError), transaction.atomic():
        version_bump(PolicyVersion, tenant)
        inside = cache.get(tenant, build)
        assert inside != before
        raise RuntimeError("roll back")
    assert cache.get(tenant, build) == before  # rebuilt for the version that stands
    assert len(build.versions) == 3


def test_a_bump_creates_the_version_row_of_a_tenant_that_has_none(world):
    tenant = world.a.tenant.pk
    PolicyVersion.objects.for_tenant(tenant).delete()
    assert version_of(PolicyVersion, tenant) == 0
    version_bump(PolicyVersion, tenant)
    assert PolicyVersion.objects.for_tenant(tenant).count() == 1 and version_of(PolicyVersion, tenant) != 0


def test_versions_read_with_the_key_stand_in_for_a_moment_and_a_change_is_read_again(world, monkeypatch):
    tenant = world.a.tenant.pk
    real = version_of(PolicyVersion, tenant)
    reads = []
    monkeypatch.setattr(versions, "tenant_scalar", lambda *args: reads.append(args) or real)
    now = time.monotonic()
    with versions_known(tenant, {PolicyVersion: 123}, now):
        assert version_of(PolicyVersion, tenant) == 123 and reads == []  # known: not read again
        assert version_of(PolicyVersion, world.b.tenant.pk) == real and len(reads) == 1  # another tenant's
        with transaction.atomic():
            version_bump(PolicyVersion, tenant)
            assert version_of(PolicyVersion, tenant) == real and len(reads) == 2  # its own change: read
    with versions_known(tenant, {PolicyVersion: 123}, now - versions.KNOWN_FOR_S):
        assert version_of(PolicyVersion, tenant) == real  # read too long ago: read again
    assert version_of(PolicyVersion, tenant) == real  # outside the block


def test_a_request_reads_the_versions_with_its_key(world, django_assert_num_queries):
    """The key's one statement brings the tenant's configuration versions; a second read of the key's
    configuration needs none."""
    api_key = world.a.key_objects["agent"]
    secret = world.a.keys["agent"]
    with django_assert_num_queries(1):
        found = apikey_from_token(secret)
    found_versions, read_at = versions_read_with(found)
    assert found.pk == api_key.pk and read_at > 0
    assert found_versions[PolicyVersion] == version_of(PolicyVersion, api_key.tenant_id)
