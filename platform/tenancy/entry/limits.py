"""Rate limits per API key and per tenant: requests per minute and calls in flight.

Requests are counted for every entry by `tenancy.entry.admission.admit` (the REST API, `/mcp/`, WebSocket connects,
the console's changes); calls in flight by the call services. A refusal is `common.errors.RateLimited`:
429 in the API's error envelope, with `Retry-After` in seconds.

Requests are counted in fixed one-minute windows in Django's cache: in-process memory in the embedded
mode, Redis in the distributed mode, so every server process counts into the same window. A console
user's API requests count against the tenant and, in place of a key's, against a bucket of their own.
Calls in flight are counted in the database (shared by every process) when calls are submitted.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from functools import cache

from django.conf import settings
from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.signals import setting_changed
from django.dispatch import receiver

from common import metrics
from common.errors import RateLimited
from tenancy.models import ApiKey, Tenant

logger = logging.getLogger("toolkeeper.limits")

WINDOW_S = 60
# Past the window's end, so a counter never expires while its window is still counted.
COUNTER_TTL_S = 2 * WINDOW_S
# Nobody knows when a call in flight will finish; a short pause before retrying is the honest answer.
IN_FLIGHT_RETRY_S = 2


@cache
def counter_store():
    """One cache object per process for the counters. Django's `cache` proxy builds one per thread and
    context, each with a Redis connection pool of its own: profiled, that was a new Redis connection for
    most requests of a server process."""
    return caches.create_connection(DEFAULT_CACHE_ALIAS)


@receiver(setting_changed)
def _forget_counter_store(*, setting, **kwargs) -> None:
    if setting == "CACHES":
        counter_store.cache_clear()


# Counts the buckets in order and stops at the first one past its limit, so a request refused for its key
# never counts against its tenant: KEYS the counters, ARGV[1] their expiry, ARGV[2…] their limits.
COUNT_SCRIPT = """
local counts = {}
for i, key in ipairs(KEYS) do
  redis.call('SET', key, 0, 'EX', ARGV[1], 'NX')
  counts[i] = redis.call('INCR', key)
  if counts[i] > tonumber(ARGV[i + 1]) then break end
end
return counts
"""


@cache
def _count_script(store):
    """The script, registered once per counter store (run by its SHA, sent again only if Redis lost it)."""
    return store._cache.get_client(write=True).register_script(COUNT_SCRIPT)


def _count_requests(buckets: list[tuple[str, int]], window: int) -> list[int]:
    """Add one request to each (bucket, limit)'s counter for the window, in order, up to the first that goes
    past its limit; returns the new counts so far. On Redis in one round trip (a script)."""
    store = counter_store()
    keys = [f"tk:rate:{bucket}:{window}" for bucket, _ in buckets]
    redis_client = getattr(getattr(store, "_cache", None), "get_client", None)
    if redis_client is not None:
        return list(_count_script(store)(keys=[store.make_and_validate_key(key) for key in keys],
                                         args=[COUNTER_TTL_S, *(limit for _, limit in buckets)],
                                         client=redis_client(write=True)))
    counts = []
    for key, (_, limit) in zip(keys, buckets, strict=True):
        if store.add(key, 1, timeout=COUNTER_TTL_S):  # the window's first request (or its counter expired)
            counts.append(1)
        else:
            counts.append(store.incr(key))
        if counts[-1] > limit:
            break
    return counts


def requests_admit(*, tenant: Tenant, api_key: ApiKey | None = None, user=None) -> None:
    """Count one request of the key (or console user) and of the tenant; RateLimited past either limit.

    If the counter store cannot be reached the request is let through: an outage of the cache must not
    take the API down with it.
    """
    now = time.time()
    window = int(now // WINDOW_S)
    checks = []
    if tenant.key_requests_per_minute:
        if api_key is not None:
            checks.append((f"k{api_key.pk}", tenant.key_requests_per_minute, "this API key", "key_requests"))
        elif user is not None and user.is_authenticated:
            checks.append((f"u{user.pk}", tenant.key_requests_per_minute, "your console login", "key_requests"))
    if tenant.tenant_requests_per_minute:
        checks.append((f"t{tenant.pk}", tenant.tenant_requests_per_minute, "this tenant", "tenant_requests"))
    if not checks:
        return
    try:
        counts = _count_requests([(bucket, limit) for bucket, limit, _, _ in checks], window)
    except Exception:  # any backend's connection error: admit (see above)
        logger.warning("rate limit counter unavailable; request admitted", exc_info=True)
        return
    for (_, limit, whose, kind), count in zip(checks, counts, strict=False):  # counts stop at a refusal
        if count > limit:
            metrics.rate_limit_refused(tenant=tenant.slug, limit=kind)
            wait = max(1, math.ceil((window + 1) * WINDOW_S - now))
            raise RateLimited(f"Rate limit reached: {whose} may make {limit} requests a minute. "
                              f"Retry in {wait} s.", retry_after=wait)


def address_admit(*, address: str) -> None:
    """Count one request from a network address to an entry that comes before any tenant (the OAuth endpoints,
    which anyone may reach); RateLimited past `TOOLKEEPER_ADDRESS_REQUESTS_PER_MINUTE`. Like `requests_admit`,
    an unreachable counter store lets the request through."""
    limit = settings.TOOLKEEPER_ADDRESS_REQUESTS_PER_MINUTE
    if not limit:
        return
    now = time.time()
    window = int(now // WINDOW_S)
    try:
        (count,) = _count_requests([(f"a{address[:64]}", limit)], window)
    except Exception:
        logger.warning("rate limit counter unavailable; request admitted", exc_info=True)
        return
    if count > limit:
        metrics.rate_limit_refused(tenant=metrics.NO_TENANT, limit="address_requests")
        wait = max(1, math.ceil((window + 1) * WINDOW_S - now))
        raise RateLimited(f"Rate limit reached: this address may make {limit} such requests a minute. "
                          f"Retry in {wait} s.", retry_after=wait)


def calls_admit(*, tenant: Tenant, api_key: ApiKey | None, adding: int,
                in_flight: Callable[[], tuple[int, int]]) -> None:
    """Refuse (RateLimited) a batch of `adding` new calls that would take the tenant's or the key's calls
    in flight past its limit; the batch is refused as a whole.

    `in_flight()` returns (the tenant's calls in flight, the key's); it is called only when a limit
    applies. Calls waiting for a human are not in flight: they hold no executor, and the requests
    limit bounds how fast an agent can queue them.
    """
    key_limit = tenant.key_calls_in_flight if api_key is not None else 0
    tenant_limit = tenant.tenant_calls_in_flight
    if adding <= 0 or not (key_limit or tenant_limit):
        return
    tenant_count, key_count = in_flight()
    for count, limit, whose, kind in ((key_count, key_limit, "this API key", "key_calls_in_flight"),
                                      (tenant_count, tenant_limit, "this tenant", "tenant_calls_in_flight")):
        if limit and count + adding > limit:
            metrics.rate_limit_refused(tenant=tenant.slug, limit=kind)
            raise RateLimited(
                f"Too many calls in flight: {whose} has {count} calls received, queued or running, and may have "
                f"{limit}; this request adds {adding}. Retry when some have finished.", retry_after=IN_FLIGHT_RETRY_S)
