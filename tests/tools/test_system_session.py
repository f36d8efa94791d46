"""The system session (agent `toolkeeper`) runs the work operators start. Its agent name is reserved:
no app session and no API key may take it, and an app's key never sees its calls (admin keys do,
to follow the work they started)."""
import pytest
from asgiref.sync import async_to_sync
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from common.errors import ServiceError
from tenancy.models import SYSTEM_AGENT, ApiKey
from tenancy.services import apikey_create
from toolkeeper.routing import websocket_urlpatterns
from tools.calls.submit import work_start
from tools.catalog.services import session_create
from tools.models import AgentSession

RESERVED_SPELLINGS = [SYSTEM_AGENT, "Toolkeeper", " toolkeeper ", "TOOLKEEPER"]


@pytest.mark.parametrize("agent", RESERVED_SPELLINGS)
def test_an_app_cannot_create_a_session_under_the_system_agent(world, agent):
    for client in (world.a.client(), world.a.client("locked")):
        response = client.post("/api/v1/sessions", {"agent": agent}, format="json")
        assert response.status_code == 400, response.content
        assert "agent" in response.json()["error"]["fields"]
    console = APIClient()
    console.force_login(world.a.users["operator"])
    response = console.post("/api/v1/sessions", {"agent": agent}, format="json", HTTP_X_TENANT="acme")
    assert response.status_code == 400, response.content
    with pytest.raises(ServiceError):
        session_create(tenant=world.a.tenant, agent=agent)
    assert not AgentSession.objects.for_tenant(world.a.tenant).filter(agent__iexact=SYSTEM_AGENT).exists()


@pytest.mark.parametrize("agent", RESERVED_SPELLINGS)
def test_no_api_key_is_locked_to_the_system_agent(world, agent):
    with pytest.raises(ServiceError) as refused:
        apikey_create(tenant=world.a.tenant, name="sneaky", scopes=["agent"], agent=agent)
    assert "agent" in refused.value.detail
    with pytest.raises(CommandError, match="reserved"):
        call_command("createapikey", "--tenant", "acme", "--name", "sneaky", "--agent", agent)
    response = world.a.console("admin").post("/t/acme/keys/new/", {"name": "sneaky", "scopes": ["agent"],
                                                                   "agent": agent})
    assert "reserved for the tenant&#x27;s system session" in response.content.decode()
    assert not ApiKey.objects.for_tenant(world.a.tenant).filter(name="sneaky").exists()


@pytest.fixture
def system_call(world):
    call = work_start(tenant=world.a.tenant, tool_name="knowledge_ingest", actor=world.a.users["admin"],
                      arguments={"dataset_id": 0, "documents": []})
    assert call.session.agent == SYSTEM_AGENT
    return call


@pytest.mark.django_db(transaction=True)  # the calls endpoints read in threads of their own
@pytest.mark.usefixtures("drain_calls")
def test_an_apps_key_never_sees_the_system_sessions_calls(world, system_call):
    call, session = system_call, system_call.session
    for label in ("agent", "locked"):
        client = world.a.client(label)
        for url in (f"/api/v1/calls/{call.pk}", f"/api/v1/calls/{call.pk}/events", f"/api/v1/sessions/{session.pk}",
                    f"/api/v1/sessions/{session.pk}/tools", f"/api/v1/sessions/{session.pk}/prompt"):
            assert client.get(url).status_code == 404, (label, url)
        assert client.post(f"/api/v1/calls/{call.pk}/cancel").status_code == 404
        sent = client.post(f"/api/v1/sessions/{session.pk}/calls", {"name": "current_time"}, format="json")
        assert sent.status_code == 404, sent.content
    posted = world.a.client("external").post(f"/api/v1/calls/{call.pk}/result", {"state": "success"}, format="json")
    assert posted.status_code == 404
    # The operators' automation follows its work with an admin key.
    admin = world.a.client("admin")
    assert admin.get(f"/api/v1/calls/{call.pk}").json()["id"] == str(call.pk)
    assert admin.get(f"/api/v1/calls/{call.pk}/events").status_code == 200


@pytest.mark.django_db(transaction=True)  # the socket authorizes on a thread of its own
@pytest.mark.usefixtures("drain_calls")
def test_an_apps_key_cannot_follow_the_system_session_on_a_socket(world, system_call):
    app = URLRouter(websocket_urlpatterns)

    async def connect(session_id) -> bool:
        socket = WebsocketCommunicator(app, f"/ws/api/sessions/{session_id}/",
                                       headers=[(b"authorization", f"Bearer {world.a.keys['agent']}".encode())])
        connected, _ = await socket.connect()
        await socket.disconnect()
        return connected

    assert async_to_sync(connect)(world.a.session.pk) is True
    assert async_to_sync(connect)(system_call.session_id) is False
