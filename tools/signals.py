from django.dispatch import Signal

# Sent when a call is cancelled, inside the cancelling transaction (kwargs: call).
call_cancelled = Signal()

# Sent when a sync holds an upstream tool's changed (or new) definition for review, inside the sync's
# transaction (kwargs: tool, server, new).
tool_definition_proposed = Signal()
