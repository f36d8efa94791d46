from django.dispatch import Signal

# Sent after a tenant is created, inside its transaction: apps seed what a tenant needs.
tenant_created = Signal()
