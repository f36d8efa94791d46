"""Console pages: datasets, uploads (good and bad), documents, the trial search, the tool's scope."""
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from knowledge.models import Dataset, Document
from knowledge.services import MAX_UPLOAD_BYTES
from tests.knowledge.conftest import B_SECRET, search_tool
from tools.catalog.selectors import bindings_for
from tools.models import BoundArgument

pytestmark = pytest.mark.django_db


def url(name, tenant="acme", **kwargs):
    return reverse(f"knowledge:{name}", kwargs={"tenant": tenant, **kwargs})


def upload(client, dataset, *files, metadata=""):
    return client.post(url("dataset_upload", dataset_id=dataset.pk), {"files": list(files), "metadata": metadata})


def test_pages_render_for_members(kb):
    doc = Document.objects.for_tenant(kb.world.a.tenant).get(title="VPN Setup Guide")
    viewer = kb.world.a.console("viewer")
    for page in (url("dataset_list"), url("dataset_detail", dataset_id=kb.handbook.pk),
                 url("document_detail", document_id=doc.pk), url("search"), url("bindings")):
        response = viewer.get(page)
        assert response.status_code == 200, page
        assert B_SECRET not in response.content.decode()
    detail = viewer.get(url("dataset_detail", dataset_id=kb.handbook.pk)).content.decode()
    assert "VPN Setup Guide" in detail and "Upload" not in detail  # viewers cannot upload


def test_upload_several_files_at_once(kb):
    client = kb.world.a.console("operator")
    response = upload(client, kb.handbook,
                      SimpleUploadedFile("vpn-faq.md", b"# VPN FAQ\n\nWhy is the tunnel slow?"),
                      SimpleUploadedFile("canteen.txt", "Caf\u00e9 menu: soup on Mondays.".encode()),
                      metadata='{"department": "facilities"}')
    assert response.status_code == 302
    docs = Document.objects.for_tenant(kb.world.a.tenant).filter(external_id__in=["vpn-faq.md", "canteen.txt"])
    assert {d.title for d in docs} == {"VPN FAQ", "canteen"}
    assert all(d.metadata == {"department": "facilities"} for d in docs)
    page = client.get(response["Location"]).content.decode()
    assert "2 file(s) ingested: 2 new" in page
    upload(client, kb.handbook, SimpleUploadedFile("canteen.txt", b"Soup on Tuesdays."))
    assert Document.objects.for_tenant(kb.world.a.tenant).get(external_id="canteen.txt").text == "Soup on Tuesdays."


