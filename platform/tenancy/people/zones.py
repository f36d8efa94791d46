"""Pages in the viewer's time zone: the one chosen on their profile, else the server's (UTC).

The zone's name is kept in the shared cache, so a page costs no query for it; saving a profile forgets it
(`zone_forget`).
"""
import zoneinfo

from django.core.cache import cache
from django.utils import timezone

from tenancy.models import Profile

ZONE_KEPT_S = 24 * 3600


def _key(user_id) -> str:
    return f"tk:zone:{user_id}"


def zone_forget(user_id) -> None:
    cache.delete(_key(user_id))


def zone_of(user) -> zoneinfo.ZoneInfo | None:
    if not getattr(user, "is_authenticated", False):
        return None
    name = cache.get(_key(user.pk))
    if name is None:
        name = Profile.objects.filter(user=user).values_list("time_zone", flat=True).first() or ""
        cache.set(_key(user.pk), name, ZONE_KEPT_S)
    try:
        return zoneinfo.ZoneInfo(name) if name else None
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):  # a zone the system no longer knows
        return None


class TimeZoneMiddleware:
    """After the session's user is known (console pages; API-key requests have their own middleware list)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        zone = zone_of(request.user)
        if zone is None:
            timezone.deactivate()
            return self.get_response(request)
        with timezone.override(zone):
            return self.get_response(request)
