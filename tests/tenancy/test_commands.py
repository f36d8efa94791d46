"""Management commands for operators who automate: createtenant and createapikey."""
import io
import json

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from tenancy.models import ApiKey, Membership, Role, Tenant
from tools.models import Tool, ToolGroup


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_createtenant_with_admin():
    user = get_user_model().objects.create_user(username="ops", password="x" * 12)
    output = run("createtenant", "initech", "--admin", "ops")
    assert "initech" in output
    tenant = Tenant.objects.get(slug="initech")
    membership = Membership.objects.get(user=user, tenant=tenant)
    assert membership.role == Role.ADMIN
    # a new tenant comes with its catalog and the reserved group
    assert Tool.objects.for_tenant(tenant).filter(name="current_time").exists()
    basic = ToolGroup.objects.for_tenant(tenant).get(name="basic")
    assert basic.default_active and not basic.switchable


@pytest.mark.django_db
def test_createtenant_refuses_bad_input():
    run("createtenant", "initech")
    with pytest.raises(CommandError):
        run("createtenant", "initech")
    with pytest.raises(CommandError):
        run("createtenant", "hooli", "--admin", "nobody")
    assert not Tenant.objects.filter(slug="hooli").exists()


@pytest.mark.django_db
def test_createapikey_json_prints_a_working_key():
    run("createtenant", "initech")
    output = run("createapikey", "--tenant", "initech", "--scopes", "agent,external", "--agent", "support-bot",
                 "--json")
    data = json.loads(output)
    assert set(data) == {"key", "id"}
    api_key = ApiKey.objects.filter(tenant__slug="initech").get(pk=data["id"])
    assert api_key.scopes == ["agent", "external"]
    assert api_key.agent == "support-bot"
    assert data["key"].startswith(f"tk_{api_key.prefix}_")
    assert data["key"] not in api_key.secret_hash

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {data['key']}")
    created = client.post("/api/v1/sessions", {"user": "u@example.com"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["agent"] == "support-bot"  # the lock names the agent
    assert client.post("/api/v1/sessions", {"agent": "other"}, format="json").status_code == 400
    assert client.get("/api/v1/groups").status_code == 403  # no admin scope


@pytest.mark.django_db
def test_createapikey_plain_output_is_the_key():
    run("createtenant", "initech")
    key = run("createapikey", "--tenant", "initech").strip()
    assert key.startswith("tk_")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.post("/api/v1/sessions", {"agent": "a"}, format="json").status_code == 201


@pytest.mark.django_db
def test_createapikey_refuses_bad_input():
    run("createtenant", "initech")
    with pytest.raises(CommandError):
        run("createapikey", "--tenant", "nope", "--json")
    with pytest.raises(CommandError):
        run("createapikey", "--tenant", "initech", "--scopes", "agent,root")
    assert not ApiKey.objects.filter(tenant__slug="initech").exists()