@pytest.mark.parametrize(("bad", "message"), [
    (SimpleUploadedFile("photo.txt", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), "binary"),
    (SimpleUploadedFile("empty.md", b""), "empty"),
    (SimpleUploadedFile("big.txt", b"word " * (MAX_UPLOAD_BYTES // 5 + 1)), "too large"),
    (SimpleUploadedFile("report.pdf", b"%PDF-1.7"), "only text"),
])
def test_bad_uploads_are_refused_clearly_and_store_nothing(kb, bad, message):
    client = kb.world.a.console("operator")
    before = Document.objects.for_tenant(kb.world.a.tenant).count()
    response = upload(client, kb.handbook, SimpleUploadedFile("fine.txt", b"A perfectly good file."), bad)
    assert response.status_code == 400
    page = response.content.decode()
    assert "Nothing was stored" in page and message in page and bad.name in page
    assert Document.objects.for_tenant(kb.world.a.tenant).count() == before
    assert not Document.objects.for_tenant(kb.world.a.tenant).filter(external_id="fine.txt").exists()


def test_upload_without_files_or_with_bad_metadata(kb):
    client = kb.world.a.console("operator")
    assert "Choose at least one" in upload(client, kb.handbook).content.decode()
    response = upload(client, kb.handbook, SimpleUploadedFile("a.txt", b"x"), metadata="[1, 2]")
    assert response.status_code == 400 and "JSON object" in response.content.decode()


def test_trial_search_applies_the_agents_bindings(kb):
    a = kb.world.a
    client = a.console("operator")
    client.post(url("bindings"), {"agent": "hr-bot", "all_datasets": "on", "filter": '{"department": "hr"}'})
    everyone = client.get(url("search"), {"query": "VPN tunnel laptop", "agent": ""}).content.decode()
    hr = client.get(url("search"), {"query": "VPN tunnel laptop", "agent": "hr-bot"}).content.decode()
    assert "VPN Setup Guide" in everyone and "<mark>" in everyone
    assert "New Hire Onboarding" in hr and "VPN Setup Guide" not in hr
    assert "&quot;department&quot;: &quot;hr&quot;" in hr  # the scope applied is shown to operators
    error = client.get(url("search"), {"query": "the of and"}).content.decode()
    assert "no searchable words" in error


def test_scope_bindings_are_edited_through_bound_arguments(kb):
    a = kb.world.a
    client = a.console("operator")
    response = client.post(url("bindings"), {"agent": "finance-bot", "datasets": ["archive"], "filter": "{}"})
    assert response.status_code == 302
    tool = search_tool(a.tenant)
    assert bindings_for(a.tenant, "finance-bot", [tool.pk])[tool.pk] == {"datasets": ["archive"], "filter": {}}
    page = client.get(url("bindings")).content.decode()
    assert "finance-bot" in page
    refused = client.post(url("bindings"), {"agent": "x", "filter": '{"k": {"nested": 1}}'})
    assert refused.status_code == 400 and "Choose datasets" in refused.content.decode()
    client.post(url("bindings"), {"remove_agent": "finance-bot"})
    assert not BoundArgument.objects.for_tenant(a.tenant).filter(agent="finance-bot").exists()
    client.post(url("bindings"), {"remove_agent": ""})  # the tenant-wide scope is never removed
    assert BoundArgument.objects.for_tenant(a.tenant).filter(tool=tool, agent="").count() == 2
    assert a.console("viewer").post(url("bindings"), {"agent": "v", "all_datasets": "on"}).status_code == 403


def test_delete_document_and_dataset(kb):
    client = kb.world.a.console("operator")
    doc = Document.objects.for_tenant(kb.world.a.tenant).get(title="Travel Policy")
    assert client.post(url("document_delete", document_id=doc.pk)).status_code == 302
    assert not Document.objects.for_tenant(kb.world.a.tenant).filter(pk=doc.pk).exists()
    assert client.get(url("dataset_delete", dataset_id=kb.archive.pk)).status_code == 200
    assert client.post(url("dataset_delete", dataset_id=kb.archive.pk)).status_code == 302
    assert not Dataset.objects.for_tenant(kb.world.a.tenant).filter(pk=kb.archive.pk).exists()


def test_other_tenants_objects_are_404(kb):
    client = kb.world.a.console("admin")
    b_doc = Document.objects.for_tenant(kb.world.b.tenant).get()
    for name, kwargs, methods in (("dataset_detail", {"dataset_id": kb.b_handbook.pk}, ["get"]),
                                  ("dataset_upload", {"dataset_id": kb.b_handbook.pk}, ["post"]),
                                  ("dataset_delete", {"dataset_id": kb.b_handbook.pk}, ["get", "post"]),
                                  ("document_detail", {"document_id": b_doc.pk}, ["get"]),
                                  ("document_delete", {"document_id": b_doc.pk}, ["post"])):
        for tenant in ("acme", "globex"):
            for method in methods:
                response = getattr(client, method)(url(name, tenant=tenant, **kwargs))
                assert response.status_code == 404, (name, tenant, method)
                assert B_SECRET not in response.content.decode()
    for name in ("dataset_list", "search", "bindings", "dataset_create"):
        assert client.get(url(name, tenant="globex")).status_code == 404
    assert Document.objects.for_tenant(kb.world.b.tenant).count() == 1
