from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from tenancy.models import Tenant
from tenancy.services import tenant_create


class Command(BaseCommand):
    help = "Create a tenant, optionally with an existing user as its admin."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", default="")
        parser.add_argument("--admin", help="username of an existing user to make the tenant's admin")

    def handle(self, *args, slug, name, admin, **options):
        if Tenant.objects.filter(slug=slug).exists():
            raise CommandError(f"tenant {slug!r} already exists")
        user = None
        if admin:
            user = get_user_model().objects.filter(username=admin).first()
            if user is None:
                raise CommandError(f"no user named {admin!r}")
        tenant = tenant_create(slug=slug, name=name, admin=user)
        self.stdout.write(f"created tenant {tenant.slug}")
