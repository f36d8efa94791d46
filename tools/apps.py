from django.apps import AppConfig


class ToolsConfig(AppConfig):
    name = "tools"

    def ready(self):
        from django.db.models.signals import post_migrate

        from tenancy.signals import tenant_created

        from . import builtins, examples, sources  # noqa: F401  (registers the shipped Python tools)
        from .services import catalog_sync_all, tenant_seed_catalog

        tenant_created.connect(tenant_seed_catalog, dispatch_uid="tools.seed_catalog")
        post_migrate.connect(catalog_sync_all, sender=self, dispatch_uid="tools.sync_catalog")
