"""Console pages, mounted at /t/<tenant>/knowledge/. Parameters: `tenant` (slug), `dataset_id`, `document_id`;
what each names is declared here for `tenant_view`."""
from django.urls import path

from audit.pages import TargetLink, register_target_links
from knowledge import views
from knowledge.models import Dataset, Document
from tenancy.web import register_url_objects

app_name = "knowledge"

register_url_objects({"dataset_id": (Dataset, "dataset"), "document_id": (Document, "document")})
register_target_links({"dataset": TargetLink(Dataset, "name", "knowledge:dataset_detail", "dataset_id")})

urlpatterns = [
    path("", views.dataset_list, name="dataset_list"),
    path("datasets/new/", views.dataset_create, name="dataset_create"),
    path("datasets/<int:dataset_id>/", views.dataset_detail, name="dataset_detail"),
    path("datasets/<int:dataset_id>/upload/", views.dataset_upload, name="dataset_upload"),
    path("datasets/<int:dataset_id>/delete/", views.dataset_delete, name="dataset_delete"),
    path("documents/<int:document_id>/", views.document_detail, name="document_detail"),
    path("documents/<int:document_id>/delete/", views.document_delete, name="document_delete"),
    path("search/", views.search, name="search"),
    path("bindings/", views.bindings, name="bindings"),
]
