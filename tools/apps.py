from django.apps import AppConfig


class ToolsConfig(AppConfig):
    name = "tools"

    def ready(self):
        from django.conf import settings
        from django.db.models.signals import post_migrate

        from tenancy.signals import tenant_created

        from . import builtins, examples, sources  # noqa: F401  (registers the shipped Python tools)
        from .services import catalog_sync_all, tenant_seed_catalog

        tenant_created.connect(tenant_seed_catalog, dispatch_uid="tools.seed_catalog")
        if settings.TOOLKEEPER_EXECUTOR == "celery":
            from .registry import register_periodic
            from .worker import calls_dispatch_pending, calls_reap

            register_periodic("tools.reap", calls_reap, every_s=5)
            register_periodic("tools.dispatch_pending", calls_dispatch_pending, every_s=5)
        post_migrate.connect(catalog_sync_all, sender=self, dispatch_uid="tools.sync_catalog")
