import json

from django.core.management.base import BaseCommand, CommandError

from common.errors import ServiceError
from tenancy.models import Tenant
from tenancy.services import apikey_create


class Command(BaseCommand):
    help = "Issue an API key for a tenant. The key is printed once and stored only as a hash."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True)
        parser.add_argument("--scopes", default="agent", help="comma-separated: agent,external,admin")
        parser.add_argument("--agent", default="", help="lock the key to one agent name")
        parser.add_argument("--name", default="cli")
        parser.add_argument("--json", action="store_true", help='print {"key": ..., "id": ...}')

    def handle(self, *args, tenant, scopes, agent, name, json: bool, **options):
        tenant_obj = Tenant.objects.filter(slug=tenant).first()
        if tenant_obj is None:
            raise CommandError(f"no tenant {tenant!r}")
        try:
            issued = apikey_create(tenant=tenant_obj, name=name, agent=agent,
                                   scopes=[s.strip() for s in scopes.split(",") if s.strip()])
        except ServiceError as exc:
            raise CommandError(str(exc.detail)) from exc
        if json:
            self.stdout.write(_json_dumps({"key": issued.key, "id": issued.api_key.pk}))
        else:
            self.stdout.write(issued.key)


def _json_dumps(value) -> str:
    return json.dumps(value)
