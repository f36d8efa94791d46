from django.contrib import admin

from audit.models import Event


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ("at", "tenant", "actor_label", "verb", "target")
    list_filter = ("verb",)
    search_fields = ("target", "actor_label")

    def get_queryset(self, request):
        return Event.all_tenants.select_related("tenant")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
