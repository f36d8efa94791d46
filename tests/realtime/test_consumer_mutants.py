"""What a stream sends and when (realtime.consumers, docs/notes/realtime.md), driven in process through the real routes:
events reach the socket in the client's shape and once each, the inbox's events too, a stream whose access
ended sends nothing more, a closed socket leaves its group and its grant, and forwarding an event never waits
for the process's sync thread."""
import asyncio
import threading
import uuid

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client
from django.urls import path

from realtime import consumers
from realtime.consumers import CLOSE_BAD_REQUEST, CLOSE_UNAUTHORIZED, MAX_SEQ
from realtime.groups import inbox_group, session_group
from tenancy.entry.admission import Entry
from tenancy.grants import grant_watch
from tenancy.models import Role
from tenancy.services import apikey_create, apikey_revoke, membership_remove
from toolkeeper.routing import websocket_urlpatterns
from tools.calls.events import call_event_append
from tools.calls.streams import AppSessionStream

pytestmark = pytest.mark.django_db(transaction=True)
application = URLRouter(websocket_urlpatterns)
ORIGIN = (b"origin", b"http://localhost")
AT = "2026-01-02T03:04:05+00:00"


def event(call: str, seq: int, **extra) -> dict:
    """A call event as `tools.calls.events` publishes it."""
    return {"type": "call.event", "call": call, "session": "s", "seq": seq, "kind": "output",
            "data": {"n": seq}, "at": AT, **extra}


def sent(call: str, seq: int) -> dict:
    """The same event as the socket sends it."""
    return {"call": call, "seq": seq, "kind": "output", "data": {"n": seq}, "at": AT}


def app_socket(session, key: str, query: str = "", headers=None, subprotocols=None, app=application):
    headers = [(b"authorization", f"Bearer {key}".encode())] if headers is None else headers
    return WebsocketCommunicator(app, f"/ws/api/sessions/{session.pk}/{query}", headers=headers,
                                 subprotocols=subprotocols)


def cookie_of(user) -> bytes:
    browser = Client()
    browser.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


def console_socket(cookie: bytes, route: str):
    return WebsocketCommunicator(application, route, headers=[(b"cookie", cookie), ORIGIN])


async def in_thread(fn, *args, **kwargs):
    return await sync_to_async(fn, thread_sensitive=False)(*args, **kwargs)


async def received(socket) -> list[dict]:
    found = []
    while not await socket.receive_nothing(timeout=0.3):
        found.append(await socket.receive_json_from())
    return found


def test_call_events_reach_the_socket_in_the_clients_shape_once_each(world):
    a = world.a
    group = session_group(a.tenant.pk, a.session.pk)
    one, two = str(uuid.uuid4()), str(uuid.uuid4())

    async def scenario():
        socket = app_socket(a.session, a.keys["agent"])
        assert await socket.connect() == (True, None)
        layer = get_channel_layer()
        for message in (event(one, 1), event(one, 1), event(one, 2), event(two, 1), event(one, 2), event(one, 1),
                        event(two, 3)):
            await layer.group_send(group, message)
        assert await received(socket) == [sent(one, 1), sent(one, 2), sent(two, 1), sent(two, 3)]
        await socket.disconnect()

    asyncio.run(scenario())


def test_a_stream_hears_every_event_published_once_its_handshake_is_answered(world, monkeypatch):
    """Joining its group takes a while (a Redis round trip, here slowed down): an event published as soon as the
    client has the handshake's answer still reaches it."""
    a = world.a
    group = session_group(a.tenant.pk, a.session.pk)
    layer = get_channel_layer()
    join = layer.group_add

    async def slow_join(group, channel):
        await asyncio.sleep(0.2)
        await join(group, channel)

    monkeypatch.setattr(layer, "group_add", slow_join)

    async def scenario():
        socket = app_socket(a.session, a.keys["agent"])
        assert await socket.connect() == (True, None)
        await layer.group_send(group, event("c", 1))
        assert await received(socket) == [sent("c", 1)]
        await socket.disconnect()

    asyncio.run(scenario())


def test_a_stream_of_one_call_forwards_that_calls_events_only(world):
    a = world.a
    group = session_group(a.tenant.pk, a.session.pk)
    wanted, other = str(uuid.uuid4()), str(uuid.uuid4())

    async def scenario():
        socket = app_socket(a.session, a.keys["agent"], query=f"?call={wanted}")
        assert (await socket.connect())[0]
        for message in (event(other, 1), event(wanted, 1), event(other, 2)):
            await get_channel_layer().group_send(group, message)
        assert await received(socket) == [sent(wanted, 1)]
        await socket.disconnect()

    asyncio.run(scenario())


