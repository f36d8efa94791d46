from django.dispatch import Signal

# Sent when a call is cancelled, inside the cancelling transaction (kwargs: call).
call_cancelled = Signal()
