"""Every WebSocket route, opened as someone who must not get in, is refused; opened as its owner, it opens.

The socket twin of the URL walker (`tests/test_url_isolation.py`), in process through the real routing and
middleware (cookie sessions, the Origin check). It walks `toolkeeper.routing.websocket_urlpatterns`; each
route's parameters are filled by name with the other tenant's ids, or with this tenant's ids and the wrong
credentials: another agent's session for a key locked to one agent, a revoked key, a key without the agent
scope, no key; for console routes a user who is not a member, and no login. A route whose prefix or
parameter the walker does not know fails it: a new socket route must come with coverage here.
"""
import asyncio
from dataclasses import dataclass

import pytest
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import URLPattern

from realtime.consumers import CLOSE_UNAUTHORIZED
from tenancy.services import apikey_create, apikey_revoke
from toolkeeper.routing import websocket_urlpatterns
from tools.catalog.services import session_create

pytestmark = pytest.mark.django_db(transaction=True)
application = URLRouter(websocket_urlpatterns)
APP_PREFIX, CONSOLE_PREFIX = "ws/api/", "ws/console/"
ORIGIN = (b"origin", b"http://localhost")


@dataclass(frozen=True)
class Ids:
    tenant: str
    session_id: str
    call_id: str


@dataclass(frozen=True)
class Opening:
    """One attempt: the route's parameters, and who knocks."""

    what: str
    ids: Ids
    key: str | None = None
    user: object = None
    needs: frozenset = frozenset()  # parameters of which a route must have one for this attempt to mean anything
    subprotocol: bool = False  # the key as the subprotocol `bearer.<key>` (browsers), not the Authorization header


BY_ID = frozenset({"session_id", "call_id"})


def parameters(route: str) -> set[str]:
    return {part.split(">")[0].split(":")[-1] for part in route.split("<")[1:]}


def routes() -> list[str]:
    found = []
    for pattern in websocket_urlpatterns:
        assert isinstance(pattern, URLPattern), f"{pattern!r}: the walker reads flat route lists"
        found.append(str(pattern.pattern))
    return found


def fill(route: str, ids: Ids) -> str:
    path = "/" + route
    for name in ("tenant", "session_id", "call_id"):
        for converter in ("str", "slug", "uuid"):
            path = path.replace(f"<{converter}:{name}>", str(getattr(ids, name)))
    assert "<" not in path, f"{route}: a parameter the socket walker does not know; give it coverage here"
    return path


