"""What every WebSocket stream shares (docs/notes/realtime.md): consumers authenticate, check access, then join a group.

The streams themselves belong to the apps whose events they carry (`tools.calls.streams`: calls and sessions;
`approvals.streams`: the inbox); `toolkeeper.routing` gathers their routes.

A client that passes `after=<seq>` first receives the stored events it missed (per call, those
numbered above `after`), then live ones; an event is never sent twice on one connection.
A stream holds the grant it was let in with (its API key, or its user's membership): when that
ends, the stream is closed with code 4401 (`tenancy.grants`).

A connect is admitted like any other request (`tenancy.entry.admission.admit`): it counts against the key's (or the
console login's) and the tenant's requests per minute, and one past a limit is closed with code 4429.
"""
import asyncio
import logging
import time
from datetime import datetime
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from common import metrics
from common.errors import NotPermitted, RateLimited
from tenancy.entry.admission import Entry, NotAuthenticated, admit
from tenancy.entry.authentication import bearer_token
from tenancy.grants import Grant, grant_of_key, grant_of_member, grant_watch
from tenancy.models import Scope
from tenancy.selectors import access_tenant

logger = logging.getLogger("toolkeeper.realtime")

CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHORIZED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_RATE_LIMITED = 4429
MAX_SEQ = 2**63 - 1
# Channel-layer messages whose handlers touch no database (see EventStream.dispatch).
DATABASE_FREE_MESSAGES = frozenset({"call.event", "inbox.event", "access.ended"})


def _query(scope) -> dict:
    return {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}


def _after(query: dict) -> int | None:
    """`after=<seq>`: None when absent; ValueError unless a sequence number (a non-negative integer that
    fits the database's column)."""
    value = query.get("after")
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or int(value) > MAX_SEQ:
        raise ValueError("after must be a non-negative integer")
    return int(value)


class EventStream(AsyncJsonWebsocketConsumer):
    """A stream of call events for one group; subclasses decide who may join which group."""

    group: str = ""
    call_filter: str | None = None
    explain_refusal = False
    grant: Grant | None = None  # set by authorize()
    grant_handle: int | None = None  # set once the grant is held
    joined = False  # set once the stream is in its groups
    ended = False

    async def connect(self):
        self.sent: dict[str, int] = {}
        try:
            self.read_query(_query(self.scope))
        except ValueError:
            await self.refuse(CLOSE_BAD_REQUEST)
            return
        try:
            access = await database_sync_to_async(self.authorize)()
        except RateLimited:
            await self.refuse(CLOSE_RATE_LIMITED)
            return
        if access is None:
            await self.refuse(CLOSE_UNAUTHORIZED)
            return
        # In the groups before the handshake's answer: a client that has it back hears every event published
        # after (what arrives meanwhile waits in the channel until connect returns).
        for group in self.groups_to_join():
            await self.channel_layer.group_add(group, self.channel_name)
        self.joined = True
        await self.accept(subprotocol=self.accepted_subprotocol())
        if self.grant is not None:
            self.grant_handle = grant_watch.hold(self.grant, self._grant_ended)
        if self.after is not None:
            for event in await database_sync_to_async(self.replay)(self.after):
                await self.forward(event)

    def read_query(self, query: dict) -> None:
        """Take the stream's query parameters; ValueError when one is malformed."""
        self.after = _after(query)

    async def refuse(self, code: int) -> None:
        if self.explain_refusal:
            # Browsers cannot see a refused handshake's reason: accept, then close with a code.
            await self.accept()
        await self.close(code=code)

    def _grant_ended(self) -> None:
        # Through the stream's own channel, so the close is handled in turn with the events.
        asyncio.ensure_future(self.channel_layer.send(self.channel_name, {"type": "access.ended"}))

    async def access_ended(self, message):
        self.ended = True
        await self.close(code=CLOSE_UNAUTHORIZED)

    async def disconnect(self, code):
        if self.grant_handle is not None:
            grant_watch.release(self.grant_handle)
        if self.joined:
            for group in self.groups_to_join():
                await self.channel_layer.group_discard(group, self.channel_name)

    async def dispatch(self, message):
        # Channels closes stale database connections before every handler, in a thread of its own: a round
        # trip to that thread per event, queued behind the process's sync views. Forwarding an event reads
        # no database (the replay runs in database_sync_to_async, which closes them itself).
        if message.get("type") in DATABASE_FREE_MESSAGES:
            await getattr(self, message["type"].replace(".", "_"))(message)
            return
        await super().dispatch(message)

    async def receive_json(self, content, **kwargs):
        """Streams are one-way; a client message is ignored."""

    async def call_event(self, message):
        if await self.forward(message) and metrics.ENABLED:  # a live event: from its append (its time) to here
            metrics.fanout_observe(time.time() - datetime.fromisoformat(message["at"]).timestamp())

    async def inbox_event(self, message):
        if not self.ended:
            await self.send_json({k: v for k, v in message.items() if k != "type"})

    async def forward(self, message: dict) -> bool:
        """Send a call's event (once); whether it was sent."""
        if self.ended:
            return False
        call_id = message["call"]
        if self.call_filter and call_id != self.call_filter:
            return False
        if message["seq"] <= self.sent.get(call_id, 0):
            return False
        self.sent[call_id] = message["seq"]
        await self.send_json({"call": call_id, "seq": message["seq"], "kind": message["kind"],
                              "data": message["data"], "at": message["at"]})
        return True

    # -- subclass hooks --
    def authorize(self):
        raise NotImplementedError

    def groups_to_join(self) -> list[str]:
        return [self.group]

    def accepted_subprotocol(self):
        return None

    def replay(self, after: int) -> list[dict]:
        return []


class AppStream(EventStream):
    """App streams: authenticated by an API key with the agent scope, sent as `Authorization: Bearer`
    or, where a client cannot set headers (browsers), as the subprotocol `bearer.<key>`."""

    subprotocol: str | None = None

    def _authorization(self) -> tuple[str | None, str | None]:
        """A bearer `Authorization` header's value, or one made of a `bearer.<key>` subprotocol; and that
        protocol. Another kind of header leaves the key to the subprotocol."""
        for name, value in self.scope.get("headers", []):
            if name == b"authorization" and bearer_token(value.decode("latin-1")) is not None:
                return value.decode("latin-1"), None
        for protocol in self.scope.get("subprotocols", []):
            if protocol.startswith("bearer."):
                return f"Bearer {protocol[len('bearer.'):]}", protocol
        return None, None

    def agent_key(self):
        """The stream's API key, admitted, which then holds the stream open; None unless it is valid and has the
        agent scope. RateLimited past the key's or the tenant's requests per minute."""
        authorization, self.subprotocol = self._authorization()
        if authorization is None:
            return None
        try:
            api_key = admit(entry=Entry.WEBSOCKET, authorization=authorization, scope=Scope.AGENT).api_key
        except (NotAuthenticated, NotPermitted):
            return None
        self.grant = grant_of_key(api_key)
        return api_key

    def accepted_subprotocol(self):
        return self.subprotocol


class ConsoleStream(EventStream):
    """Console streams: a logged-in member of the tenant named in the URL."""

    explain_refusal = True

    def member_tenant(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            return None
        try:
            tenant, _ = access_tenant(user, self.scope["url_route"]["kwargs"]["tenant"])
        except Exception:
            return None
        admit(entry=Entry.WEBSOCKET, user=user, tenant=tenant)
        session = self.scope.get("session")
        self.grant = grant_of_member(tenant.pk, user.pk, getattr(session, "session_key", None))
        return tenant


