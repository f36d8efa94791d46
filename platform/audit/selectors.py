from .models import Event
from .services import event_digest


def audit_events(*, tenant, target: str | None = None):
    queryset = Event.objects.for_tenant(tenant)
    if target:
        queryset = queryset.filter(target=target)
    return queryset


def audit_verify(*, tenant) -> tuple[bool, int | None]:
    """Recompute the tenant's chain; returns (intact, id of the first broken event)."""
    prev_hash = ""
    for event in Event.objects.for_tenant(tenant).order_by("id").iterator():
        expected = event_digest(prev_hash=prev_hash, tenant_id=event.tenant_id, actor_label=event.actor_label,
                                verb=event.verb, target=event.target, data=event.data, at=event.at)
        if event.prev_hash != prev_hash or event.hash != expected:
            return False, event.pk
        prev_hash = event.hash
    return True, None