def cookie_of(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


async def _opens(path: str, *, key: str | None, subprotocol: bool, cookie: bytes | None) -> bool:
    """Whether the stream opens and stays open: a refusal is a refused handshake or a close with 4401."""
    headers, subprotocols = [ORIGIN], []
    if key and subprotocol:
        subprotocols.append(f"bearer.{key}")
    elif key:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    if cookie is not None:
        headers.append((b"cookie", cookie))
    communicator = WebsocketCommunicator(application, path, headers=headers, subprotocols=subprotocols)
    connected, code = await communicator.connect(timeout=10)
    if not connected:
        await communicator.wait()
        return False
    if not await communicator.receive_nothing(timeout=0.2):
        output = await communicator.receive_output()
        await communicator.wait()
        assert output == {"type": "websocket.close", "code": CLOSE_UNAUTHORIZED}, output
        return False
    await communicator.disconnect()
    return True


def opens(route: str, opening: Opening) -> bool:
    cookie = cookie_of(opening.user) if opening.user is not None else None
    return asyncio.run(_opens(fill(route, opening.ids), key=opening.key, subprotocol=opening.subprotocol,
                              cookie=cookie))


@pytest.fixture
def knocks(world):
    """(the owner's openings, the openings to refuse) for each kind of route."""
    a, b = world.a, world.b
    own = Ids(a.tenant.slug, str(a.session.pk), str(a.calls[0].pk))
    theirs = Ids(b.tenant.slug, str(b.session.pk), str(b.calls[0].pk))
    # A's tenant named in the URL, B's objects in it: the lookup itself must be scoped.
    mixed = Ids(a.tenant.slug, str(b.session.pk), str(b.calls[0].pk))
    other_agent = session_create(tenant=a.tenant, agent="billing-bot", user="bob@example.com",
                                 api_key=a.key_objects["agent"])
    revoked = apikey_create(tenant=a.tenant, name="revoked", scopes=["agent"], agent="", created_by=a.users["admin"])
    apikey_revoke(api_key=revoked.api_key)
    stranger = get_user_model().objects.create_user(username="stranger", password="x" * 16)
    app = {
        "own": [Opening("A's agent key, A's session", own, key=a.keys["agent"]),
                Opening("A's agent key as the subprotocol, A's session", own, key=a.keys["agent"], subprotocol=True),
                Opening("A's key locked to support-bot, its own agent's session", own, key=a.keys["locked"])],
        "refused": [
            Opening("A's agent key, B's session", theirs, key=a.keys["agent"]),
            Opening("B's agent key, A's session", own, key=b.keys["agent"]),
            Opening("A's key locked to support-bot, billing-bot's session",
                    Ids(own.tenant, str(other_agent.pk), own.call_id), key=a.keys["locked"],
                    needs=frozenset({"session_id"})),
            Opening("A's revoked key", own, key=revoked.key),
            Opening("A's agent key as the subprotocol, B's session", theirs, key=a.keys["agent"], subprotocol=True),
            Opening("A's locked key as the subprotocol, billing-bot's session",
                    Ids(own.tenant, str(other_agent.pk), own.call_id), key=a.keys["locked"],
                    needs=frozenset({"session_id"}), subprotocol=True),
            Opening("A's revoked key as the subprotocol", own, key=revoked.key, subprotocol=True),
            Opening("A's admin key as the subprotocol", own, key=a.keys["admin"], subprotocol=True),
            Opening("A's admin key (no agent scope)", own, key=a.keys["admin"]),
            Opening("A's external key (no agent scope)", own, key=a.keys["external"]),
            Opening("no key", own),
            Opening("A's admin logged in, no key", own, user=a.users["admin"]),
        ],
    }
    console = {
        "own": [Opening("A's admin, A's ids", own, user=a.users["admin"])],
        "refused": [
            Opening("A's admin, B's tenant and ids", theirs, user=a.users["admin"]),
            Opening("A's admin, A's tenant with B's ids", mixed, user=a.users["admin"], needs=BY_ID),
            Opening("B's admin, A's ids", own, user=b.users["admin"]),
            Opening("a user who is no member", own, user=stranger),
            Opening("no login, A's agent key", own, key=a.keys["agent"]),
            Opening("no login", own),
        ],
    }
    return {APP_PREFIX: app, CONSOLE_PREFIX: console}


def test_every_socket_route_refuses_who_must_not_get_in(knocks):
    walked, problems = [], []
    for route in routes():
        prefix = next((p for p in (APP_PREFIX, CONSOLE_PREFIX) if route.startswith(p)), None)
        assert prefix is not None, f"{route}: a socket route outside the walker's prefixes; give it coverage here"
        for opening in knocks[prefix]["own"]:
            if not opens(route, opening):
                problems.append(f"{route}: {opening.what} was refused (the walker's control)")
        for opening in knocks[prefix]["refused"]:
            if opening.needs and not opening.needs & parameters(route):
                continue
            if opens(route, opening):
                problems.append(f"{route}: {opening.what} got in")
        walked.append(route)
    assert not problems, "\n".join(problems)
    assert len(walked) == len(websocket_urlpatterns) >= 5


def test_the_walker_knows_every_parameter_of_every_route():
    """A new route's parameter must be added to `Ids` (and so to every refusal above) before it passes."""
    for route in routes():
        assert parameters(route) <= {"tenant", "session_id", "call_id"}, route
