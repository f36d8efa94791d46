"""Fail-closed tenant scoping (docs/governance.md).

A query on a tenant-owned model must name its tenant (`for_tenant(t)`, or a filter on `tenant`),
or come from a related manager of a row that is itself tenant-owned. Evaluating any other query
raises TenantScopeError: a forgotten filter fails loudly instead of leaking another tenant's rows.
Code that must see every tenant (periodic jobs, migrations) says so with `Model.all_tenants`.
"""
from contextvars import ContextVar

from django.db import models

# Set while a row checks its own uniqueness: Django asks "does another row hold these values?" across the
# table, which is what the database's constraint enforces anyway and answers only yes or no.
_checking_uniqueness: ContextVar[bool] = ContextVar("checking_uniqueness", default=False)


class TenantScopeError(RuntimeError):
    pass


def _names_tenant(kwargs: dict) -> bool:
    return any(key == "tenant" or key == "tenant_id" or key.startswith("tenant__") for key in kwargs)


class TenantQuerySet(models.QuerySet):
    _tenant_scoped = False

    def _clone(self):
        clone = super()._clone()
        clone._tenant_scoped = self._tenant_scoped
        return clone

    def for_tenant(self, tenant):
        if tenant is None:
            raise TenantScopeError("for_tenant() needs a tenant")
        clone = self.filter(tenant=tenant)
        clone._tenant_scoped = True
        return clone

    def filter(self, *args, **kwargs):
        clone = super().filter(*args, **kwargs)
        if _names_tenant(kwargs):
            clone._tenant_scoped = True
        return clone

    def _require_scope(self):
        if not self._tenant_scoped and not _checking_uniqueness.get():
            raise TenantScopeError(f"unscoped query on {self.model.__name__}: name the tenant")

    def _fetch_all(self):
        if self._result_cache is None:
            self._require_scope()
        super()._fetch_all()

    def count(self):
        self._require_scope()
        return super().count()

    def exists(self):
        self._require_scope()
        return super().exists()

    def aggregate(self, *args, **kwargs):
        self._require_scope()
        return super().aggregate(*args, **kwargs)

    def update(self, **kwargs):
        self._require_scope()
        return super().update(**kwargs)

    def delete(self):
        self._require_scope()
        return super().delete()

    def iterator(self, chunk_size=None):
        self._require_scope()
        return super().iterator(chunk_size=chunk_size)


class TenantScopedManager(models.Manager.from_queryset(TenantQuerySet)):
    def get_queryset(self):
        queryset = super().get_queryset()
        # Related managers (session.calls, group.tools) hang off a row that is already scoped.
        if getattr(self, "instance", None) is not None:
            queryset._tenant_scoped = True
        return queryset


class TenantOwned(models.Model):
    """Base of every tenant-owned model."""

    tenant = models.ForeignKey("tenancy.Tenant", on_delete=models.CASCADE, related_name="+")

    objects = TenantScopedManager()
    all_tenants = models.Manager()

    class Meta:
        abstract = True
        base_manager_name = "all_tenants"

    def validate_unique(self, exclude=None):
        token = _checking_uniqueness.set(True)
        try:
            super().validate_unique(exclude=exclude)
        finally:
            _checking_uniqueness.reset(token)

    def validate_constraints(self, exclude=None):
        token = _checking_uniqueness.set(True)
        try:
            super().validate_constraints(exclude=exclude)
        finally:
            _checking_uniqueness.reset(token)
