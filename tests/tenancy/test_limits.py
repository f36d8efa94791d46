"""Rate limits (tenancy.entry.limits): requests per minute and calls in flight, per API key and per tenant."""
import logging
import time
from types import SimpleNamespace

import pytest
import redis
from django.contrib.auth.models import AnonymousUser
from django.core.cache import cache

from audit.models import Event
from common.errors import RateLimited
from tenancy.entry import limits
from tenancy.services import apikey_create, tenant_limits_set
from tests.api.test_api_key_path import as_json, call_app
from tools.calls.submit import call_cancel
from tools.models import TERMINAL_STATUSES, ToolCall

pytestmark = pytest.mark.django_db

WINDOW_START = 1_800_000_000 - 1_800_000_000 % 60  # a minute's first second
NOW = WINDOW_START + 15  # 45 s left in the window


@pytest.fixture(autouse=True)
def frozen_window(monkeypatch):
    """The limits' clock stands still 15 s into a minute, so a test never straddles two windows."""
    cache.clear()
    clock = SimpleNamespace(time=lambda: NOW)
    monkeypatch.setattr(limits, "time", clock)
    return clock


def set_limits(tenant_world, **values):
    tenant_limits_set(tenant=tenant_world.tenant, **values)


def assert_rate_limited(response, *, retry_after: int):
    assert response.status_code == 429, response.content
    assert response["Retry-After"] == str(retry_after)
    error = response.json()["error"]
    assert error["code"] == "rate_limited"
    assert set(error) == {"code", "message", "fields"}
    return error["message"]


def new_agent_client(world, name: str):
    issued = apikey_create(tenant=world.a.tenant, name=name, scopes=["agent"])
    client = type(world.a.client())()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.key}")
    return client


# --- requests per minute ---------------------------------------------------------------------------

def test_a_key_past_its_requests_per_minute_gets_429_while_another_key_passes(world):
    set_limits(world.a, key_requests_per_minute=3)
    agent, other = world.a.client("agent"), world.a.client("locked")
    session_url = f"/api/v1/sessions/{world.a.session.pk}"
    for _ in range(3):
        assert agent.get(session_url).status_code == 200
    message = assert_rate_limited(agent.get(session_url), retry_after=45)
    assert "this API key may make 3 requests a minute" in message
    assert other.post("/api/v1/sessions", {"agent": "support-bot"}, format="json").status_code == 201
    assert world.b.client("agent").get(f"/api/v1/sessions/{world.b.session.pk}").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_the_lean_api_key_path_answers_429_with_retry_after(world):
    set_limits(world.a, key_requests_per_minute=1)
    url = f"/api/v1/sessions/{world.a.session.pk}"
    assert call_app("GET", url, key=world.a.keys["agent"])["status"] == 200
    refused = call_app("GET", url, key=world.a.keys["agent"])
    assert refused["status"] == 429 and refused["headers"]["retry-after"] == "45"
    assert as_json(refused)["error"]["code"] == "rate_limited"


def test_the_next_minute_opens_a_new_window(world, frozen_window):
    set_limits(world.a, key_requests_per_minute=1)
    agent = world.a.client("agent")
    assert agent.get("/api/v1/sessions/" + str(world.a.session.pk)).status_code == 200
    assert agent.get("/api/v1/sessions/" + str(world.a.session.pk)).status_code == 429
    frozen_window.time = lambda: NOW + 60
    assert agent.get("/api/v1/sessions/" + str(world.a.session.pk)).status_code == 200


def test_in_a_minute_s_last_second_the_retry_is_in_one_second(world, frozen_window):
    set_limits(world.a, key_requests_per_minute=1)
    tenant = type(world.a.tenant).objects.get(pk=world.a.tenant.pk)
    frozen_window.time = lambda: WINDOW_START + 59.5
    limits.requests_admit(tenant=tenant, api_key=world.a.key_objects["agent"])
    with pytest.raises(RateLimited) as refused:
        limits.requests_admit(tenant=tenant, api_key=world.a.key_objects["agent"])
    assert refused.value.retry_after == 1
    assert str(refused.value) == "Rate limit reached: this API key may make 1 requests a minute. Retry in 1 s."


def test_the_tenant_limit_counts_every_key(world):
    set_limits(world.a, key_requests_per_minute=0, tenant_requests_per_minute=4)
    agent, admin = world.a.client("agent"), world.a.client("admin")
    assert agent.get(f"/api/v1/sessions/{world.a.session.pk}").status_code == 200
    assert admin.get("/api/v1/tools").status_code == 200
    assert agent.get(f"/api/v1/sessions/{world.a.session.pk}").status_code == 200
    assert admin.get("/api/v1/tools").status_code == 200
    message = assert_rate_limited(admin.get("/api/v1/tools"), retry_after=45)
    assert "this tenant may make 4 requests a minute" in message
    assert_rate_limited(agent.get(f"/api/v1/sessions/{world.a.session.pk}"), retry_after=45)
    assert world.b.client("admin").get("/api/v1/tools").status_code == 200  # another tenant's count


