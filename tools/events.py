"""A call's state changes and progress: persisted as numbered CallEvents, broadcast after commit.

Every move of a call's status is a conditional UPDATE on the status it moves from, so two
actors (a worker and a cancel, two workers) can never both win.
"""
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from realtime.broadcast import publish_on_commit
from realtime.groups import calls_group, session_group

from .models import CallEvent, ToolCall


def call_event_append(*, call: ToolCall, kind: str, data: dict) -> CallEvent:
    with transaction.atomic():
        ToolCall.objects.for_tenant(call.tenant_id).filter(pk=call.pk).update(event_seq=F("event_seq") + 1)
        seq = ToolCall.objects.for_tenant(call.tenant_id).values_list("event_seq", flat=True).get(pk=call.pk)
        event = CallEvent.objects.create(
            tenant_id=call.tenant_id, call_id=call.pk, seq=seq, kind=kind, data=data, at=timezone.now(),
        )
        message = {
            "type": "call.event", "call": str(call.pk), "session": str(call.session_id), "seq": seq,
            "kind": kind, "data": data, "at": event.at.isoformat(),
        }
        publish_on_commit([session_group(call.tenant_id, call.session_id), calls_group(call.tenant_id)], message)
    return event


def call_transition(*, call: ToolCall, from_statuses, to_status: str, event_data: dict | None = None,
                    **fields) -> bool:
    """Move the call to `to_status` if it is still in one of `from_statuses`. Returns whether it moved."""
    from .models import TERMINAL_STATUSES

    if to_status in TERMINAL_STATUSES and "finished_at" not in fields:
        fields["finished_at"] = timezone.now()
    with transaction.atomic():
        moved = ToolCall.objects.for_tenant(call.tenant_id).filter(
            pk=call.pk, status__in=list(from_statuses)
        ).update(status=to_status, **fields)
        if not moved:
            return False
        call.status = to_status
        for name, value in fields.items():
            setattr(call, name, value)
        call_event_append(call=call, kind="status", data={"status": to_status, **(event_data or {})})
    return True
