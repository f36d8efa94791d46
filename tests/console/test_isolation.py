"""Tenant B's objects through tenant A's console URLs: 404 and none of B's data, for every route and method."""
import pytest

from tenancy.models import ApiKey
from tests.console.conftest import console_url, object_ids
from tools.models import BoundArgument, Tool, ToolGroup

pytestmark = pytest.mark.django_db


def test_foreign_ids_are_404_on_every_console_route(world, routes):
    foreign_ids = object_ids(world.b)
    client = world.a.console("admin")
    covered = set()
    for name, params in routes:
        if set(params) == {"tenant"}:
            continue
        url = console_url(name, params, world.a, ids=foreign_ids)
        for method in (client.get, client.post):
            response = method(url, {"name": "stolen", "enabled": "false"})
            assert response.status_code == 404, (name, method.__name__, response.status_code)
            body = response.content.decode()
            assert world.b.tenant.name not in body
            assert str(world.b.session.pk) not in body and world.b.key_objects["agent"].prefix not in body
        covered.update(params)
    assert covered == {"tenant", *foreign_ids}  # every kind of object id was tried


def test_foreign_ids_change_nothing(world, routes):
    client = world.a.console("admin")
    b = world.b
    client.post(f"/t/acme/tools/{b.tools['current_time'].pk}/", {"enabled": "false"})
    client.post(f"/t/acme/groups/{b.groups['math'].pk}/", {"name": "stolen"})
    client.post(f"/t/acme/groups/{b.groups['math'].pk}/delete/")
    client.post(f"/t/acme/bindings/{b.binding.pk}/delete/")
    client.post(f"/t/acme/keys/{b.key_objects['agent'].pk}/revoke/")
    assert Tool.objects.for_tenant(b.tenant).get(name="current_time").enabled
    assert ToolGroup.objects.for_tenant(b.tenant).filter(name="math").exists()
    assert BoundArgument.objects.for_tenant(b.tenant).filter(pk=b.binding.pk).exists()
    assert ApiKey.objects.for_tenant(b.tenant).get(pk=b.key_objects["agent"].pk).revoked_at is None


def test_forms_offer_and_accept_only_the_tenants_own_tools(world):
    client = world.a.console("admin")
    page = client.get("/t/acme/bindings/new/").content.decode()
    assert f'value="{world.a.tools["current_time"].pk}"' in page
    assert f'value="{world.b.tools["current_time"].pk}"' not in page
    response = client.post("/t/acme/bindings/new/", {
        "tool": world.b.tools["current_time"].pk, "name": "timezone", "value": '"UTC"',
    })
    assert response.status_code == 400
    assert "Select a valid choice" in response.content.decode()
    assert not BoundArgument.objects.for_tenant(world.b.tenant).filter(tool=world.b.tools["current_time"],
                                                                       agent="").exists()
    response = client.post("/t/acme/groups/new/", {"name": "sneaky", "tools": [world.b.tools["calculate"].pk]})
    assert response.status_code == 400
    assert "Select a valid choice" in response.content.decode()
    assert not ToolGroup.objects.for_tenant(world.a.tenant).filter(name="sneaky").exists()
