from django.apps import AppConfig
from django.conf import settings


class ToolsConfig(AppConfig):
    name = "tools"

    def ready(self):
        from django.db.models.signals import m2m_changed, post_delete, post_migrate, post_save

        from tenancy.signals import tenant_created

        from . import builtins, examples, sources  # noqa: F401  (registers the shipped tools' sources)
        from .catalog import bump_on_change
        from .models import BoundArgument, McpServer, RedactionRule, Tool, ToolGroup
        from .plugins import plugins_load
        from .services import catalog_sync_all, tenant_seed_catalog

        tenant_created.connect(tenant_seed_catalog, dispatch_uid="tools.seed_catalog")
        # A server's tools leave the surface with it; redaction rules are cached under the same version.
        for model in (Tool, ToolGroup, BoundArgument, McpServer, RedactionRule):
            post_save.connect(bump_on_change, sender=model, dispatch_uid=f"tools.catalog.save.{model.__name__}")
            post_delete.connect(bump_on_change, sender=model, dispatch_uid=f"tools.catalog.delete.{model.__name__}")
        m2m_changed.connect(bump_on_change, sender=ToolGroup.tools.through, dispatch_uid="tools.catalog.members")
        post_migrate.connect(catalog_sync_all, sender=self, dispatch_uid="tools.sync_catalog")
        if not settings.TOOLKEEPER_MCP_HOST_PROCESS:  # after the shipped tools: a plugin cannot take their names
            # A tool process loads them too (quietly: its server has reported their problems).
            plugins_load(settings.TOOLKEEPER_TOOL_MODULES, report_errors=not settings.TOOLKEEPER_TOOL_PROCESS)
        # A tool process runs Python tools only (tools.isolation); the MCP host process only reaches servers.
        if not (settings.TOOLKEEPER_TOOL_PROCESS or settings.TOOLKEEPER_MCP_HOST_PROCESS):
            from . import http_tools  # noqa: F401  (registers the source of HTTP tools)
            from .mcp_servers import mcp_server_sync
            from .mcp_source import mcp_sync_register  # registers the source of MCP tools

            mcp_sync_register(sync=mcp_server_sync)  # periodically, and when a server says its tools changed
