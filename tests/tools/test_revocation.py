"""Ending access ends what is open (tenancy.grants): revoking an API key closes its sockets (code 4401)
and ends its waiting requests with 401; removing a console member closes their sockets and ends their
waits with 403. In-process here (the embedded channel layer, the local executor's in-process wait);
tests/live and tests/distributed do the same against real servers."""
import threading
import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import Client
from rest_framework.test import APIClient

from approvals.services import rule_create
from realtime.consumers import CLOSE_UNAUTHORIZED
from tenancy.grants import grant_of_key, grant_of_member, grant_watch, grants_active
from tenancy.models import Membership, Role
from tenancy.services import apikey_create, apikey_revoke, membership_remove
from toolkeeper.routing import websocket_urlpatterns
from tools.calls.submit import call_cancel, calls_submit
from tools.catalog.services import session_create
from tools.models import CallStatus, ToolCall
from tools.python.decorators import ToolContext

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("drain_calls")]

SOCKET_BOUND_S = 20  # far beyond the grants' re-check period: only a broken close waits this long
WAIT_S = 30


def dozing(ctx: ToolContext) -> str:
    """Doze until cancelled."""
    ctx.sleep(60)
    return "woke up"


def held(grant) -> bool:
    with grant_watch._lock:
        return any(holder.grant == grant for holder in grant_watch._holders.values())


def until(predicate, bound_s: float = SOCKET_BOUND_S) -> None:
    deadline = time.monotonic() + bound_s
    while not predicate():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.02)


@pytest.fixture
def pending_call(world):
    """A call of tenant A waiting for a reviewer: it stays pending while the tests wait on it."""
    rule_create(tenant=world.a.tenant, behavior="ask", tool_pattern="current_time")
    issued = apikey_create(tenant=world.a.tenant, name="short-lived", scopes=["agent"])
    session = session_create(tenant=world.a.tenant, agent="support-bot", api_key=issued.api_key)
    [call] = calls_submit(session=session, calls=[{"name": "current_time", "input": {}}])
    assert call.status == CallStatus.AWAITING_APPROVAL
    return issued, session, call


def wait_in_thread(client, url: str) -> dict:
    """GET `url` on a thread; the returned dict gets the response when it comes."""
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("response", client.get(url)), daemon=True)
    thread.start()
    outcome["thread"] = thread
    return outcome


def test_revoking_a_key_ends_its_waiting_request_with_401(world, pending_call):
    issued, _, call = pending_call
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.key}")
    waiting = wait_in_thread(client, f"/api/v1/calls/{call.pk}?wait={WAIT_S}")
    until(lambda: held(grant_of_key(issued.api_key)))
    apikey_revoke(api_key=issued.api_key)
    waiting["thread"].join(SOCKET_BOUND_S)
    response = waiting.get("response")
    assert response is not None, "the request kept waiting after its key was revoked"
    assert response.status_code == 401
    assert response.json() == {"error": {"code": "authentication_failed", "message": "Invalid or revoked API key.",
                                         "fields": {}}}
    assert response["WWW-Authenticate"] == "Bearer"


def test_revoking_a_key_ends_its_waiting_submit_with_401(world, make_tool, pending_call):
    issued, session, _ = pending_call
    tool = make_tool(dozing, timeout=120)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.key}")
    outcome: dict = {}

    def submit():
        outcome["response"] = client.post(f"/api/v1/sessions/{session.pk}/calls",
                                          {"id": "dozing", "name": tool.name, "wait": WAIT_S}, format="json")

    thread = threading.Thread(target=submit, daemon=True)
    thread.start()
    until(lambda: held(grant_of_key(issued.api_key)))
    apikey_revoke(api_key=issued.api_key)
    thread.join(SOCKET_BOUND_S)
    response = outcome.get("response")
    assert response is not None, "the submit kept waiting after its key was revoked"
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"
    call = ToolCall.objects.for_tenant(world.a.tenant).get(session=session, call_id="dozing")
    call_cancel(call=call)  # the call itself goes on: only the waiting request ended


def test_removing_a_member_ends_their_waiting_request_with_403(world, pending_call):
    _, _, call = pending_call
    operator = world.a.users[Role.OPERATOR]
    client = APIClient()
    client.force_login(operator)
    client.credentials(HTTP_X_TENANT=world.a.tenant.slug)
    waiting = wait_in_thread(client, f"/api/v1/calls/{call.pk}?wait={WAIT_S}")
    # the request holds the membership of its login's session (tenancy.grants)
    until(lambda: held(grant_of_member(world.a.tenant.pk, operator.pk, client.session.session_key)))
    assert membership_remove(tenant=world.a.tenant, user=operator, actor=world.a.users["admin"])
    waiting["thread"].join(SOCKET_BOUND_S)
    response = waiting.get("response")
    assert response is not None, "the request kept waiting after its user left the tenant"
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"


