"""Pages in the viewer's time zone: the one chosen on their profile, else the server's (UTC)."""
import zoneinfo

from django.utils import timezone

from tenancy.models import Profile


def zone_of(user) -> zoneinfo.ZoneInfo | None:
    if not getattr(user, "is_authenticated", False):
        return None
    name = Profile.objects.filter(user=user).values_list("time_zone", flat=True).first()
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
