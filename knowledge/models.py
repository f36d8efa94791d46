"""Knowledge bases: datasets of documents, chunked for full-text retrieval (docs/notes/knowledge-and-skills.md).

The full-text index lives beside `Chunk` and is created by the migrations for the database in
use (see `knowledge.fts`): an FTS5 table kept in sync by triggers on SQLite, a generated
`tsvector` column with a GIN index on PostgreSQL. Neither is part of the model: Django never
reads or writes it.
"""
from django.db import models

from tenancy.scoping import TenantOwned


class Dataset(TenantOwned):
    name = models.SlugField(max_length=100, help_text="Letters, digits, - and _. Bindings name datasets by it.")
    description = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="dataset_name_per_tenant")]

    def __str__(self):
        return self.name


class Document(TenantOwned):
    """One text in a dataset. `external_id` (defaulting to the title) identifies it for re-ingest."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="documents")
    external_id = models.CharField(max_length=255)
    title = models.CharField(max_length=300)
    text = models.TextField()
    metadata = models.JSONField(default=dict, blank=True)
    content_hash = models.CharField(max_length=64)
    chunk_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["title", "id"]
        constraints = [
            models.UniqueConstraint(fields=["dataset", "external_id"], name="document_external_id_per_dataset"),
        ]
        indexes = [models.Index(fields=["tenant", "dataset", "title"])]

    def __str__(self):
        return self.title


class Chunk(TenantOwned):
    """A retrieval unit: a slice of a document's text, with copies of what search filters on."""

    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chunks")
    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="+")
    ordinal = models.PositiveIntegerField()
    title = models.CharField(max_length=300)  # the document's title, indexed with a higher weight
    text = models.TextField()
    metadata = models.JSONField(default=dict, blank=True)  # a copy of the document's

    class Meta:
        ordering = ["document", "ordinal"]
        constraints = [models.UniqueConstraint(fields=["document", "ordinal"], name="chunk_ordinal_per_document")]
        indexes = [models.Index(fields=["tenant", "dataset"])]

    def __str__(self):
        return f"{self.title} #{self.ordinal}"
