"""Helpers of the distributed tests: an API client, bounded waits, console logins, WebSocket clients."""
from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from dataclasses import dataclass

import httpx
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

TERMINAL = {"succeeded", "failed", "denied", "rejected", "expired", "cancelled", "timed_out", "interrupted"}


@dataclass
class TenantAccess:
    slug: str
    api_key: str
    admin_key: str
    username: str
    password: str


class Api:
    """A keep-alive httpx client with one tenant's key; calls return parsed JSON and check the status."""

    def __init__(self, url: str, key: str):
        self.url = url
        self.key = key
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=90)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def new_session(self, agent: str = "dist-bot", ops: bool = True) -> str:
        response = self.http.post("/api/v1/sessions", json={"agent": agent, "user": "dist@example.com"})
        assert response.status_code == 201, response.text
        session = response.json()["id"]
        if ops:
            call = self.submit(session, "reset_tools", {"ops": True}, wait=10)
            assert call["status"] == "succeeded", call
        return session

    def submit_raw(self, session: str, name: str, input: dict, wait: float = 0) -> httpx.Response:  # noqa: A002
        return self.http.post(f"/api/v1/sessions/{session}/calls", json={"name": name, "input": input, "wait": wait})

    def submit(self, session: str, name: str, input: dict, wait: float = 0) -> dict:  # noqa: A002
        response = self.submit_raw(session, name, input, wait)
        assert response.status_code == 200, response.text
        return response.json()["calls"][0]

    def call(self, call_id: str) -> dict:
        response = self.http.get(f"/api/v1/calls/{call_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def events(self, call_id: str) -> list[dict]:
        response = self.http.get(f"/api/v1/calls/{call_id}/events")
        assert response.status_code == 200, response.text
        return response.json()["events"]

    def cancel(self, call_id: str) -> httpx.Response:
        return self.http.post(f"/api/v1/calls/{call_id}/cancel")

    def wait_terminal(self, call_id: str, timeout: float = 60) -> dict:
        """Poll (no server-side wait, so it works whatever the channel layer does) until terminal."""
        deadline = time.monotonic() + timeout
        call = self.call(call_id)
        while call["status"] not in TERMINAL and time.monotonic() < deadline:
            time.sleep(0.2)
            call = self.call(call_id)
        assert call["status"] in TERMINAL, f"call {call_id} still {call['status']} after {timeout} s"
        return call

    def wait_events(self, call_id: str, predicate, timeout: float = 30) -> list[dict]:
        deadline = time.monotonic() + timeout
        events = self.events(call_id)
        while not predicate(events) and time.monotonic() < deadline:
            time.sleep(0.1)
            events = self.events(call_id)
        assert predicate(events), f"events of {call_id} never matched: {events}"
        return events

    def tool_id(self, name: str) -> int:
        page = "/api/v1/tools?limit=500"
        while page:
            response = self.http.get(page)
            assert response.status_code == 200, response.text
            body = response.json()
            for tool in body["results"]:
                if tool["name"] == name:
                    return tool["id"]
            page = body.get("next")
        raise AssertionError(f"no tool {name}")


def statuses(events: list[dict]) -> list[str]:
    return [e["data"]["status"] for e in events if e["kind"] == "status"]


def progress(events: list[dict]) -> list[dict]:
    return [e for e in events if e["kind"] == "progress"]


def console_login(url: str, username: str, password: str) -> str:
    """Log in through the login page like a browser; returns the Cookie header of the session."""
    with httpx.Client(base_url=url, timeout=30) as client:
        page = client.get("/login/")
        assert page.status_code == 200, page.text
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token, "the login page has no CSRF token"
        response = client.post("/login/", data={"username": username, "password": password,
                                                "csrfmiddlewaretoken": token.group(1)},
                               headers={"Referer": f"{url}/login/"})
        assert response.status_code == 302, f"login of {username} failed: {response.status_code}"
        assert client.cookies.get("sessionid"), "no session cookie after login"
        return f"sessionid={client.cookies['sessionid']}"


# -- WebSockets ----------------------------------------------------------------------------------

async def ws_connect(url: str, headers: dict | None = None, subprotocols: list[str] | None = None):
    return await websockets.connect(url, additional_headers=headers or {},
                                    subprotocols=subprotocols or None, open_timeout=10)


async def ws_next(socket, timeout: float) -> dict | None:
    """The next JSON message, or None when nothing came within `timeout` seconds."""
    try:
        raw = await asyncio.wait_for(socket.recv(), timeout=timeout)
    except TimeoutError:
        return None
    return json.loads(raw)


async def ws_collect(socket, until, timeout: float = 30, call: str | None = None) -> list[dict]:
    """Messages (optionally of one call) until `until(messages)` holds; bounded by `timeout`."""
    deadline = time.monotonic() + timeout
    messages: list[dict] = []
    while not until(messages):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"socket stream incomplete after {timeout} s: {messages}")
        message = await ws_next(socket, remaining)
        if message is not None and (call is None or message.get("call") == call):
            messages.append(message)
    return messages


def is_terminal(message: dict) -> bool:
    return message["kind"] == "status" and message["data"].get("status") in TERMINAL


