from django.dispatch import Signal

# Sent after a tenant is created, inside its transaction: apps seed what a tenant needs.
tenant_created = Signal()

# Sent when a member leaves a tenant, inside the transaction that removes them: apps end what the person held
# there (their own accounts at upstream servers).
member_left = Signal()

# Sent when a tenant's configuration of one kind changes (`tenancy.versions.version_bump`, inside the writer's
# transaction; sender: the version model): apps tell what hears of such changes, after commit.
version_bumped = Signal()
