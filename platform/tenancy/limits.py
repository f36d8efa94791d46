"""Rate limits per API key and per tenant: requests per minute and calls in flight.

One place for every entry point (the REST API through `RequestRateThrottle`, MCP and WebSockets by
calling `requests_admit` themselves). A refusal is `toolkeeper.errors.RateLimited`: 429 in the API's error envelope,
with `Retry-After` in seconds.

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

from django.core.cache import cache
from rest_framework.throttling import BaseThrottle

from toolkeeper.errors import RateLimited

from .models import ApiKey, Tenant

logger = logging.getLogger("toolkeeper.limits")

WINDOW_S = 60
# Past the window's end, so a counter never expires while its window is still counted.
COUNTER_TTL_S = 2 * WINDOW_S
# Nobody knows when a call in flight will finish; a short pause before retrying is the honest answer.
IN_FLIGHT_RETRY_S = 2


def _count_request(bucket: str, window: int) -> int:
    """Add one request to the bucket's counter for the window; returns the new count."""
    key = f"tk:rate:{bucket}:{window}"
    try:
        return cache.incr(key)
    except ValueError:  # the window's first request (or its counter expired)
        if cache.add(key, 1, timeout=COUNTER_TTL_S):
            return 1
        return cache.incr(key)  # another process added it first


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
            checks.append((f"k{api_key.pk}", tenant.key_requests_per_minute, "this API key"))
        elif user is not None and user.is_authenticated:
            checks.append((f"u{user.pk}", tenant.key_requests_per_minute, "your console login"))
    if tenant.tenant_requests_per_minute:
        checks.append((f"t{tenant.pk}", tenant.tenant_requests_per_minute, "this tenant"))
    for bucket, limit, whose in checks:
        try:
            count = _count_request(bucket, window)
        except Exception:  # any backend's connection error: admit (see above)
            logger.warning("rate limit counter unavailable; request admitted", exc_info=True)
            return
        if count > limit:
            wait = max(1, math.ceil((window + 1) * WINDOW_S - now))
            raise RateLimited(f"Rate limit reached: {whose} may make {limit} requests a minute. "
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
    for count, limit, whose in ((key_count, key_limit, "this API key"), (tenant_count, tenant_limit, "this tenant")):
        if limit and count + adding > limit:
            raise RateLimited(
                f"Too many calls in flight: {whose} has {count} calls received, queued or running, and may have "
                f"{limit}; this request adds {adding}. Retry when some have finished.", retry_after=IN_FLIGHT_RETRY_S)


class RequestRateThrottle(BaseThrottle):
    """DRF's hook for `requests_admit`: every API request with a tenant (API key or console login)."""

    def allow_request(self, request, view):
        tenant = getattr(request, "tenant", None)
        if tenant is None:
            return True  # not authenticated: refused elsewhere, counted nowhere
        api_key = request.auth if isinstance(request.auth, ApiKey) else None
        requests_admit(tenant=tenant, api_key=api_key, user=None if api_key else request.user)
        return True
