"""Console routes. Parameter names are fixed (the cross-tenant URL-conf walk substitutes ids by name):
`tenant` (slug), `tool_id`, `group_id`, `binding_id`, `key_id`, `session_id`, `call_id`, `server_id`,
`redaction_rule_id`, `http_tool_id` (an HTTP tool's endpoint), `member_id` (a membership), `invitation_id`; what
each names is declared here for `tenant_view`."""
from django.urls import include, path

from audit import pages as audit_pages
from audit.pages import TargetLink, register_target_links
from console import views
from console.activity import pages as activity_pages
from tenancy.models import ApiKey, Invitation, Membership, OAuthGrant
from tenancy.people import pages as people_pages
from tenancy.web import register_url_objects
from tools.accounts import pages as account_pages
from tools.accounts import provider_pages
from tools.http_tools import pages as http_tool_pages
from tools.models import (
    AgentSession,
    BoundArgument,
    HttpEndpoint,
    McpServer,
    OAuthProvider,
    RedactionRule,
    Tool,
    ToolCall,
    ToolGroup,
)
from tools.python import pages as plugin_pages
from tools.redaction import pages as redaction_pages
from tools.upstream import pages as upstream_pages

app_name = "console"

register_url_objects({
    "tool_id": (Tool, "tool"),
    "group_id": (ToolGroup, "group"),
    "binding_id": (BoundArgument, "binding"),
    "key_id": (ApiKey, "api_key"),
    "session_id": (AgentSession, "session"),
    "call_id": (ToolCall, "call"),
    "server_id": (McpServer, "server"),
    "redaction_rule_id": (RedactionRule, "rule"),
    "http_tool_id": (HttpEndpoint, "endpoint"),
    "oauth_provider_id": (OAuthProvider, "provider"),
    "member_id": (Membership, "membership"),
    "invitation_id": (Invitation, "invitation"),
    "grant_id": (OAuthGrant, "grant"),
})

register_target_links({
    "tool": TargetLink(Tool, "name", "console:tool_detail", "tool_id"),
    "group": TargetLink(ToolGroup, "name", "console:group_edit", "group_id"),
    "apikey": TargetLink(ApiKey, "pk", "console:apikey_list", ""),
    "session": TargetLink(AgentSession, "pk", "console:session_detail", "session_id"),
    "call": TargetLink(ToolCall, "pk", "console:call_detail", "call_id"),
    "mcp_server": TargetLink(McpServer, "name", "console:mcp_server_detail", "server_id"),
    "redaction_rule": TargetLink(RedactionRule, "name", "console:redaction_rule_edit", "redaction_rule_id"),
    "oauth_provider": TargetLink(OAuthProvider, "name", "console:oauth_provider_edit", "oauth_provider_id"),
    "invitation": TargetLink(Invitation, "pk", "console:member_list", ""),
    "user": TargetLink(Membership, "user__username", "console:member_list", ""),
})

