"""Each reviewer's vote on a call's timeline, as the call's own event: "approved by … (edited)", with what the
edit changed. A log event, written with the vote (`post_save` of `Vote`, in the same transaction), so the call
page, the events API and the streams show it where it happened, before the status change it leads to."""
from approvals.models import VoteDecision
from common.json_values import input_changes
from tools.calls.events import call_event_append
from tools.models import EventKind

VERBS = {VoteDecision.APPROVE: "approved", VoteDecision.EDIT: "approved", VoteDecision.REJECT: "rejected",
         VoteDecision.RESPOND: "answered"}


def vote_on_timeline(sender, instance, created: bool, **kwargs) -> None:
    if not created:
        return
    call = instance.request.call
    text = f"{VERBS.get(instance.decision, instance.decision)} by {instance.reviewer_label}"
    data = {"text": text, "reviewer": instance.reviewer_label, "decision": instance.decision}
    if instance.decision == VoteDecision.EDIT:
        data["text"] = text + " (edited)"
        data["changes"] = [f"{sign} {name}: {value}" for sign, name, value in input_changes(call.input, instance.input)]
    call_event_append(call=call, kind=EventKind.LOG, data=data)
