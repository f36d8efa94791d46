from django.contrib import admin
from django.db import models

from common.json_values import JSONValueField
from tenancy.models import ApiKey, Identity, Membership, Tenant


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "default_behavior", "max_parallel_calls", "created_at")
    search_fields = ("slug", "name")
    inlines = [MembershipInline]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "tenant", "prefix", "scopes", "agent", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "secret_hash", "created_at", "last_used_at")
    formfield_overrides = {models.JSONField: {"form_class": JSONValueField}}

    def get_queryset(self, request):
        return ApiKey.all_tenants.select_related("tenant")

    def has_add_permission(self, request):
        return False  # keys are issued from the console or `createapikey`, which show the secret once


@admin.register(Identity)
class IdentityAdmin(admin.ModelAdmin):
    """People's accounts at the OpenID provider: made and kept by their sign-ins (tenancy.signin)."""

    list_display = ("email", "user", "issuer", "subject", "last_sign_in_at")
    search_fields = ("email", "subject", "user__username")
    readonly_fields = ("user", "issuer", "subject", "email", "created_at", "last_sign_in_at")

    def has_add_permission(self, request):
        return False