async def ws_refused(url: str, headers: dict | None = None, subprotocols: list[str] | None = None) -> str:
    """How the server refused the socket: 'rejected <status>' at the handshake, or 'closed <code>' right
    after it. Fails when the socket is accepted and stays open."""
    try:
        socket = await ws_connect(url, headers, subprotocols)
    except InvalidStatus as exc:
        return f"rejected {exc.response.status_code}"
    try:
        message = await asyncio.wait_for(socket.recv(), timeout=3)
    except ConnectionClosed as exc:
        return f"closed {exc.rcvd.code if exc.rcvd else 'without a frame'}"
    except TimeoutError:
        await socket.close()
        raise AssertionError(f"{url} was accepted and stayed open") from None
    await socket.close()
    raise AssertionError(f"{url} was accepted and sent {message!r}")


# -- ending access ---------------------------------------------------------------------------------
# Shared by the embedded live server (tests/live) and the distributed stack: `shell(code)` runs Python in
# `manage.py shell -c` against the server's database (another process than the server) and returns the
# JSON the code prints last.

ACCESS_BOUND_S = 20  # far beyond the server's re-check of grants (1 s): only a broken close waits this long
WAITED_S = 30

NEW_KEY = """
import json
from tenancy.models import Tenant
from tenancy.services import apikey_create
issued = apikey_create(tenant=Tenant.objects.get(slug={slug!r}), name="revoke me", scopes=["agent"])
print(json.dumps({{"key": issued.key, "id": issued.api_key.pk}}))
"""
REVOKE_KEY = """
import json
from tenancy.models import ApiKey
from tenancy.services import apikey_revoke
apikey_revoke(api_key=ApiKey.all_tenants.get(pk={id}))
print(json.dumps({{"revoked": {id}}}))
"""
NEW_MEMBER = """
import json
from tenancy.models import Role, Tenant
from tenancy.services import membership_set, user_create
user = user_create(username={username!r}, password={password!r})
membership_set(tenant=Tenant.objects.get(slug={slug!r}), user=user, role=Role.REVIEWER)
print(json.dumps({{"user": user.pk}}))
"""
REMOVE_MEMBER = """
import json
from django.contrib.auth import get_user_model
from tenancy.models import Tenant
from tenancy.services import membership_remove
user = get_user_model().objects.get(username={username!r})
print(json.dumps({{"removed": membership_remove(tenant=Tenant.objects.get(slug={slug!r}), user=user)}}))
"""


async def ws_close_code(socket, bound_s: float = ACCESS_BOUND_S) -> int | None:
    """Read the stream until the server closes it: the close code, or None if it stayed open `bound_s`."""
    try:
        async with asyncio.timeout(bound_s):
            while True:
                await socket.recv()
    except ConnectionClosed as exc:
        return exc.rcvd.code if exc.rcvd else None
    except TimeoutError:
        await socket.close()
        return None


def revoking_a_key_ends_its_socket_and_wait(url: str, shell, slug: str, tenant_key: str) -> None:
    """A key with an open socket and a request waiting 30 s: revoked from another process, the socket
    closes with 4401 and the request answers 401 in the envelope, both long before the wait would end."""
    issued = shell(NEW_KEY.format(slug=slug))
    ws_url = url.replace("http://", "ws://", 1)
    with Api(url, issued["key"]) as api, Api(url, tenant_key) as tenant_api:
        session = api.new_session("revoke-bot")
        call = api.submit(session, "countdown", {"seconds": 60})

        async def scenario():
            socket = await ws_connect(f"{ws_url}/ws/api/sessions/{session}/?after=0",
                                      headers={"Authorization": f"Bearer {issued['key']}"})
            assert await ws_next(socket, 10) is not None, "the socket streams the call before the revocation"
            waiting = asyncio.create_task(asyncio.to_thread(api.http.get, f"/api/v1/calls/{call['id']}",
                                                            params={"wait": WAITED_S}))
            await asyncio.sleep(2)  # the request is waiting by now
            await asyncio.to_thread(shell, REVOKE_KEY.format(id=issued["id"]))
            code = await ws_close_code(socket)
            response = await asyncio.wait_for(waiting, ACCESS_BOUND_S)
            return code, response

        try:
            code, response = asyncio.run(scenario())
        finally:
            tenant_api.cancel(call["id"])
    assert code == 4401, f"the socket of a revoked key closed with {code}"
    assert response.status_code == 401, response.text
    assert response.json() == {"error": {"code": "authentication_failed", "message": "Invalid or revoked API key.",
                                         "fields": {}}}


def removing_a_member_closes_their_console_socket(url: str, shell, slug: str, tenant_key: str) -> None:
    """A reviewer following the tenant's calls: taken out of the tenant from another process, their
    console socket closes with 4401."""
    username, password = f"leaver-{secrets.token_hex(4)}", secrets.token_urlsafe(12)
    shell(NEW_MEMBER.format(username=username, password=password, slug=slug))
    cookie = console_login(url, username, password)
    ws_url = url.replace("http://", "ws://", 1)

    async def scenario():
        socket = await ws_connect(f"{ws_url}/ws/console/{slug}/calls/", headers={"Cookie": cookie, "Origin": url})
        with Api(url, tenant_key) as api:
            session = await asyncio.to_thread(api.new_session, "leaver-bot", False)
            await asyncio.to_thread(api.submit, session, "current_time", {})
        assert await ws_next(socket, 10) is not None, "the member's socket streams the tenant's calls"
        removed = await asyncio.to_thread(shell, REMOVE_MEMBER.format(username=username, slug=slug))
        assert removed == {"removed": True}
        return await ws_close_code(socket)

    assert asyncio.run(scenario()) == 4401
