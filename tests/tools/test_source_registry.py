"""Tool sources are a registry (tools.catalog.registry.register_source): a new kind of tool needs no change to
the core, and a kind belongs to one source (docs/architecture.md, "Where to add…")."""
import pytest

from tools.catalog import registry
from tools.models import SOURCE_KIND_MAX, Tool


class TicketSource:
    kinds = ("ticketing",)

    def definitions(self, tenant):
        return []

    def invoke(self, tool, arguments, ctx):
        return {"ticket": arguments["title"]}


@pytest.fixture
def ticketing():
    source = TicketSource()
    registry.register_source(source)
    yield source
    registry._sources.remove(source)


@pytest.mark.django_db
def test_a_new_kind_of_tool_is_stored_and_reaches_its_source(world, ticketing):
    kind = "ticketing_" + "x" * (SOURCE_KIND_MAX - len("ticketing_"))
    tool = Tool.objects.create(tenant=world.a.tenant, name="open_ticket", source="ticketing")
    Tool.objects.create(tenant=world.a.tenant, name="long_kind", source=kind)  # the field takes the longest kind
    assert Tool.objects.for_tenant(world.a.tenant).get(pk=tool.pk).source == "ticketing"
    assert registry.source_for("ticketing") is ticketing
    assert ticketing.invoke(tool, {"title": "disk full"}, None) == {"ticket": "disk full"}
    registry.register_source(ticketing)  # registering the same source again changes nothing
    assert registry.sources().count(ticketing) == 1


def test_a_kind_is_claimed_by_one_source(ticketing):
    class Rival(TicketSource):
        pass

    with pytest.raises(ValueError, match="the source kind 'ticketing' is claimed by TicketSource"):
        registry.register_source(Rival())
    with pytest.raises(ValueError, match="the source kind 'python' is claimed by PythonSource"):
        registry.register_source(type("Py", (TicketSource,), {"kinds": ("python",)})())


@pytest.mark.parametrize("kind", ["", "Ticketing", "1ticket", "ticket-ing", "t" * (SOURCE_KIND_MAX + 1)])
def test_a_kind_that_does_not_fit_the_field_is_refused(kind):
    source = type("Odd", (TicketSource,), {"kinds": (kind,)})()
    with pytest.raises(ValueError, match="a source kind is 1-32 lowercase letters"):
        registry.register_source(source)
    assert source not in registry.sources()
