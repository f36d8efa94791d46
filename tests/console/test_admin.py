"""The Django admin works across tenants for superusers (the default managers fail closed)."""
import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tools.models import AgentSession, BoundArgument, Tool, ToolCall, ToolGroup

pytestmark = pytest.mark.django_db

MODELS = [Tool, ToolGroup, BoundArgument, AgentSession, ToolCall]


@pytest.fixture
def superuser_client():
    user = get_user_model().objects.create_superuser(username="root", password="x", email="")
    client = Client()
    client.force_login(user)
    return client


def _objects(world):
    return {
        Tool: world.a.tools["current_time"],
        ToolGroup: world.a.groups["math"],
        BoundArgument: world.a.binding,
        AgentSession: world.a.session,
        ToolCall: world.a.calls[1],
    }


def test_superuser_sees_every_tenants_rows(world, superuser_client):
    for model in MODELS:
        url = f"/admin/tools/{model._meta.model_name}/"
        response = superuser_client.get(url)
        assert response.status_code == 200, url
        body = response.content.decode()
        assert ">acme<" in body and ">globex<" in body, url  # rows of both tenants
    for model, obj in _objects(world).items():
        url = f"/admin/tools/{model._meta.model_name}/{obj.pk}/change/"
        response = superuser_client.get(url)
        assert response.status_code == 200, url
    call_page = superuser_client.get(f"/admin/tools/toolcall/{world.a.calls[1].pk}/change/").content.decode()
    assert "ToolNotAvailable" in call_page  # the CallEvent inline


def test_admin_refuses_linking_rows_of_two_tenants(world, superuser_client):
    group = world.a.groups["math"]
    foreign = world.b.tools["calculate"]
    response = superuser_client.post(f"/admin/tools/toolgroup/{group.pk}/change/", {
        "tenant": world.a.tenant.pk, "name": "math", "description": "", "notes": "", "switchable": "on",
        "tools": [foreign.pk], "skill_ref": "",
    })
    assert response.status_code == 200
    assert "belongs to another tenant" in response.content.decode()
    assert not group.tools.filter(pk=foreign.pk).exists()


def test_staff_without_superuser_cannot_use_it(world):
    user = get_user_model().objects.create_user(username="staff", password="x", is_staff=True)
    client = Client()
    client.force_login(user)
    for model in MODELS:
        assert client.get(f"/admin/tools/{model._meta.model_name}/").status_code == 403


def test_admin_adds_a_binding_and_refuses_a_duplicate(world, superuser_client):
    """Uniqueness checks of tenant-owned rows (tool, agent, name) run in the admin without a 500."""
    tool = world.a.tools["current_time"]
    form = {"tenant": world.a.tenant.pk, "tool": tool.pk, "agent": "", "name": "timezone", "value": '"UTC"'}
    response = superuser_client.post("/admin/tools/boundargument/add/", form)
    assert response.status_code == 302
    assert BoundArgument.objects.for_tenant(world.a.tenant).get(tool=tool, agent="", name="timezone").value == "UTC"
    again = superuser_client.post("/admin/tools/boundargument/add/", {**form, "value": '"Europe/Berlin"'})
    assert again.status_code == 200
    assert "already exists" in again.content.decode()
    assert BoundArgument.objects.for_tenant(world.a.tenant).filter(tool=tool, agent="", name="timezone").count() == 1
