from django.core.management.base import BaseCommand, CommandError

from audit.chain import audit_key
from audit.selectors import BROKEN, audit_check
from audit.services import audit_chain_sign
from tenancy.models import Tenant

EXIT_BROKEN = 1  # a chain is broken: the first bad entry is named
EXIT_UNCHECKED = 2  # a chain could not be vouched for: unsigned, or keyed and no key to check it with


class Command(BaseCommand):
    help = ("Verify the audit log's hash chains (every tenant's, or one): exits 0 when every chain is intact, "
            "1 naming the first bad entry of a broken chain, 2 when a chain is unsigned or cannot be verified "
            "without the audit key.")

    def add_arguments(self, parser):
        parser.add_argument("--tenant", metavar="SLUG", help="only this tenant's chain")
        parser.add_argument("--sign", action="store_true",
                            help="with TOOLKEEPER_AUDIT_KEY set: sign the head of each intact chain begun before the "
                                 "key was set, so that from now on it is checked as keyed")

    def handle(self, *args, tenant=None, sign=False, **options):
        if sign and not audit_key():
            raise CommandError("--sign needs the audit key: set TOOLKEEPER_AUDIT_KEY")
        tenants = Tenant.objects.order_by("slug")
        if tenant:
            tenants = tenants.filter(slug=tenant)
            if not tenants.exists():
                raise CommandError(f"no tenant {tenant!r}")
        failures = []
        for each in tenants.iterator():
            check = audit_chain_sign(tenant=each) if sign else audit_check(tenant=each)
            line = f"{each.slug}: {check.summary()}"
            self.stdout.write(line)
            if not check.intact:
                failures.append((check, line))
        if failures:
            worst = EXIT_BROKEN if any(check.status == BROKEN for check, _ in failures) else EXIT_UNCHECKED
            raise CommandError("; ".join(line for _, line in failures), returncode=worst)
