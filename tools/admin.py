"""Django admin for superusers: the platform admin's view across every tenant.

Tenant-owned models fail closed on their default manager, so every queryset here (the change
lists, the inline, the choices of related fields) says explicitly that it spans tenants
(`Model.all_tenants`), and a form refuses to link rows of two different tenants.
"""
from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import models

from audit.services import audit_record
from common.errors import ServiceError
from common.json_values import JSONValueField
from common.secrets import secret_names
from tools.catalog.schemas import SchemaProblem, schema_check
from tools.models import AgentSession, BoundArgument, CallEvent, McpServer, Tool, ToolCall, ToolGroup
from tools.upstream.servers import FIELDS as MCP_SERVER_FIELDS
from tools.upstream.servers import SECRET_FIELDS, mcp_server_check, mcp_server_delete


def _spans_tenants(model) -> bool:
    return hasattr(model, "all_tenants")


class SameTenantForm(forms.ModelForm):
    """Every related tenant-owned row must belong to the row's own tenant."""

    def clean(self):
        cleaned = super().clean()
        tenant = cleaned.get("tenant") or getattr(self.instance, "tenant", None)
        if tenant is None:
            return cleaned
        for name, value in list(cleaned.items()):
            if name == "tenant" or value is None:
                continue
            related = list(value) if hasattr(value, "__iter__") and not isinstance(value, str | dict) else [value]
            foreign = [str(obj) for obj in related if getattr(obj, "tenant_id", tenant.pk) != tenant.pk]
            if foreign:
                self.add_error(name, ValidationError(f"belongs to another tenant: {', '.join(foreign)}"))
        return cleaned


class PlatformAdminMixin:
    """Superusers only; querysets and related choices across tenants."""

    form = SameTenantForm
    formfield_overrides = {models.JSONField: {"form_class": JSONValueField}}

    def has_module_permission(self, request):
        return request.user.is_active and request.user.is_superuser

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_superuser

    def has_add_permission(self, request, *args):
        return request.user.is_active and request.user.is_superuser

    def has_change_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_superuser

    def has_delete_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_superuser

    def get_queryset(self, request):
        queryset = self.model.all_tenants.all()
        ordering = self.get_ordering(request)
        return queryset.order_by(*ordering) if ordering else queryset

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if _spans_tenants(db_field.related_model):
            kwargs.setdefault("queryset", db_field.related_model.all_tenants.select_related("tenant"))
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def formfield_for_manytomany(self, db_field, request, **kwargs):
        if _spans_tenants(db_field.related_model):
            kwargs.setdefault("queryset", db_field.related_model.all_tenants.select_related("tenant"))
        return super().formfield_for_manytomany(db_field, request, **kwargs)


class ReadOnlyMixin:
    """Rows the pipeline writes: inspect and delete, never add or hand-edit."""

    def has_add_permission(self, request, *args):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class ToolForm(SameTenantForm):
    def clean_input_schema(self):
        schema = self.cleaned_data["input_schema"]
        try:
            schema_check(schema)
        except SchemaProblem as exc:
            raise ValidationError(f"the schema {exc}") from None
        return schema


@admin.register(Tool)
class ToolAdmin(PlatformAdminMixin, admin.ModelAdmin):
    form = ToolForm
    list_display = ("name", "tenant", "source", "read_only", "destructive", "idempotent", "concurrency_safe",
                    "timeout_s", "enabled")
    list_filter = ("source", "enabled", "read_only", "destructive")
    search_fields = ("name", "tenant__slug", "source_ref")
    list_select_related = ("tenant",)
    # a definition is accepted on the server's page (audited), never by editing these
    readonly_fields = ("pinned", "pinned_hash", "proposed", "proposed_hash", "proposed_at", "created_at", "updated_at")


@admin.register(ToolGroup)
class ToolGroupAdmin(PlatformAdminMixin, admin.ModelAdmin):
    list_display = ("name", "tenant", "default_active", "switchable", "skill_ref")
    list_filter = ("default_active", "switchable")
    search_fields = ("name", "tenant__slug")
    list_select_related = ("tenant",)
    filter_horizontal = ("tools",)


