"""The knowledge pages that create and delete, declared (tests/view_cases.py): datasets and documents."""
from knowledge.models import Dataset, Document
from knowledge.services import dataset_create, document_ingest
from tests.view_cases import ActionCases, CreateCases, DeleteCases


def _dataset(tw):
    return dataset_create(tenant=tw.tenant, name="handbook", description="Company handbook")


class TestDatasetCreate(CreateCases):
    url_name = "knowledge:dataset_create"
    model = Dataset
    audit_verb = "dataset.created"
    success_url = "knowledge:dataset_detail"
    success_params = (("dataset_id", "pk"),)

    def valid(self, world):
        return {"name": "runbooks", "description": "Ops"}, {"name": "runbooks", "description": "Ops"}

    def invalid(self, world):
        _dataset(world.a)
        return [({"name": "handbook"}, "exists"), ({"name": "not a slug"}, "Enter a valid"), ({"name": ""}, "required")]


class TestDatasetDelete(DeleteCases):
    url_name = "knowledge:dataset_delete"
    param = "dataset_id"
    model = Dataset
    audit_verb = "dataset.deleted"
    success_url = "knowledge:dataset_list"

    def target(self, tw):
        return _dataset(tw)


class TestDocumentDelete(ActionCases):
    url_name = "knowledge:document_delete"
    param = "document_id"
    model = Document
    audit_verb = "document.deleted"
    success_url = "knowledge:dataset_detail"
    success_params = (("dataset_id", "dataset_id"),)

    def target(self, tw):
        document_ingest(tenant=tw.tenant, dataset=_dataset(tw), title="Travel Policy", text="Book trains.")
        return Document.objects.for_tenant(tw.tenant).get(title="Travel Policy")
