"""Ingest: idempotent re-ingest, all-or-nothing validation, batches with progress, the command."""
import io

import pytest
from django.core.management import CommandError, call_command

from common.errors import ServiceError
from knowledge.models import Chunk, Document
from knowledge.selectors import chunks_search
from knowledge.services import (
    MAX_UPLOAD_BYTES,
    FileRefused,
    dataset_create,
    document_from_file,
    document_ingest,
    documents_ingest_bulk,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def dataset(world):
    return dataset_create(tenant=world.a.tenant, name="policies")


def test_reingest_updates_the_document_in_place(world, dataset):
    tenant = world.a.tenant
    first = document_ingest(tenant=tenant, dataset=dataset, title="Remote work", text="Work from anywhere in spring.",
                            metadata={"department": "hr"})
    assert first.status == "created"
    again = document_ingest(tenant=tenant, dataset=dataset, title="Remote work", text="Work from anywhere in spring.",
                            metadata={"department": "hr"})
    assert again.status == "unchanged" and again.document.pk == first.document.pk
    updated = document_ingest(tenant=tenant, dataset=dataset, title="Remote work",
                              text="Work from the office on Tuesdays.", metadata={"department": "people"})
    assert updated.status == "updated" and updated.document.pk == first.document.pk
    assert Document.objects.for_tenant(tenant).filter(dataset=dataset).count() == 1
    document = Document.objects.for_tenant(tenant).get(pk=first.document.pk)
    assert document.text == "Work from the office on Tuesdays." and document.metadata == {"department": "people"}
    chunks = Chunk.objects.for_tenant(tenant).filter(document=document)
    assert [c.metadata for c in chunks] == [{"department": "people"}]
    assert chunks_search(tenant=tenant, query="spring") == []  # the old text left the index
    assert [h.document_id for h in chunks_search(tenant=tenant, query="Tuesdays office")] == [document.pk]


def test_external_id_identifies_a_document_whatever_its_title(world, dataset):
    tenant = world.a.tenant
    one = document_ingest(tenant=tenant, dataset=dataset, title="Draft", text="alpha", external_id="doc-7")
    two = document_ingest(tenant=tenant, dataset=dataset, title="Final title", text="beta", external_id="doc-7")
    assert one.document.pk == two.document.pk and two.status == "updated"
    assert Document.objects.for_tenant(tenant).get(pk=one.document.pk).title == "Final title"


def test_the_same_external_id_in_another_dataset_is_another_document(world, dataset):
    other = dataset_create(tenant=world.a.tenant, name="other")
    document_ingest(tenant=world.a.tenant, dataset=dataset, title="Same", text="one")
    document_ingest(tenant=world.a.tenant, dataset=other, title="Same", text="two")
    assert Document.objects.for_tenant(world.a.tenant).filter(title="Same").count() == 2


def test_bulk_validates_everything_first_and_stores_nothing_on_error(world, dataset):
    documents = [{"title": f"Doc {i}", "text": f"text number {i}"} for i in range(5)]
    documents.append({"title": "Empty", "text": "   "})
    documents.append({"title": "Doc 1", "text": "again"})
    with pytest.raises(ServiceError) as raised:
        documents_ingest_bulk(tenant=world.a.tenant, dataset=dataset, documents=documents)
    assert set(raised.value.detail) == {"documents[5].text", "documents[6].external_id"}
    assert not Document.objects.for_tenant(world.a.tenant).exists()


def test_bulk_runs_in_batches_and_reports_progress(world, dataset):
    documents = [{"title": f"Doc {i}", "text": f"Paragraph about topic {i}.\n\nMore words."} for i in range(25)]
    seen = []
    result = documents_ingest_bulk(tenant=world.a.tenant, dataset=dataset, documents=documents, batch_size=10,
                                   progress=lambda done, total: seen.append((done, total)))
    assert seen == [(10, 25), (20, 25), (25, 25)]
    assert result.batches == 3 and result.summary == {"created": 25, "updated": 0, "unchanged": 0}
    documents[3]["text"] = "changed"
    result = documents_ingest_bulk(tenant=world.a.tenant, dataset=dataset, documents=documents, batch_size=10)
    assert result.summary == {"created": 0, "updated": 1, "unchanged": 24}


def test_a_foreign_dataset_is_refused(world, dataset):
    foreign = dataset_create(tenant=world.b.tenant, name="b-data")
    with pytest.raises(ServiceError):
        documents_ingest_bulk(tenant=world.a.tenant, dataset=foreign, documents=[{"title": "x", "text": "y"}])
    assert not Document.objects.for_tenant(world.b.tenant).exists()


@pytest.mark.parametrize(("name", "data", "message"), [
    ("logo.png", b"\x89PNG\r\n", "only text"),
    ("blob.txt", b"abc\x00\x01\x02def", "binary"),
    ("latin.txt", "caf\u00e9".encode("latin-1"), "not UTF-8"),
    ("empty.md", b"", "empty"),
    ("blank.txt", b"  \n\n ", "empty"),
    ("huge.txt", b"a" * (MAX_UPLOAD_BYTES + 1), "too large"),
])
def test_files_that_are_not_documents_are_refused_clearly(name, data, message):
    with pytest.raises(FileRefused) as raised:
        document_from_file(name, data)
    assert message in str(raised.value) and name in str(raised.value)


def test_markdown_title_comes_from_its_first_heading():
    doc = document_from_file("guides/vpn.md", b"intro\n# VPN Setup Guide\n\nInstall it.")
    assert doc == {"title": "VPN Setup Guide", "text": "intro\n# VPN Setup Guide\n\nInstall it.",
                   "external_id": "guides/vpn.md"}
    assert document_from_file("notes.txt", b"\xef\xbb\xbfhello")["title"] == "notes"


def test_the_command_ingests_a_folder_with_progress_and_is_idempotent(world, dataset, tmp_path):
    (tmp_path / "sub").mkdir()
    for i in range(7):
        (tmp_path / f"note{i}.txt").write_text(f"Note {i} about onboarding.")
    (tmp_path / "sub" / "guide.md").write_text("# Guide\n\nHow to deploy.")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    (tmp_path / "empty.txt").write_text("")
    out, err = io.StringIO(), io.StringIO()
    call_command("ingest_documents", "acme", "policies", str(tmp_path), "--batch-size", "3",
                 "--metadata", "department=hr", stdout=out, stderr=err)
    output = out.getvalue()
    assert "3/8 documents" in output and "6/8 documents" in output and "8/8 documents (100%)" in output
    assert "8 created" in output
    assert "empty.txt: the file is empty" in err.getvalue()
    docs = Document.objects.for_tenant(world.a.tenant).filter(dataset=dataset)
    assert docs.count() == 8 and docs.get(external_id="sub/guide.md").title == "Guide"
    assert docs.get(external_id="note1.txt").metadata == {"department": "hr"}
    out = io.StringIO()
    call_command("ingest_documents", "acme", "policies", str(tmp_path), "--metadata", "department=hr", stdout=out,
                 stderr=io.StringIO())
    assert "0 created, 0 updated, 8 unchanged" in out.getvalue()


def test_the_command_refuses_unknown_tenants_and_datasets(world, tmp_path):
    with pytest.raises(CommandError, match="no tenant"):
        call_command("ingest_documents", "nope", "x", str(tmp_path))
    with pytest.raises(CommandError, match="--create"):
        call_command("ingest_documents", "acme", "missing", str(tmp_path))
    (tmp_path / "a.txt").write_text("hello")
    call_command("ingest_documents", "acme", "fresh", str(tmp_path), "--create", stdout=io.StringIO())
    assert Document.objects.for_tenant(world.a.tenant).filter(dataset__name="fresh").count() == 1