def test_revoking_a_key_closes_its_sockets(world, pending_call):
    issued, session, _ = pending_call
    other = world.a.session  # the tenant's other key keeps its socket
    app = URLRouter(websocket_urlpatterns)

    async def scenario():
        revoked = WebsocketCommunicator(app, f"/ws/api/sessions/{session.pk}/?after=0",
                                        headers=[(b"authorization", f"Bearer {issued.key}".encode())])
        kept = WebsocketCommunicator(app, f"/ws/api/sessions/{other.pk}/",
                                     headers=[(b"authorization", f"Bearer {world.a.keys['agent']}".encode())])
        assert (await revoked.connect())[0] and (await kept.connect())[0]
        replayed = await revoked.receive_json_from(timeout=5)
        assert replayed["kind"] == "status"
        await async_to_sync_free(apikey_revoke, api_key=issued.api_key)
        closed = await _next_close(revoked)
        assert closed == {"type": "websocket.close", "code": CLOSE_UNAUTHORIZED}
        assert await kept.receive_nothing(timeout=1.5)  # longer than a re-check: the other key stays
        await kept.disconnect()
        await revoked.disconnect()

    async_to_sync(scenario)()
    assert not held(grant_of_key(issued.api_key))


@pytest.mark.parametrize("stream", ["calls/", "inbox/", "sessions/{session}/", "calls/{call}/"])
def test_removing_a_member_closes_their_console_sockets(world, pending_call, stream):
    _, session, call = pending_call
    reviewer = world.a.users[Role.REVIEWER]
    browser = Client()
    browser.force_login(reviewer)
    headers = [(b"cookie", f"sessionid={browser.cookies['sessionid'].value}".encode()),
               (b"origin", b"http://localhost")]
    path = f"/ws/console/{world.a.tenant.slug}/{stream.format(session=session.pk, call=call.pk)}"
    app = URLRouter(websocket_urlpatterns)

    async def scenario():
        socket = WebsocketCommunicator(app, path, headers=headers)
        connected, _ = await socket.connect()
        assert connected
        assert await socket.receive_nothing(timeout=0.2)
        await async_to_sync_free(membership_remove, tenant=world.a.tenant, user=reviewer)
        assert await _next_close(socket) == {"type": "websocket.close", "code": CLOSE_UNAUTHORIZED}
        await socket.disconnect()

    async_to_sync(scenario)()
    assert not Membership.objects.filter(tenant=world.a.tenant, user=reviewer).exists()


def test_grants_active_reads_every_kind_in_one_pass(world, django_assert_max_num_queries):
    keys = [grant_of_key(world.a.key_objects[label]) for label in ("agent", "admin")]
    members = [grant_of_member(world.a.tenant.pk, world.a.users[role].pk) for role in (Role.VIEWER, Role.REVIEWER)]
    apikey_revoke(api_key=world.a.key_objects["admin"])
    Membership.objects.filter(tenant=world.a.tenant, user=world.a.users[Role.VIEWER]).delete()
    stranger = grant_of_member(world.b.tenant.pk, world.a.users[Role.REVIEWER].pk)
    with django_assert_max_num_queries(2):
        active = grants_active({*keys, *members, stranger})
    assert active == {keys[0], members[1]}


async def async_to_sync_free(fn, **kwargs):
    """Run a sync service from the test's event loop on a thread of its own, as a console view would."""
    return await sync_to_async(fn, thread_sensitive=False)(**kwargs)


async def _next_close(socket) -> dict:
    """Skip any events still on their way; the next close frame the server sends."""
    while True:
        output = await socket.receive_output(timeout=SOCKET_BOUND_S)
        if output["type"] == "websocket.close":
            return output


def test_a_console_grant_ends_with_its_login_session(world):
    """A person signed out (by the provider's back-channel logout, say) loses the streams of that login."""
    from django.contrib.sessions.backends.db import SessionStore
    login = SessionStore()
    login.create()
    grant = grant_of_member(world.a.tenant.pk, world.a.users[Role.REVIEWER].pk, login.session_key)
    assert grants_active({grant}) == {grant}
    login.delete()
    assert grants_active({grant}) == set()
