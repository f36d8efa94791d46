"""The one tenant-scoped API base (docs/architecture.md).

`get_queryset` and `get_object` are sealed: a subclass customises `safely_get_queryset`, which
receives a queryset already limited to the request's tenant. Serializers never take the tenant
from the body; `perform_create` passes it in.
"""
from django.core.exceptions import ValidationError
from django.http import Http404
from rest_framework import mixins, viewsets

from tenancy.models import Scope


class TenantScopedViewSet(viewsets.GenericViewSet):
    required_scope = Scope.ADMIN
    model = None

    _sealed = ("get_queryset", "get_object")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in cls._sealed:
            if name in cls.__dict__:
                raise TypeError(f"{cls.__name__} must not override {name}; override safely_get_queryset")

    @property
    def tenant(self):
        return self.request.tenant

    def safely_get_queryset(self, queryset):
        return queryset

    def get_queryset(self):
        model = self.model or self.serializer_class.Meta.model
        if getattr(self, "swagger_fake_view", False):  # the schema generator has no tenant
            return model.all_tenants.none()
        return self.safely_get_queryset(model.objects.for_tenant(self.request.tenant))

    def get_object(self):
        queryset = self.filter_queryset(self.get_queryset())
        lookup = self.kwargs[self.lookup_url_kwarg or self.lookup_field]
        try:
            obj = queryset.get(**{self.lookup_field: lookup})
        except (queryset.model.DoesNotExist, ValueError, TypeError, ValidationError) as exc:
            raise Http404 from exc
        self.check_object_permissions(self.request, obj)
        return obj

    def get_serializer_context(self):
        context = super().get_serializer_context()
        context["tenant"] = getattr(self.request, "tenant", None)
        return context


class TenantModelViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    TenantScopedViewSet,
):
    """CRUD over a tenant-owned model."""
