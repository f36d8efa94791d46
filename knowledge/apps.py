from django.apps import AppConfig


class KnowledgeConfig(AppConfig):
    name = "knowledge"

    def ready(self):
        from django.db.models.signals import post_migrate

        from knowledge import tools  # noqa: F401  (registers knowledge_search with the Python tool source)
        from knowledge.services import knowledge_tool_seed, knowledge_tool_seed_all, search_index_create
        from tenancy.signals import tenant_created

        # After the tools app's own receivers (INSTALLED_APPS order): the tool is in the catalog by then.
        tenant_created.connect(lambda sender, tenant, **kw: knowledge_tool_seed(tenant=tenant), weak=False,
                               dispatch_uid="knowledge.seed_tool")
        tenant_created.connect(lambda sender, tenant, **kw: search_index_create(tenant=tenant), weak=False,
                               dispatch_uid="knowledge.search_index_create")
        post_migrate.connect(knowledge_tool_seed_all, sender=self, dispatch_uid="knowledge.seed_tool_all")
