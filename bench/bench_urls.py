"""The product's URLs plus the benchmark's floor endpoint (bench-only, not shipped)."""
from bench_floor import FloorView
from django.urls import path

from toolkeeper.urls import urlpatterns as product_urlpatterns

urlpatterns = [
    path("bench/floor", FloorView.as_view(), name="bench-floor"),
    *product_urlpatterns,
]
