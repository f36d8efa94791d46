from django.apps import AppConfig
from django.conf import settings


class ToolsConfig(AppConfig):
    name = "tools"

    def ready(self):
        from django.db.models.signals import m2m_changed, post_delete, post_migrate, post_save

        from audit.selectors import CHAIN_WATCH_S, audit_chains_watch
        from common.tracing import tracing_setup
        from tenancy.signals import member_left, tenant_created, version_bumped
        from tools.calls.aftercare import RESULT_STEPS, Cap, Redact, ResultRules, Retry
        from tools.calls.pipeline import CALL_STEPS, Bind, Normalize, Validate
        from tools.calls.submit import Dispatch
        from tools.catalog.registry import register_periodic
        from tools.catalog.services import catalog_sync_all, tenant_seed_catalog
        from tools.catalog.snapshot import announce_on_bump, bump_on_change
        from tools.models import BoundArgument, McpServer, RedactionRule, Tool, ToolGroup, UpstreamPrompt
        from tools.python import builtins, examples, source  # noqa: F401  (registers the shipped tools' source)
        from tools.python.plugins import plugins_load

        # the call pipeline's steps and the steps after a tool ran that this app owns (docs/architecture.md)
        for position, step in ((100, Normalize), (200, Validate), (300, Bind), (600, ResultRules), (700, Dispatch)):
            CALL_STEPS.register(position, step)
        for position, step in ((100, Retry), (200, Redact), (300, Cap)):
            RESULT_STEPS.register(position, step)
        # Traces (docs/observability.md): on when the environment names an OTLP endpoint; a tool process runs no
        # call's machinery, so it never traces.
        if not settings.TOOLKEEPER_TOOL_PROCESS:
            tracing_setup(role="mcp-host" if settings.TOOLKEEPER_MCP_HOST_PROCESS else "server")
        tenant_created.connect(tenant_seed_catalog, dispatch_uid="tools.seed_catalog")
        # every tenant's audit chain, verified as it grows (toolkeeper_audit_chain_broken, docs/observability.md)
        register_periodic("audit.chain_watch", lambda: audit_chains_watch(), every_s=CHAIN_WATCH_S)
        # A server's tools leave the surface with it; redaction rules are cached under the same version; a server's
        # prompts are offered with its tools, and their changes are announced as the catalog's are.
        for model in (Tool, ToolGroup, BoundArgument, McpServer, RedactionRule, UpstreamPrompt):
            post_save.connect(bump_on_change, sender=model, dispatch_uid=f"tools.catalog.save.{model.__name__}")
            post_delete.connect(bump_on_change, sender=model, dispatch_uid=f"tools.catalog.delete.{model.__name__}")
        m2m_changed.connect(bump_on_change, sender=ToolGroup.tools.through, dispatch_uid="tools.catalog.members")
        # Any change of a tenant's configuration (its catalog, its rules) may change what its sessions see.
        version_bumped.connect(announce_on_bump, dispatch_uid="tools.catalog.surface")
        post_migrate.connect(catalog_sync_all, sender=self, dispatch_uid="tools.sync_catalog")
        if not settings.TOOLKEEPER_MCP_HOST_PROCESS:  # after the shipped tools: a plugin cannot take their names
            # A tool process loads them too (quietly: its server has reported their problems).
            plugins_load(settings.TOOLKEEPER_TOOL_MODULES, report_errors=not settings.TOOLKEEPER_TOOL_PROCESS)
        # A tool process runs Python tools only (tools.python.isolation); the MCP host process only reaches servers.
        if not (settings.TOOLKEEPER_TOOL_PROCESS or settings.TOOLKEEPER_MCP_HOST_PROCESS):
            from tools.accounts.vault import member_accounts_end
            from tools.catalog.registry import register_prompt_provider
            from tools.http_tools import services  # noqa: F401  (registers the source of HTTP tools)
            from tools.upstream.prompts import UpstreamPrompts
            from tools.upstream.servers import mcp_server_sync
            from tools.upstream.source import mcp_sync_register  # registers the source of MCP tools

            mcp_sync_register(sync=mcp_server_sync)  # periodically, and when a server says its tools changed
            register_prompt_provider(UpstreamPrompts())  # their prompts on /mcp/
            member_left.connect(member_accounts_end, dispatch_uid="tools.accounts.member_left")