def test_console_logins_are_limited_through_the_api_too(world):
    set_limits(world.a, key_requests_per_minute=2)
    console = world.a.console("operator")
    for _ in range(2):
        assert console.get("/api/v1/tools", HTTP_X_TENANT="acme").status_code == 200
    response = console.get("/api/v1/tools", HTTP_X_TENANT="acme")
    assert "your console login may make 2 requests a minute" in assert_rate_limited(response, retry_after=45)
    assert world.a.console("admin").get("/api/v1/tools", HTTP_X_TENANT="acme").status_code == 200


def test_every_admitted_request_counts_for_its_key_and_its_tenant_until_the_window_is_over(world, caplog):
    set_limits(world.a, key_requests_per_minute=2, tenant_requests_per_minute=100)
    tenant = type(world.a.tenant).objects.get(pk=world.a.tenant.pk)
    key = world.a.key_objects["agent"]
    store, window = limits.counter_store(), int(NOW // limits.WINDOW_S)
    counters = {"key": f"tk:rate:k{key.pk}:{window}", "tenant": f"tk:rate:t{tenant.pk}:{window}"}
    for admitted in (1, 2):  # the key's last request within its limit counts for the tenant too
        limits.requests_admit(tenant=tenant, api_key=key)
        assert {name: store.get(counter) for name, counter in counters.items()} == {"key": admitted,
                                                                                   "tenant": admitted}
    with pytest.raises(RateLimited):
        limits.requests_admit(tenant=tenant, api_key=key)
    assert {name: store.get(counter) for name, counter in counters.items()} == {"key": 3, "tenant": 2}
    assert "counter unavailable" not in caplog.text
    for counter in counters.values():  # kept past the window's end (COUNTER_TTL_S), not for ever
        expires = store._expire_info[store.make_and_validate_key(counter)]
        assert time.time() < expires <= time.time() + limits.COUNTER_TTL_S


def test_a_request_of_nobody_in_particular_counts_for_the_tenant_only(world):
    """No key and no login (or an anonymous one): there is no key's bucket to count, and no shared one."""
    set_limits(world.a, key_requests_per_minute=1, tenant_requests_per_minute=100)
    tenant = type(world.a.tenant).objects.get(pk=world.a.tenant.pk)
    for _ in range(3):
        limits.requests_admit(tenant=tenant)
        limits.requests_admit(tenant=tenant, user=AnonymousUser())
    assert limits.counter_store().get(f"tk:rate:t{tenant.pk}:{int(NOW // limits.WINDOW_S)}") == 6


def test_an_unreachable_counter_store_admits_the_request_and_says_so(world, monkeypatch, caplog):
    def unreachable(*args, **kwargs):
        raise ConnectionError("counter store down")

    monkeypatch.setattr(limits.counter_store(), "add", unreachable)
    set_limits(world.a, key_requests_per_minute=1, tenant_requests_per_minute=1)
    tenant = type(world.a.tenant).objects.get(pk=world.a.tenant.pk)
    with caplog.at_level(logging.WARNING, logger="toolkeeper.limits"):
        for _ in range(3):
            limits.requests_admit(tenant=tenant, api_key=world.a.key_objects["agent"])
    assert [(r.getMessage(), r.exc_info[0]) for r in caplog.records] == [
        ("rate limit counter unavailable; request admitted", ConnectionError)] * 3


def test_zero_means_no_limit(world):
    set_limits(world.a, key_requests_per_minute=0, tenant_requests_per_minute=0)
    agent = world.a.client("agent")
    for _ in range(30):
        assert agent.get(f"/api/v1/sessions/{world.a.session.pk}").status_code == 200


# --- calls in flight -------------------------------------------------------------------------------
# The calls endpoint does its database work on threads of its own, and the calls really run: these tests
# are transactional, and cancel what they left running.

def in_flight_test(test):
    return pytest.mark.django_db(transaction=True)(pytest.mark.usefixtures("drain_calls", "cancel_leftovers")(test))


@pytest.fixture
def cancel_leftovers(world):
    yield
    for tenant in (world.a.tenant, world.b.tenant):
        for call in ToolCall.objects.for_tenant(tenant).exclude(status__in=TERMINAL_STATUSES):
            call_cancel(call=call)


def new_session(client) -> str:
    """A session whose `ops` group (countdown, a slow tool) is active."""
    response = client.post("/api/v1/sessions", {"agent": "limits-bot"}, format="json")
    assert response.status_code == 201, response.content
    session = response.json()["id"]
    activated = client.post(f"/api/v1/sessions/{session}/calls",
                            {"name": "reset_tools", "input": {"ops": True}}, format="json")
    assert activated.json()["calls"][0]["status"] == "succeeded"
    return session


def submit(client, session: str, *calls: dict):
    return client.post(f"/api/v1/sessions/{session}/calls", {"calls": list(calls)}, format="json")


def slow(call_id: str) -> dict:
    return {"id": call_id, "name": "countdown", "input": {"seconds": 30}}


def calls_in(tenant) -> int:
    return ToolCall.objects.for_tenant(tenant).count()


@in_flight_test
def test_a_key_past_its_calls_in_flight_gets_429_and_the_batch_is_refused_whole(world):
    set_limits(world.a, key_calls_in_flight=3)
    agent = world.a.client("agent")
    session = new_session(agent)
    first = submit(agent, session, slow("a"), slow("b"))
    assert first.status_code == 200, first.content
    assert {c["status"] for c in first.json()["calls"]} <= {"queued", "running"}
    before = calls_in(world.a.tenant)
    message = assert_rate_limited(submit(agent, session, slow("c"), slow("d")), retry_after=2)
    assert "this API key has 2 calls received, queued or running, and may have 3" in message
    assert calls_in(world.a.tenant) == before  # nothing of the batch was recorded
    assert submit(agent, session, slow("c")).status_code == 200  # the last slot
    assert_rate_limited(submit(agent, session, slow("d")), retry_after=2)
    # Resending a call the session already has adds nothing, so it is answered as before.
    assert submit(agent, session, slow("a")).status_code == 200
    # Another key of the tenant has calls of its own.
    other = new_agent_client(world, "second agent")
    assert submit(other, new_session(other), slow("x")).status_code == 200
    # A finished call frees its slot.
    cancelled = agent.post(f"/api/v1/calls/{first.json()['calls'][0]['id']}/cancel")
    assert cancelled.json()["status"] in ("cancelled", "interrupted")
    assert submit(agent, session, slow("d")).status_code == 200


@in_flight_test
def test_the_tenant_limit_on_calls_in_flight_counts_every_key(world):
    set_limits(world.a, key_calls_in_flight=0, tenant_calls_in_flight=3)
    agent, other = world.a.client("agent"), new_agent_client(world, "second agent")
    session, other_session = new_session(agent), new_session(other)
    assert submit(agent, session, slow("a"), slow("b")).status_code == 200
    assert submit(other, other_session, slow("a")).status_code == 200
    message = assert_rate_limited(submit(other, other_session, slow("b")), retry_after=2)
    assert "this tenant has 3 calls received, queued or running, and may have 3" in message
    assert_rate_limited(submit(agent, session, slow("c")), retry_after=2)
    b_session = new_session(world.b.client("agent"))
    assert submit(world.b.client("agent"), b_session, slow("a")).status_code == 200


@in_flight_test
def test_calls_waiting_for_a_human_are_not_in_flight(world):
    from approvals.services import rule_create

    rule_create(tenant=world.a.tenant, behavior="ask", tool_pattern="countdown")
    set_limits(world.a, key_calls_in_flight=1)
    agent = world.a.client("agent")
    session = new_session(agent)
    for call_id in ("a", "b", "c"):
        response = submit(agent, session, slow(call_id))
        assert response.status_code == 200, response.content
        assert response.json()["calls"][0]["status"] == "awaiting_approval"


def test_calls_admit_asks_for_the_counts_only_when_a_limit_applies_to_new_calls():
    """The count of calls in flight is a query: not made for a batch that adds nothing or when no limit
    applies, and a key's limit is no limit for calls submitted without a key (a console login's)."""
    def not_counted():
        raise AssertionError("in_flight() called")

    tenant = SimpleNamespace(slug="t", key_calls_in_flight=1, tenant_calls_in_flight=1)
    key = object()
    for adding in (0, -1):  # nothing added: nothing refused, even with both limits already passed
        limits.calls_admit(tenant=tenant, api_key=key, adding=adding, in_flight=not_counted)
    no_limits = SimpleNamespace(slug="t", key_calls_in_flight=0, tenant_calls_in_flight=0)
    limits.calls_admit(tenant=no_limits, api_key=key, adding=5, in_flight=not_counted)
    key_limit_only = SimpleNamespace(slug="t", key_calls_in_flight=1, tenant_calls_in_flight=0)
    limits.calls_admit(tenant=key_limit_only, api_key=None, adding=5, in_flight=not_counted)
    with pytest.raises(RateLimited) as refused:
        limits.calls_admit(tenant=key_limit_only, api_key=key, adding=2, in_flight=lambda: (0, 0))
    assert refused.value.retry_after == limits.IN_FLIGHT_RETRY_S
    assert str(refused.value) == ("Too many calls in flight: this API key has 0 calls received, queued or running, "
                                  "and may have 1; this request adds 2. Retry when some have finished.")


# --- who sets the limits -------------------------------------------------------------------------

LIMITS_FORM = {"section": "limits", "key_requests_per_minute": "2", "tenant_requests_per_minute": "100",
               "key_calls_in_flight": "5", "tenant_calls_in_flight": "50"}


@pytest.mark.parametrize("role", ["admin", "operator"])
def test_operators_set_the_limits_in_the_console_and_they_take_effect(world, role):
    console = world.a.console(role)
    dashboard = console.get("/t/acme/").content.decode()
    assert 'href="/t/acme/settings/"' in dashboard  # reachable from the navigation
    page = console.get("/t/acme/settings/")
    assert page.status_code == 200 and 'name="key_requests_per_minute" value="60000"' in page.content.decode()
    response = console.post("/t/acme/settings/", LIMITS_FORM)
    assert response.status_code == 302, response.content.decode()[:2000]
    world.a.tenant.refresh_from_db()
    assert world.a.tenant.key_requests_per_minute == 2 and world.a.tenant.tenant_calls_in_flight == 50
    event = Event.objects.for_tenant(world.a.tenant).get(verb="tenant.limits_set")
    assert event.actor_label == world.a.users[role].username
    assert event.data == {"key_requests_per_minute": 2, "tenant_requests_per_minute": 100,
                          "key_calls_in_flight": 5, "tenant_calls_in_flight": 50}
    agent = world.a.client("agent")
    assert agent.get("/api/v1/tools").status_code == 403  # scope refusals are not counted...
    for _ in range(2):
        assert agent.get(f"/api/v1/sessions/{world.a.session.pk}").status_code == 200
    assert_rate_limited(agent.get(f"/api/v1/sessions/{world.a.session.pk}"), retry_after=45)


@pytest.mark.parametrize("role", ["reviewer", "viewer"])
def test_reviewers_and_viewers_cannot_change_the_limits(world, role):
    console = world.a.console(role)
    assert 'href="/t/acme/settings/"' not in console.get("/t/acme/").content.decode()
    assert console.get("/t/acme/settings/").status_code == 403
    assert console.post("/t/acme/settings/", LIMITS_FORM).status_code == 403
    patched = console.patch("/api/v1/limits", {"key_requests_per_minute": 1}, content_type="application/json",
                            HTTP_X_TENANT="acme")
    assert patched.status_code == 403
    world.a.tenant.refresh_from_db()
    assert world.a.tenant.key_requests_per_minute == 60_000
    assert not Event.objects.for_tenant(world.a.tenant).filter(verb="tenant.limits_set").exists()


def test_the_admin_api_reads_and_sets_the_limits(world):
    admin = world.a.client("admin")
    assert admin.get("/api/v1/limits").json() == {
        "key_requests_per_minute": 60_000, "tenant_requests_per_minute": 120_000,
        "key_calls_in_flight": 500, "tenant_calls_in_flight": 2_000}
    patched = admin.patch("/api/v1/limits", {"tenant_calls_in_flight": 10}, format="json")
    assert patched.status_code == 200 and patched.json()["tenant_calls_in_flight"] == 10
    assert patched.json()["key_calls_in_flight"] == 500  # the others as they were
    event = Event.objects.for_tenant(world.a.tenant).get(verb="tenant.limits_set")
    assert event.actor_label == "apikey:admin" and event.data == {"tenant_calls_in_flight": 10}
    bad = admin.patch("/api/v1/limits", {"key_calls_in_flight": -1, "tenant_calls_in_flight": "many"}, format="json")
    assert bad.status_code == 400 and set(bad.json()["error"]["fields"]) == {"key_calls_in_flight",
                                                                             "tenant_calls_in_flight"}
    assert world.a.client("agent").patch("/api/v1/limits", {"tenant_calls_in_flight": 0},
                                         format="json").status_code == 403
    world.b.tenant.refresh_from_db()
    assert world.b.tenant.tenant_calls_in_flight == 2_000


# --- the counters on Redis (the distributed mode's store), one round trip per request -------------

@pytest.fixture
def redis_counters(settings):
    url = getattr(settings, "TEST_REDIS_URL", None)
    if not url:
        pytest.skip("Redis is not reachable")
    prefix = f"limits-test-{time.time_ns()}"
    location = url.rsplit("/", 1)[0] + "/15"
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": location, "KEY_PREFIX": prefix}}
    yield limits.counter_store()
    # only this test's keys: clear() would flush the database under the counters of a test running in
    # another worker at the same moment
    client = redis.Redis.from_url(location)
    written = list(client.scan_iter(match=f"{prefix}:*"))
    if written:
        client.delete(*written)
    client.close()


def test_on_redis_a_request_refused_for_its_key_does_not_count_for_its_tenant(world, redis_counters):
    set_limits(world.a, key_requests_per_minute=2, tenant_requests_per_minute=100)
    tenant = type(world.a.tenant).objects.get(pk=world.a.tenant.pk)
    key = world.a.key_objects["agent"]
    limits.requests_admit(tenant=tenant, api_key=key)
    limits.requests_admit(tenant=tenant, api_key=key)
    with pytest.raises(RateLimited):
        limits.requests_admit(tenant=tenant, api_key=key)
    window = int(NOW // limits.WINDOW_S)
    assert redis_counters.get(f"tk:rate:k{key.pk}:{window}") == 3
    assert redis_counters.get(f"tk:rate:t{tenant.pk}:{window}") == 2  # the refused one is not the tenant's
    other = world.a.key_objects["admin"]
    limits.requests_admit(tenant=tenant, api_key=other)  # another key still gets in
    assert redis_counters.get(f"tk:rate:t{tenant.pk}:{window}") == 3
    stored = redis_counters.make_and_validate_key(f"tk:rate:t{tenant.pk}:{window}")
    assert 0 < redis_counters._cache.get_client(stored).ttl(stored) <= limits.COUNTER_TTL_S


def test_on_redis_the_counters_are_counted_by_the_script_not_by_add_and_incr(world, redis_counters, monkeypatch):
    """One round trip a request: the script counts every bucket; add and incr (two trips a bucket) stay unused."""
    used = []
    monkeypatch.setattr(redis_counters, "add", lambda *args, **kwargs: used.append("add"))
    monkeypatch.setattr(redis_counters, "incr", lambda *args, **kwargs: used.append("incr"))
    set_limits(world.a, key_requests_per_minute=1, tenant_requests_per_minute=100)
    tenant = type(world.a.tenant).objects.get(pk=world.a.tenant.pk)
    limits.requests_admit(tenant=tenant, api_key=world.a.key_objects["agent"])
    with pytest.raises(RateLimited):
        limits.requests_admit(tenant=tenant, api_key=world.a.key_objects["agent"])
    assert used == []


def test_a_cache_of_another_kind_counts_by_add_and_incr(world, settings, tmp_path):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
                                   "LOCATION": str(tmp_path / "counters")}}
    set_limits(world.a, key_requests_per_minute=1, tenant_requests_per_minute=100)
    tenant = type(world.a.tenant).objects.get(pk=world.a.tenant.pk)
    limits.requests_admit(tenant=tenant, api_key=world.a.key_objects["agent"])
    with pytest.raises(RateLimited):
        limits.requests_admit(tenant=tenant, api_key=world.a.key_objects["agent"])
    window = int(NOW // limits.WINDOW_S)
    assert limits.counter_store().get(f"tk:rate:k{world.a.key_objects['agent'].pk}:{window}") == 2


def test_on_redis_with_replicas_the_counters_are_written_to_the_primary(world, settings):
    """Django's Redis cache reads from the replicas (the locations after the first): a counter is a write."""
    url = getattr(settings, "TEST_REDIS_URL", None)
    if not url:
        pytest.skip("Redis is not reachable")
    base = url.rsplit("/", 1)[0]
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": [f"{base}/15", f"{base}/14"],
                                   "KEY_PREFIX": f"limits-test-{time.time_ns()}"}}
    store = limits.counter_store()
    try:
        tenant = type(world.a.tenant).objects.get(pk=world.a.tenant.pk)
        key = world.a.key_objects["agent"]
        limits.requests_admit(tenant=tenant, api_key=key)
        stored = store.make_and_validate_key(f"tk:rate:k{key.pk}:{int(NOW // limits.WINDOW_S)}")
        assert int(store._cache.get_client(write=True).get(stored)) == 1
    finally:
        store.clear()


def test_one_counter_store_per_process(world, redis_counters):
    assert limits.counter_store() is limits.counter_store()
    assert limits.counter_store() is redis_counters
