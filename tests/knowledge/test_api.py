"""/api/v1/datasets and /api/v1/documents, mounted here the way the platform's URL conf will include them."""
import pytest
from django.urls import include, path

from knowledge.models import Dataset, Document
from tests.knowledge.conftest import B_SECRET

urlpatterns = [path("api/v1/", include("knowledge.api.urls"))]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


def test_dataset_crud(world):
    client = world.a.client("admin")
    created = client.post("/api/v1/datasets", {"name": "runbooks", "description": "Ops"}, format="json")
    assert created.status_code == 201, created.content
    dataset_id = created.json()["id"]
    assert client.post("/api/v1/datasets", {"name": "runbooks"}, format="json").status_code == 400
    listed = client.get("/api/v1/datasets").json()["results"]
    assert [d["name"] for d in listed] == ["runbooks"] and listed[0]["document_count"] == 0
    patched = client.patch(f"/api/v1/datasets/{dataset_id}", {"description": "Operations"}, format="json")
    assert patched.status_code == 200 and patched.json()["description"] == "Operations"
    assert client.delete(f"/api/v1/datasets/{dataset_id}").status_code == 204
    assert not Dataset.objects.for_tenant(world.a.tenant).exists()


def test_bulk_documents_then_list_retrieve_delete(world):
    client = world.a.client("admin")
    client.post("/api/v1/datasets", {"name": "handbook"}, format="json")
    body = [{"dataset": "handbook", "title": f"Doc {i}", "text": f"Text {i}", "metadata": {"department": "hr"}}
            for i in range(3)]
    response = client.post("/api/v1/documents", body, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert (data["created"], data["updated"], data["unchanged"], data["batches"]) == (3, 0, 0, 1)
    assert [d["status"] for d in data["documents"]] == ["created"] * 3
    body[0]["text"] = "Changed"
    again = client.post("/api/v1/documents", body, format="json").json()
    assert (again["created"], again["updated"], again["unchanged"]) == (0, 1, 2)
    single = client.post("/api/v1/documents", {"dataset": "handbook", "title": "One", "text": "x"}, format="json")
    assert single.status_code == 201
    listed = client.get("/api/v1/documents", {"dataset": "handbook"}).json()
    assert listed["count"] == 4 and "text" not in listed["results"][0]
    doc_id = data["documents"][0]["id"]
    detail = client.get(f"/api/v1/documents/{doc_id}").json()
    assert detail["text"] == "Changed" and detail["dataset"] == "handbook"
    assert client.delete(f"/api/v1/documents/{doc_id}").status_code == 204
    assert Document.objects.for_tenant(world.a.tenant).count() == 3


def test_bad_bulk_bodies_store_nothing(world):
    client = world.a.client("admin")
    client.post("/api/v1/datasets", {"name": "handbook"}, format="json")
    for body, field in (
        ([{"dataset": "handbook", "title": "ok", "text": "fine"}, {"dataset": "handbook", "title": "x", "text": ""}],
         "documents[1]"),
        ([{"dataset": "handbook", "title": "ok", "text": "fine"}, {"dataset": "nope", "title": "x", "text": "y"}],
         "documents[1].dataset"),
        ([{"dataset": "handbook", "title": "ok", "text": "a\x00b"}], "text"),
    ):
        response = client.post("/api/v1/documents", body, format="json")
        assert response.status_code == 400, response.content
        error = response.json()["error"]
        # NUL characters may already be refused by the API's JSON parser, before any field is looked at.
        assert any(field in key for key in error["fields"]) or "NUL" in error["message"], error
    assert client.post("/api/v1/documents", [], format="json").status_code == 400
    assert not Document.objects.for_tenant(world.a.tenant).exists()


def test_other_tenants_ids_and_names_are_not_found(world):
    b_dataset = Dataset.objects.create(tenant=world.b.tenant, name="secret")
    b_client = world.b.client("admin")
    b_client.post("/api/v1/documents", [{"dataset": "secret", "title": "B doc", "text": B_SECRET}], format="json")
    b_doc = Document.objects.for_tenant(world.b.tenant).get()
    client = world.a.client("admin")
    for url in (f"/api/v1/datasets/{b_dataset.pk}", f"/api/v1/documents/{b_doc.pk}"):
        for method in ("get", "delete"):
            response = getattr(client, method)(url)
            assert response.status_code == 404 and set(response.json()) == {"error"}
    assert client.patch(f"/api/v1/datasets/{b_dataset.pk}", {"name": "x"}, format="json").status_code == 404
    response = client.post("/api/v1/documents", [{"dataset": "secret", "title": "t", "text": "x"}], format="json")
    assert response.status_code == 400
    for url in ("/api/v1/datasets", "/api/v1/documents", "/api/v1/documents?dataset=secret"):
        body = client.get(url).content.decode()
        assert B_SECRET not in body and "secret" not in body
    assert Document.objects.for_tenant(world.b.tenant).count() == 1
    assert Dataset.objects.for_tenant(world.b.tenant).get().name == "secret"


def test_scopes_and_roles(world):
    assert world.a.client("agent").get("/api/v1/datasets").status_code == 403
    from rest_framework.test import APIClient

    console = APIClient()
    console.force_login(world.a.users["viewer"])
    assert console.get("/api/v1/datasets", HTTP_X_TENANT="acme").status_code == 200
    assert console.post("/api/v1/datasets", {"name": "x"}, format="json", HTTP_X_TENANT="acme").status_code == 403