tenant_pages = [
    path("", views.dashboard, name="dashboard"),
    path("activity/", activity_pages.activity, name="activity"),
    path("tools/", views.tool_list, name="tool_list"),
    path("tools/<int:tool_id>/", views.tool_detail, name="tool_detail"),
    path("tools/<int:tool_id>/disable/", views.tool_disable, name="tool_disable"),
    path("tools/<int:tool_id>/add-to-group/", views.tool_group_add, name="tool_group_add"),
    path("tools/<int:tool_id>/try/", views.tool_try, name="tool_try"),
    path("http-tools/new/", http_tool_pages.http_tool_create, name="http_tool_create"),
    path("http-tools/<int:http_tool_id>/", http_tool_pages.http_tool_edit, name="http_tool_edit"),
    path("http-tools/<int:http_tool_id>/delete/", http_tool_pages.http_tool_delete, name="http_tool_delete"),
    path("tools/plugins/", plugin_pages.plugin_list, name="tool_plugins"),
    path("mcp-servers/", upstream_pages.mcp_server_list, name="mcp_server_list"),
    path("mcp-servers/new/", upstream_pages.mcp_server_create, name="mcp_server_create"),
    path("mcp-servers/<int:server_id>/", upstream_pages.mcp_server_detail, name="mcp_server_detail"),
    path("mcp-servers/<int:server_id>/edit/", upstream_pages.mcp_server_edit, name="mcp_server_edit"),
    path("mcp-servers/<int:server_id>/delete/", upstream_pages.mcp_server_delete, name="mcp_server_delete"),
    path("mcp-servers/<int:server_id>/sync/", upstream_pages.mcp_server_sync, name="mcp_server_sync"),
    path("mcp-servers/<int:server_id>/add-to-group/", upstream_pages.mcp_server_group_add,
         name="mcp_server_group_add"),
    path("mcp-servers/<int:server_id>/test/", upstream_pages.mcp_server_test, name="mcp_server_test"),
    path("tools/<int:tool_id>/definition/accept/", upstream_pages.tool_definition_accept,
         name="tool_definition_accept"),
    path("accounts/", account_pages.upstream_accounts, name="upstream_accounts"),
    path("accounts/<int:server_id>/connect/", account_pages.upstream_account_connect, name="upstream_account_connect"),
    path("accounts/<int:server_id>/disconnect/", account_pages.upstream_account_disconnect,
         name="upstream_account_disconnect"),
    path("accounts/http/<int:oauth_provider_id>/connect/", account_pages.provider_account_connect,
         name="provider_account_connect"),
    path("accounts/http/<int:oauth_provider_id>/disconnect/", account_pages.provider_account_disconnect,
         name="provider_account_disconnect"),
    path("oauth-providers/", provider_pages.provider_list, name="oauth_provider_list"),
    path("oauth-providers/new/", provider_pages.provider_create, name="oauth_provider_create"),
    path("oauth-providers/<int:oauth_provider_id>/", provider_pages.provider_edit, name="oauth_provider_edit"),
    path("oauth-providers/<int:oauth_provider_id>/delete/", provider_pages.provider_delete,
         name="oauth_provider_delete"),
    path("accounts/<int:server_id>/list-tools/", account_pages.upstream_account_list_tools,
         name="upstream_account_list_tools"),
    path("groups/", views.group_list, name="group_list"),
    path("groups/new/", views.group_create, name="group_create"),
    path("groups/<int:group_id>/", views.group_edit, name="group_edit"),
    path("groups/<int:group_id>/delete/", views.group_delete, name="group_delete"),
    path("bindings/", views.binding_list, name="binding_list"),
    path("bindings/new/", views.binding_create, name="binding_create"),
    path("bindings/<int:binding_id>/delete/", views.binding_delete, name="binding_delete"),
    path("keys/", views.apikey_list, name="apikey_list"),
    path("keys/new/", views.apikey_create, name="apikey_create"),
    path("keys/<int:key_id>/created/", views.apikey_created, name="apikey_created"),
    path("keys/<int:key_id>/revoke/", views.apikey_revoke, name="apikey_revoke"),
    path("search/", views.search, name="search"),
    path("sessions/", views.session_list, name="session_list"),
    path("sessions/<str:session_id>/", views.session_detail, name="session_detail"),
    path("calls/", views.call_list, name="call_list"),
    path("calls/<str:call_id>/", views.call_detail, name="call_detail"),
    path("calls/<str:call_id>/cancel/", views.call_cancel_page, name="call_cancel"),
    path("confirmations/", views.confirmations, name="confirmations"),
    path("confirmations/<str:call_id>/", views.confirmation_answer, name="confirmation_answer"),
    path("settings/", views.tenant_settings, name="tenant_settings"),
    path("audit/", audit_pages.audit_log, name="audit_log"),
    path("audit/export.csv", audit_pages.audit_export_csv, name="audit_export_csv"),
    path("audit/export.jsonl", audit_pages.audit_export_jsonl, name="audit_export_jsonl"),
    path("members/", people_pages.member_list, name="member_list"),
    path("members/<int:member_id>/role/", people_pages.member_role, name="member_role"),
    path("members/<int:member_id>/remove/", people_pages.member_remove, name="member_remove"),
    path("members/invitations/<int:invitation_id>/", people_pages.invitation_created, name="invitation_created"),
    path("members/invitations/<int:invitation_id>/revoke/", people_pages.invitation_revoke,
         name="invitation_revoke"),
    path("members/clients/<int:grant_id>/disconnect/", people_pages.client_disconnect, name="client_disconnect"),
    path("tools/<int:tool_id>/result-steps/", redaction_pages.tool_result_steps, name="tool_result_steps"),
    path("redaction-rules/", redaction_pages.redaction_rule_list, name="redaction_rule_list"),
    path("redaction-rules/new/", redaction_pages.redaction_rule_create, name="redaction_rule_create"),
    path("redaction-rules/<int:redaction_rule_id>/", redaction_pages.redaction_rule_edit, name="redaction_rule_edit"),
    path("redaction-rules/<int:redaction_rule_id>/delete/", redaction_pages.redaction_rule_delete,
         name="redaction_rule_delete"),
]

urlpatterns = [
    path("", views.home, name="home"),

    path("t/<slug:tenant>/", include(tenant_pages)),
]
