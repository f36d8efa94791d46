"""API keys from the console: the secret is shown once, only its hash is stored, revoking locks the key out."""
import re

import pytest

from audit.models import Event
from tenancy.models import ApiKey, hash_secret
from tools.models import AgentSession

pytestmark = pytest.mark.django_db

KEY_RE = re.compile(r'<div class="secret" id="new-api-key">(tk_[0-9a-f]+_[\w-]+)</div>')


def create_key(client, **data):
    response = client.post("/t/acme/keys/new/", {"name": "ci bot", "scopes": ["agent"], **data})
    assert response.status_code == 302, response.content.decode()[:2000]
    return response


def test_secret_shown_once_and_only_its_hash_stored(world):
    client = world.a.console("admin")
    response = create_key(client, agent="ci-bot")
    created_url = response["Location"]
    page = client.get(created_url)
    assert page.status_code == 200
    assert "no-store" in page["Cache-Control"]
    match = KEY_RE.search(page.content.decode())
    assert match, "the new key is on the page after creation"
    key = match.group(1)

    api_key = ApiKey.objects.for_tenant(world.a.tenant).get(name="ci bot")
    prefix, secret = key.removeprefix("tk_").split("_", 1)
    assert api_key.prefix == prefix
    assert api_key.secret_hash == hash_secret(secret)
    assert api_key.scopes == ["agent"] and api_key.agent == "ci-bot"
    assert api_key.created_by == world.a.users["admin"]
    stored = [str(getattr(api_key, f.attname)) for f in ApiKey._meta.concrete_fields]
    assert not any(secret in value for value in stored)

    # never again: not on a reload, not in the session, not in the list, not in the audit log
    again = client.get(created_url).content.decode()
    assert key not in again and secret not in again
    assert "cannot be shown again" in again
    assert not any(secret in str(value) for value in client.session.values())
    assert secret not in client.get("/t/acme/keys/").content.decode()
    assert not any(secret in str(e.data) for e in Event.objects.for_tenant(world.a.tenant))

    # and the key works, locked to its agent
    from rest_framework.test import APIClient

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    made = api.post("/api/v1/sessions", {"agent": "ci-bot"}, format="json")
    assert made.status_code == 201
    assert AgentSession.objects.for_tenant(world.a.tenant).filter(pk=made.json()["id"], api_key=api_key).exists()


def test_the_secret_page_of_another_key_shows_nothing(world):
    client = world.a.console("admin")
    create_key(client)
    other = world.a.key_objects["external"]
    page = client.get(f"/t/acme/keys/{other.pk}/created/").content.decode()
    assert "tk_" + other.prefix + "_…" in page
    assert not KEY_RE.search(page)
    assert world.a.keys["external"] not in page


def test_revoke_locks_the_key_out_of_the_api(world):
    key = world.a.key_objects["agent"]
    api = world.a.client("agent")
    assert api.get(f"/api/v1/sessions/{world.a.session.pk}").status_code == 200
    listing = world.a.console("admin").get("/t/acme/keys/").content.decode()
    assert f"/t/acme/keys/{key.pk}/revoke/" in listing

    response = world.a.console("admin").post(f"/t/acme/keys/{key.pk}/revoke/", follow=True)
    assert response.status_code == 200 and "revoked" in response.content.decode()
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert api.get(f"/api/v1/sessions/{world.a.session.pk}").status_code == 401
    assert Event.objects.for_tenant(world.a.tenant).filter(verb="apikey.revoked", target=f"apikey:{key.pk}",
                                                           actor_label="acme-admin").exists()
    # the other keys still work
    assert world.a.client("locked").get(f"/api/v1/sessions/{world.a.session.pk}").status_code == 200
    listing = world.a.console("admin").get("/t/acme/keys/").content.decode()
    assert f"/t/acme/keys/{key.pk}/revoke/" not in listing


def test_a_secret_not_picked_up_at_once_is_dropped(world):
    client = world.a.console("admin")
    created_url = create_key(client)["Location"]
    assert "console.shown_once" in client.session  # only between the redirect and its page
    client.get("/t/acme/keys/")  # the admin went elsewhere instead of following the redirect
    assert "console.shown_once" not in client.session
    page = client.get(created_url).content.decode()
    assert not KEY_RE.search(page) and "cannot be shown again" in page
