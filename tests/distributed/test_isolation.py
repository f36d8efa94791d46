"""Sockets never cross tenants: console streams check the session cookie, the tenant membership and the
Origin before joining a group; app streams check the API key and that the session is the key's tenant's."""
import asyncio

import pytest

from tests.distributed.support import is_terminal, ws_collect, ws_connect, ws_next, ws_refused

pytestmark = [pytest.mark.live, pytest.mark.postgres, pytest.mark.xdist_group("distributed")]


@pytest.fixture(scope="module")
def cookies(deployment):
    from tests.distributed.support import console_login

    return {
        "a": console_login(deployment.url, deployment.a.username, deployment.a.password),
        "b": console_login(deployment.url, deployment.b.username, deployment.b.password),
    }


def _console(deployment, cookie: str | None, origin: str | None = None) -> dict:
    headers = {"Origin": origin or deployment.origin}
    if cookie:
        headers["Cookie"] = cookie
    return headers


def test_a_console_socket_of_tenant_a_never_receives_tenant_b_events(deployment, cookies):
    api_a, api_b = deployment.api(deployment.a), deployment.api(deployment.b)
    session_a, session_b = api_a.new_session("iso-bot"), api_b.new_session("iso-bot")

    async def scenario():
        base = deployment.ws_base
        socket_a = await ws_connect(f"{base}/ws/console/{deployment.a.slug}/calls/",
                                    headers=_console(deployment, cookies["a"]))
        socket_b = await ws_connect(f"{base}/ws/console/{deployment.b.slug}/calls/",
                                    headers=_console(deployment, cookies["b"]))
        # B's calls first (finished before A's is submitted), then one of A's, then B again.
        b_calls = [await asyncio.to_thread(api_b.submit, session_b, "countdown", {"seconds": 1}, 20)
                   for _ in range(2)]
        a_call = await asyncio.to_thread(api_a.submit, session_a, "countdown", {"seconds": 1}, 20)
        b_calls.append(await asyncio.to_thread(api_b.submit, session_b, "current_time", {}, 20))
        assert {c["status"] for c in [a_call, *b_calls]} == {"succeeded"}
        b_ids = {c["id"] for c in b_calls}

        # B's socket hears all of B's calls end (so B's events were broadcast while A listened)…
        seen_b = await ws_collect(socket_b, lambda m: b_ids <= {x["call"] for x in m if is_terminal(x)}, 30)
        # …and A's socket hears A's call end; then drain whatever else is on its way.
        seen_a = await ws_collect(socket_a, lambda m: any(x["call"] == a_call["id"] and is_terminal(x) for x in m),
                                  30)
        while (extra := await ws_next(socket_a, 1.5)) is not None:
            seen_a.append(extra)
        await socket_a.close()
        await socket_b.close()
        return a_call, b_ids, seen_a, seen_b

    a_call, b_ids, seen_a, seen_b = asyncio.run(scenario())
    assert {m["call"] for m in seen_a} == {a_call["id"]}
    assert [m["data"]["status"] for m in seen_a if m["kind"] == "status"] == ["queued", "running", "succeeded"]
    assert {m["call"] for m in seen_b} == b_ids


def test_console_sockets_refuse_strangers(deployment, cookies):
    api_b = deployment.api(deployment.b)
    session_b = api_b.new_session("iso-bot-2")
    b_call = api_b.submit(session_b, "current_time", {}, wait=10)
    base, a, b = deployment.ws_base, deployment.a.slug, deployment.b.slug

    async def scenario():
        return {
            "no cookie": await ws_refused(f"{base}/ws/console/{a}/calls/", _console(deployment, None)),
            "no cookie, inbox": await ws_refused(f"{base}/ws/console/{a}/inbox/", _console(deployment, None)),
            "A's cookie on B's calls": await ws_refused(f"{base}/ws/console/{b}/calls/",
                                                        _console(deployment, cookies["a"])),
            "A's cookie on B's inbox": await ws_refused(f"{base}/ws/console/{b}/inbox/",
                                                        _console(deployment, cookies["a"])),
            "A's cookie, B's call under A's slug": await ws_refused(
                f"{base}/ws/console/{a}/calls/{b_call['id']}/", _console(deployment, cookies["a"])),
            "A's cookie, B's session under A's slug": await ws_refused(
                f"{base}/ws/console/{a}/sessions/{session_b}/", _console(deployment, cookies["a"])),
            "A's cookie from a foreign origin": await ws_refused(
                f"{base}/ws/console/{a}/calls/", _console(deployment, cookies["a"], origin="http://evil.example")),
            "a forged cookie": await ws_refused(f"{base}/ws/console/{a}/calls/",
                                                _console(deployment, "sessionid=forged0123456789")),
        }

    refusals = asyncio.run(scenario())
    assert all(how.startswith(("rejected", "closed")) for how in refusals.values()), refusals


def test_app_sockets_refuse_foreign_sessions_and_revoked_keys(deployment):
    api_a, api_b = deployment.api(deployment.a), deployment.api(deployment.b)
    session_a, session_b = api_a.new_session("iso-app"), api_b.new_session("iso-app")
    base = deployment.ws_base

    def bearer(key: str) -> dict:
        return {"Authorization": f"Bearer {key}"}

    async def scenario():
        # The positive control: A's key on A's session is accepted.
        own = await ws_connect(f"{base}/ws/api/sessions/{session_a}/", headers=bearer(deployment.a.api_key))
        await own.close()
        return {
            "A's key, B's session": await ws_refused(f"{base}/ws/api/sessions/{session_b}/",
                                                     bearer(deployment.a.api_key)),
            "B's key (subprotocol), A's session": await ws_refused(
                f"{base}/ws/api/sessions/{session_a}/", subprotocols=[f"bearer.{deployment.b.api_key}"]),
            "a revoked key of A": await ws_refused(f"{base}/ws/api/sessions/{session_a}/",
                                                   bearer(deployment.revoked_key)),
            "A's admin key (no agent scope)": await ws_refused(f"{base}/ws/api/sessions/{session_a}/",
                                                               bearer(deployment.a.admin_key)),
            "no key": await ws_refused(f"{base}/ws/api/sessions/{session_a}/"),
            "a malformed session id": await ws_refused(f"{base}/ws/api/sessions/not-a-uuid/",
                                                       bearer(deployment.a.api_key)),
        }

    refusals = asyncio.run(scenario())
    assert all(how.startswith(("rejected", "closed")) for how in refusals.values()), refusals