def test_the_last_after_of_the_query_replays_from_there(world):
    a = world.a
    call = a.calls[0]
    call_event_append(call=call, kind="output", data={"text": "hello"})

    async def scenario(query):
        socket = app_socket(a.session, a.keys["agent"], query=query)
        assert (await socket.connect())[0]
        events = await received(socket)
        await socket.disconnect()
        return events

    replayed = asyncio.run(scenario("?after=0"))
    assert replayed and {e["call"] for e in replayed} <= {str(c.pk) for c in a.calls}
    assert {"text": "hello"} in [e["data"] for e in replayed]
    assert asyncio.run(scenario(f"?after={MAX_SEQ}&after={MAX_SEQ}&after=0")) == replayed
    assert asyncio.run(scenario(f"?after=0&after=0&after={MAX_SEQ}")) == []
    assert asyncio.run(scenario("")) == []


def test_a_scope_without_a_query_string_opens_with_no_replay(world):
    """ASGI servers may leave `query_string` out of the scope."""
    async def scenario():
        socket = app_socket(world.a.session, world.a.keys["agent"])
        del socket.scope["query_string"]
        assert (await socket.connect())[0]
        assert await socket.receive_nothing(timeout=0.3)
        await socket.disconnect()

    asyncio.run(scenario())


def test_a_refused_app_socket_is_refused_with_4401(world):
    async def scenario():
        socket = app_socket(world.a.session, world.a.keys["admin"])
        assert await socket.connect() == (False, CLOSE_UNAUTHORIZED)
        await socket.wait()

    asyncio.run(scenario())


@pytest.mark.parametrize("header", [b"Bearer  {key}", b"bearer {key}", b"BEARER {key} "])
def test_the_key_is_read_from_the_authorization_header(world, header):
    async def scenario():
        value = header.replace(b"{key}", world.a.keys["agent"].encode())
        socket = app_socket(world.a.session, "", headers=[(b"authorization", value)])
        assert await socket.connect() == (True, None)
        await socket.disconnect()

    asyncio.run(scenario())


def test_a_non_bearer_header_leaves_the_key_to_the_subprotocol(world):
    async def scenario():
        protocol = f"bearer.{world.a.keys['agent']}"
        socket = app_socket(world.a.session, "", headers=[(b"authorization", b"Basic abc"), ORIGIN],
                            subprotocols=["other", protocol])
        assert await socket.connect() == (True, protocol)
        await socket.disconnect()

    asyncio.run(scenario())


def test_a_scope_without_subprotocols_opens_with_the_header_and_refuses_without(world):
    """ASGI servers may leave `subprotocols` out of the scope."""
    async def scenario():
        socket = app_socket(world.a.session, world.a.keys["agent"])
        del socket.scope["subprotocols"]
        assert await socket.connect() == (True, None)
        await socket.disconnect()
        keyless = app_socket(world.a.session, "", headers=[ORIGIN])
        del keyless.scope["subprotocols"]
        assert await keyless.connect() == (False, CLOSE_UNAUTHORIZED)
        await keyless.wait()

    asyncio.run(scenario())


def test_the_inbox_stream_sends_the_inbox_events(world):
    a = world.a
    cookie = cookie_of(a.users[Role.REVIEWER])
    message = {"type": "inbox.event", "change": "opened", "request": 7, "status": "pending", "tool": "current_time",
               "agent": "support-bot", "queue": None, "call": str(uuid.uuid4())}

    async def scenario():
        socket = console_socket(cookie, f"/ws/console/{a.tenant.slug}/inbox/")
        assert (await socket.connect())[0]
        await in_thread(grant_watch.check)  # the membership holds: the stream stays open
        await get_channel_layer().group_send(inbox_group(a.tenant.pk), message)
        assert await received(socket) == [{k: v for k, v in message.items() if k != "type"}]
        await socket.disconnect()

    asyncio.run(scenario())


def test_an_inbox_whose_member_left_closes_and_sends_nothing_more(world):
    a = world.a
    cookie = cookie_of(a.users[Role.REVIEWER])
    reviewer = a.users[Role.REVIEWER]

    async def scenario():
        socket = console_socket(cookie, f"/ws/console/{a.tenant.slug}/inbox/")
        assert (await socket.connect())[0]
        await in_thread(membership_remove, tenant=a.tenant, user=reviewer)
        await in_thread(grant_watch.check)
        assert await socket.receive_output(timeout=5) == {"type": "websocket.close", "code": CLOSE_UNAUTHORIZED}
        await get_channel_layer().group_send(inbox_group(a.tenant.pk), {"type": "inbox.event", "change": "opened"})
        assert await socket.receive_nothing(timeout=0.3)
        await socket.disconnect()

    asyncio.run(scenario())


