"""A source's tool never takes over a tool the tenant defined under the same name."""
import pytest

from tools.catalog.services import catalog_sync, tool_external_create
from tools.models import Tool, ToolSource
from tools.python import decorators
from tools.python.decorators import tool

pytestmark = pytest.mark.django_db


@pytest.fixture
def restored_registry():
    saved = dict(decorators._registry)
    yield
    decorators._registry.clear()
    decorators._registry.update(saved)


def test_a_python_tool_named_like_a_tenants_external_tool_leaves_it_be(world, restored_registry, caplog):
    tenant = world.a.tenant
    own = tool_external_create(tenant=tenant, name="ship_order", description="the tenant's own",
                               input_schema={"properties": {"order": {"type": "string"}}})

    @tool()
    def ship_order(order: str, express: bool = False) -> str:
        """A plugin's tool of the same name."""
        return order

    other = world.b.tenant
    catalog_sync(tenant=tenant)
    catalog_sync(tenant=other)

    own.refresh_from_db()
    assert (own.source, own.description, own.source_ref) == (ToolSource.EXTERNAL, "the tenant's own", "")
    assert "express" not in own.input_schema["properties"]
    assert "the tenant defined a tool of that name" in caplog.text
    # A tenant without a tool of that name gets the source's tool.
    assert Tool.objects.for_tenant(other).get(name="ship_order").source == ToolSource.PYTHON