@admin.register(BoundArgument)
class BoundArgumentAdmin(PlatformAdminMixin, admin.ModelAdmin):
    list_display = ("tool", "name", "agent", "tenant", "created_at")
    search_fields = ("name", "agent", "tool__name", "tenant__slug")
    list_select_related = ("tenant", "tool")


@admin.register(AgentSession)
class AgentSessionAdmin(ReadOnlyMixin, PlatformAdminMixin, admin.ModelAdmin):
    list_display = ("id", "tenant", "agent", "user", "call_count", "created_at")
    search_fields = ("id", "agent", "user", "tenant__slug")
    list_select_related = ("tenant",)
    date_hierarchy = "created_at"


class CallEventInline(admin.TabularInline):
    model = CallEvent
    extra = 0
    can_delete = False
    fields = ("seq", "kind", "data", "at")
    readonly_fields = fields
    ordering = ("seq",)

    def get_queryset(self, request):
        return CallEvent.all_tenants.order_by("seq")

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_superuser


@admin.register(ToolCall)
class ToolCallAdmin(ReadOnlyMixin, PlatformAdminMixin, admin.ModelAdmin):
    list_display = ("created_at", "tenant", "tool_name", "call_id", "status", "attempts", "finished_at")
    list_filter = ("status",)
    search_fields = ("id", "call_id", "tool_name", "tenant__slug")
    list_select_related = ("tenant",)
    date_hierarchy = "created_at"
    inlines = [CallEventInline]


class McpServerForm(SameTenantForm):
    """Checked as the tenant's own forms are (outbound addresses, the stdio allow-list). Credentials are not
    fields at all: they are the tenant's, written through the console or the API, and never shown."""

    class Meta:
        model = McpServer
        fields = ("tenant", *(name for name in MCP_SERVER_FIELDS if name not in SECRET_FIELDS))
        field_classes = {"include": JSONValueField, "exclude": JSONValueField}

    def clean(self):
        cleaned = super().clean()
        tenant = cleaned.get("tenant") or getattr(self.instance, "tenant", None)
        if tenant is None:
            return cleaned
        instance = self.instance if self.instance.pk else None
        changes = {name: cleaned[name] for name in MCP_SERVER_FIELDS if name in cleaned}
        try:
            mcp_server_check(tenant, changes, instance=instance)
        except ServiceError as exc:
            for field, messages in exc.fields.items():
                self.add_error(field if field in self.fields else None, messages)
            for message in exc.messages:
                self.add_error(None, message)
        return cleaned


@admin.register(McpServer)
class McpServerAdmin(PlatformAdminMixin, admin.ModelAdmin):
    form = McpServerForm
    list_display = ("name", "tenant", "transport", "enabled", "trusted", "status", "last_synced_at")
    list_filter = ("transport", "enabled", "trusted", "status")
    search_fields = ("name", "tenant__slug", "url", "command")
    list_select_related = ("tenant",)
    readonly_fields = ("header_names", "env_names", "status", "last_error", "last_synced_at", "created_at",
                       "updated_at")

    @admin.display(description="headers (names only)")
    def header_names(self, server) -> str:
        return ", ".join(secret_names(server, "headers")) or "—"

    @admin.display(description="environment (names only)")
    def env_names(self, server) -> str:
        return ", ".join(secret_names(server, "env")) or "—"

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        audit_record(tenant=obj.tenant, actor=request.user, verb=f"mcp_server.{'updated' if change else 'created'}",
                     target=f"mcp_server:{obj.name}", data={"fields": sorted(form.changed_data), "via": "admin"})

    def delete_model(self, request, obj):
        mcp_server_delete(server=obj, actor=request.user)  # its tools disabled and kept, audited

    def delete_queryset(self, request, queryset):
        for server in queryset:
            mcp_server_delete(server=server, actor=request.user)
