from django.apps import AppConfig


class SkillsConfig(AppConfig):
    name = "skills"

    def ready(self):
        from django.db.models.signals import post_migrate

        from skills.mcp_resources import SkillResources
        from skills.meta import SkillLoader
        from skills.services import platform_skills_sync, platform_skills_sync_all
        from tenancy.signals import tenant_created
        from tools.catalog.registry import register_meta_provider, register_resource_provider

        register_meta_provider(SkillLoader())
        register_resource_provider(SkillResources())
        tenant_created.connect(lambda sender, tenant, **kw: platform_skills_sync(tenant=tenant), weak=False,
                               dispatch_uid="skills.platform_sync")
        post_migrate.connect(platform_skills_sync_all, sender=self, dispatch_uid="skills.platform_sync_all")
