"""Fail-closed tenant scoping (docs/governance.md, django-scopes): a query that names no tenant raises."""
import pytest
from django.apps import apps

from audit.models import Event
from tenancy.models import ApiKey, Tenant
from tenancy.scoping import TenantOwned, TenantScopedManager, TenantScopeError
from tools.models import AgentSession, BoundArgument, CallEvent, Tool, ToolCall, ToolGroup


@pytest.mark.parametrize("evaluate", [
    lambda qs: list(qs),
    lambda qs: qs.count(),
    lambda qs: qs.exists(),
    lambda qs: qs.first(),
    lambda qs: qs.get(name="current_time"),
    lambda qs: list(qs.values_list("name", flat=True)),
    lambda qs: list(qs.iterator()),
    lambda qs: qs.update(enabled=False),
    lambda qs: qs.delete(),
    lambda qs: qs.aggregate(n=__import__("django.db.models", fromlist=["Count"]).Count("pk")),
    lambda qs: list(qs.filter(name="current_time")),
    lambda qs: list(qs.exclude(name="x").order_by("name")),
    lambda qs: bool(qs),
    lambda qs: len(qs),
])
def test_unscoped_queries_raise(world, evaluate):
    before = Tool.all_tenants.count()
    with pytest.raises(TenantScopeError):
        evaluate(Tool.objects.all())
    assert Tool.all_tenants.count() == before
    assert Tool.all_tenants.filter(enabled=False).count() == 0


def test_for_tenant_returns_only_that_tenants_rows(world):
    a_tools = list(Tool.objects.for_tenant(world.a.tenant))
    assert a_tools and {t.tenant_id for t in a_tools} == {world.a.tenant.pk}
    assert Tool.objects.for_tenant(world.a.tenant).count() == len(a_tools)
    # chaining keeps the scope
    narrowed = Tool.objects.for_tenant(world.a.tenant).filter(name="current_time").exclude(enabled=False)
    assert [t.pk for t in narrowed] == [world.a.tools["current_time"].pk]
    assert Tool.objects.filter(tenant=world.b.tenant).get(name="current_time") == world.b.tools["current_time"]
    assert Tool.objects.filter(tenant_id=world.b.tenant.pk).count() == len(world.b.tools)
    assert Tool.objects.filter(tenant__slug=world.b.tenant.slug).count() == len(world.b.tools)


def test_for_tenant_needs_a_tenant(world):
    with pytest.raises(TenantScopeError):
        Tool.objects.for_tenant(None)


def test_related_managers_work(world):
    group = world.a.groups["basic"]
    names = {t.name for t in group.tools.all()}
    assert "current_time" in names
    assert {t.tenant_id for t in group.tools.all()} == {world.a.tenant.pk}
    session = world.a.session
    assert {c.call_id for c in session.calls.all()} == {"call_time", "call_missing"}
    call = session.calls.get(call_id="call_time")
    assert call.events.count() >= 2
    assert world.a.tools["current_time"].bindings.count() == 1
    assert {g.name for g in world.a.tools["calculate"].groups.all()} == {"math"}


def test_every_tenant_owned_model_is_fail_closed():
    owned = [m for m in apps.get_models() if issubclass(m, TenantOwned)]
    for model in (Tool, ToolGroup, BoundArgument, AgentSession, ToolCall, CallEvent, ApiKey, Event):
        assert model in owned
    for model in owned:
        assert isinstance(model._default_manager, TenantScopedManager), model
        assert isinstance(model.objects, TenantScopedManager), model
        with pytest.raises(TenantScopeError):
            model.objects.count()


def test_unscoped_get_by_pk_raises(world):
    with pytest.raises(TenantScopeError):
        ToolCall.objects.get(pk=world.b.calls[0].pk)
    with pytest.raises(TenantScopeError):
        AgentSession.objects.filter(pk=world.b.session.pk).first()
    assert AgentSession.objects.for_tenant(world.a.tenant).filter(pk=world.b.session.pk).first() is None


@pytest.mark.django_db
def test_for_tenant_filters_by_its_tenant_asserted_on_the_rows_alone():
    """Built without the shared world (which itself reads through `for_tenant`): two tenants' rows of one
    name, and each tenant's scoped query returns its own rows and only those, by id, by tenant object or id."""
    tenants = [Tenant.objects.create(slug=f"scope-{n}", name=f"Scope {n}") for n in range(3)]
    rows = {tenant.pk: [ToolGroup.all_tenants.create(tenant=tenant, name=name) for name in ("shared", "own")]
            for tenant in tenants[:2]}
    for tenant in tenants[:2]:
        mine = sorted(group.pk for group in rows[tenant.pk])
        assert sorted(ToolGroup.objects.for_tenant(tenant).values_list("pk", flat=True)) == mine
        assert sorted(ToolGroup.objects.for_tenant(tenant.pk).values_list("pk", flat=True)) == mine
        assert ToolGroup.objects.for_tenant(tenant).get(name="shared").tenant_id == tenant.pk
        assert ToolGroup.objects.for_tenant(tenant).filter(name="shared").count() == 1
    assert not ToolGroup.objects.for_tenant(tenants[2]).exists()  # a tenant with no rows sees none
