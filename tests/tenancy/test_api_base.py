"""The one sealed tenant-scoped API base (docs/architecture.md, PostHog)."""
import pytest
from django.urls import get_resolver
from rest_framework import viewsets

from tenancy.api.base import TenantModelViewSet, TenantScopedViewSet
from tools.api.serializers import GroupSerializer


@pytest.mark.parametrize("method", ["get_queryset", "get_object"])
def test_overriding_the_sealed_methods_is_a_type_error(method):
    with pytest.raises(TypeError, match=method):
        type("Leaky", (TenantModelViewSet,), {"serializer_class": GroupSerializer, method: lambda self: None})


def test_overriding_in_a_grandchild_is_refused_too():
    class Parent(TenantScopedViewSet):
        serializer_class = GroupSerializer

    with pytest.raises(TypeError):
        class Child(Parent):
            def get_queryset(self):
                return None


def test_safely_get_queryset_is_the_hook():
    class Fine(TenantModelViewSet):
        serializer_class = GroupSerializer

        def safely_get_queryset(self, queryset):
            return queryset.filter(switchable=True)

    assert Fine.safely_get_queryset is not TenantScopedViewSet.safely_get_queryset


def _callbacks(resolver=None):
    resolver = resolver or get_resolver()
    for entry in resolver.url_patterns:
        if hasattr(entry, "url_patterns"):
            yield from _callbacks(entry)
        else:
            yield entry.callback


def test_every_api_viewset_uses_the_sealed_base():
    viewset_classes = {cb.cls for cb in _callbacks() if getattr(cb, "actions", None)
                       and issubclass(getattr(cb, "cls", object), viewsets.ViewSetMixin)}
    assert viewset_classes
    for cls in viewset_classes:
        assert issubclass(cls, TenantScopedViewSet), cls
