"""A malformed `call` or `after` on a stream is the client's error: the socket is refused cleanly (the
handshake for app sockets, close code 4400 for console sockets), never closed as a server error (1011)
with an exception in the log. Before, `?call=zzz` reached the database as a UUID and crashed the consumer.
"""
import asyncio
import logging

import pytest
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from realtime.consumers import CLOSE_BAD_REQUEST
from toolkeeper.routing import websocket_urlpatterns
from tools.calls.events import call_event_append

pytestmark = pytest.mark.django_db(transaction=True)
application = URLRouter(websocket_urlpatterns)


async def _connect(path: str, key: str):
    communicator = WebsocketCommunicator(application, path, subprotocols=[f"bearer.{key}"])
    connected, code = await communicator.connect(timeout=10)
    events = []
    if connected:
        while not await communicator.receive_nothing(timeout=0.3):
            events.append(await communicator.receive_json_from())
    await communicator.disconnect()
    return connected, code, events


def connect(path: str, key: str):
    return asyncio.run(_connect(path, key))


@pytest.mark.parametrize("query", [
    "call=zzz", "call=1", "call=00000000-0000-0000-0000-00000000000g",
    "after=soon", "after=-1", "after=1.5", "after=99999999999999999999999", "after=%C2%B2",
    "after=0&call=zzz",
])
def test_malformed_stream_parameters_refuse_the_handshake(world, caplog, query):
    with caplog.at_level(logging.WARNING):
        connected, code, _ = connect(f"/ws/api/sessions/{world.a.session.pk}/?{query}", world.a.keys["agent"])
    assert not connected and code == CLOSE_BAD_REQUEST
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_well_formed_parameters_still_replay_one_calls_events(world):
    call = world.a.calls[0]
    call_event_append(call=call, kind="output", data={"text": "hello"})
    path = f"/ws/api/sessions/{world.a.session.pk}/?after=0&call={str(call.pk).upper()}"
    connected, _, events = connect(path, world.a.keys["agent"])
    assert connected
    assert events and {event["call"] for event in events} == {str(call.pk)}
    assert events[-1]["data"] == {"text": "hello"}
