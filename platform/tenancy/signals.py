from django.dispatch import Signal

# Sent after a tenant is created, inside its transaction: apps seed what a tenant needs.
tenant_created = Signal()

# Sent when a member leaves a tenant, inside the transaction that removes them: apps end what the person held
# there (their own accounts at upstream servers).
member_left = Signal()