def test_a_stream_whose_key_was_revoked_closes_and_sends_nothing_more(world):
    a = world.a
    issued = apikey_create(tenant=a.tenant, name="short-lived", scopes=["agent"])
    group = session_group(a.tenant.pk, a.session.pk)

    async def scenario():
        socket = app_socket(a.session, issued.key)
        assert (await socket.connect())[0]
        await in_thread(grant_watch.check)  # the key holds: the stream stays open
        await get_channel_layer().group_send(group, event("c", 1))
        assert await socket.receive_json_from(timeout=5) == sent("c", 1)
        await in_thread(apikey_revoke, api_key=issued.api_key)
        await in_thread(grant_watch.check)
        assert await socket.receive_output(timeout=5) == {"type": "websocket.close", "code": CLOSE_UNAUTHORIZED}
        await get_channel_layer().group_send(group, event("c", 2))
        assert await socket.receive_nothing(timeout=0.3)
        await socket.disconnect()

    asyncio.run(scenario())


class RecordedStream(AppSessionStream):
    """The app session stream, remembering its consumers so a test can find their channels."""

    opened: list = []

    async def connect(self):
        RecordedStream.opened.append(self)
        await super().connect()


def test_a_closed_socket_leaves_its_group_and_its_grant(world):
    a = world.a
    issued = apikey_create(tenant=a.tenant, name="short-lived", scopes=["agent"])
    group = session_group(a.tenant.pk, a.session.pk)
    app = URLRouter([path("ws/api/sessions/<str:session_id>/", RecordedStream.as_asgi())])
    RecordedStream.opened.clear()

    async def scenario():
        socket = app_socket(a.session, issued.key, app=app)
        assert (await socket.connect())[0]
        await socket.disconnect()
        channel = RecordedStream.opened[0].channel_name
        layer = get_channel_layer()
        await layer.group_send(group, event("c", 1))
        await in_thread(apikey_revoke, api_key=issued.api_key)
        await in_thread(grant_watch.check)  # nobody holds the key any more: nobody is told
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(layer.receive(channel), timeout=0.5)

    asyncio.run(scenario())


def test_events_are_forwarded_while_the_sync_thread_is_busy(world):
    """Forwarding reads no database, so it does not queue behind the process's sync work."""
    a = world.a
    cookie = cookie_of(a.users[Role.REVIEWER])
    group = session_group(a.tenant.pk, a.session.pk)
    release = threading.Event()

    async def scenario():
        socket = app_socket(a.session, a.keys["agent"])
        console = console_socket(cookie, f"/ws/console/{a.tenant.slug}/inbox/")
        assert (await socket.connect())[0] and (await console.connect())[0]
        busy = asyncio.ensure_future(sync_to_async(release.wait)())  # the sync thread, taken
        try:
            await asyncio.sleep(0.05)
            layer = get_channel_layer()
            await layer.group_send(group, event("c", 1))
            assert await socket.receive_json_from(timeout=5) == sent("c", 1)
            await layer.group_send(inbox_group(a.tenant.pk), {"type": "inbox.event", "change": "settled"})
            assert await console.receive_json_from(timeout=5) == {"change": "settled"}
        finally:
            release.set()
            await busy
        await socket.disconnect()
        await console.disconnect()

    asyncio.run(scenario())


def test_a_console_stream_with_a_malformed_query_is_told_so(world):
    """A browser cannot read a refused handshake: a console stream accepts, then closes with the reason's code."""
    cookie = cookie_of(world.a.users["admin"])

    async def scenario():
        socket = console_socket(cookie, f"/ws/console/{world.a.tenant.slug}/calls/?after=soon")
        assert (await socket.connect())[0]
        assert await socket.receive_output() == {"type": "websocket.close", "code": CLOSE_BAD_REQUEST}
        await socket.wait()

    asyncio.run(scenario())


def test_a_scope_without_headers_opens_with_the_subprotocol_and_refuses_without(world):
    """ASGI servers may leave `headers` out of the scope too."""
    async def scenario():
        protocol = f"bearer.{world.a.keys['agent']}"
        socket = app_socket(world.a.session, "", subprotocols=[protocol])
        del socket.scope["headers"]
        assert await socket.connect() == (True, protocol)
        await socket.disconnect()
        keyless = app_socket(world.a.session, "")
        del keyless.scope["headers"]
        assert await keyless.connect() == (False, CLOSE_UNAUTHORIZED)
        await keyless.wait()

    asyncio.run(scenario())


def test_every_stream_is_admitted_as_a_websocket(world, monkeypatch):
    """The admission of a stream names its entry, as every entry's does (tenancy.entry.admission)."""
    entries = []
    real_admit = consumers.admit

    def admit(**kwargs):
        entries.append(kwargs["entry"])
        return real_admit(**kwargs)

    monkeypatch.setattr(consumers, "admit", admit)
    cookie = cookie_of(world.a.users["admin"])

    async def scenario():
        for socket in (app_socket(world.a.session, world.a.keys["agent"]),
                       console_socket(cookie, f"/ws/console/{world.a.tenant.slug}/calls/")):
            assert (await socket.connect())[0]
            await socket.disconnect()

    asyncio.run(scenario())
    assert entries == [Entry.WEBSOCKET, Entry.WEBSOCKET]
