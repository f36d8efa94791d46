"""The product's URLs plus the benchmark's floor endpoint (bench-only, not shipped)."""
from bench_floor import FloorView
from bench_schema import FLOOR_PATH
from django.urls import path

from toolkeeper.urls import urlpatterns as product_urlpatterns

urlpatterns = [
    path(FLOOR_PATH.lstrip("/"), FloorView.as_view(), name="bench-floor"),
    *product_urlpatterns,
]
