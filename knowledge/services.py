"""Writes: datasets, document ingest (idempotent, batched), deletes, and the tool's default scope."""
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePath

from django.db import connection, transaction
from django.utils import timezone

from audit.services import audit_record
from common.errors import ServiceError
from common.json_values import json_problem
from knowledge import fts
from knowledge.chunking import chunk_text
from knowledge.models import Chunk, Dataset, Document
from tenancy.fastread import tables_exist
from tenancy.models import Tenant
from tools.catalog.services import binding_set
from tools.models import BoundArgument, Tool, ToolGroup

TOOL_NAME = "knowledge_search"
TOOL_GROUP = "knowledge"
# The scope knowledge_search gets when nothing more specific is bound: every dataset of the
# tenant, no metadata filter. Seeded as tenant-wide bindings so neither argument is ever in the
# schema a model sees; an agent's own binding narrows it.
DEFAULT_BINDINGS = {"datasets": "*", "filter": {}}

MAX_TITLE_CHARS = 300
MAX_EXTERNAL_ID_CHARS = 255
MAX_DOCUMENT_CHARS = 1_000_000
MAX_UPLOAD_BYTES = 1024 * 1024
MAX_METADATA_BYTES = 8 * 1024
BATCH_SIZE = 100
TEXT_SUFFIXES = (".txt", ".md", ".markdown")

Progress = Callable[[int, int], None]


# --- datasets ----------------------------------------------------------------------------------

def _check_dataset_name(tenant, name: str, instance=None) -> None:
    if not re.fullmatch(r"[-a-zA-Z0-9_]{1,100}", name or ""):
        raise ServiceError({"name": ["1-100 letters, digits, '-' or '_'"]})
    clash = Dataset.objects.for_tenant(tenant).filter(name=name)
    if instance is not None:
        clash = clash.exclude(pk=instance.pk)
    if clash.exists():
        raise ServiceError({"name": [f"a dataset named {name!r} exists"]})


def dataset_create(*, tenant, name: str, description: str = "", actor=None) -> Dataset:
    _check_dataset_name(tenant, name)
    dataset = Dataset.objects.create(tenant=tenant, name=name, description=description)
    audit_record(tenant=tenant, actor=actor, verb="dataset.created", target=f"dataset:{name}")
    return dataset


def dataset_update(*, dataset: Dataset, actor=None, **changes) -> Dataset:
    unknown = set(changes) - {"name", "description"}
    if unknown:
        raise ServiceError({name: ["cannot be changed"] for name in sorted(unknown)})
    if "name" in changes:
        _check_dataset_name(dataset.tenant_id, changes["name"], instance=dataset)
    for key, value in changes.items():
        setattr(dataset, key, value)
    dataset.save()
    audit_record(tenant=dataset.tenant, actor=actor, verb="dataset.updated", target=f"dataset:{dataset.name}",
                 data={k: v for k, v in changes.items() if k == "name"})
    return dataset


@transaction.atomic
def dataset_delete(*, dataset: Dataset, actor=None) -> None:
    audit_record(tenant=dataset.tenant, actor=actor, verb="dataset.deleted", target=f"dataset:{dataset.name}")
    Chunk.objects.for_tenant(dataset.tenant_id).filter(dataset=dataset).delete()
    Document.objects.for_tenant(dataset.tenant_id).filter(dataset=dataset).delete()
    dataset.delete()


# --- documents ---------------------------------------------------------------------------------

@dataclass
class DocumentInput:
    """A document to ingest, validated (`document_clean`)."""

    title: str
    text: str
    external_id: str
    metadata: dict
    content_hash: str


@dataclass
class IngestOutcome:
    document: Document
    status: str  # created | updated | unchanged


@dataclass
class BulkOutcome:
    outcomes: list[IngestOutcome] = field(default_factory=list)
    batches: int = 0

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status)

    @property
    def summary(self) -> dict:
        return {status: self.count(status) for status in ("created", "updated", "unchanged")}


def content_hash(title: str, text: str, metadata: dict) -> str:
    payload = json.dumps([title, text, metadata], sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def document_problems(*, title, text, external_id="", metadata=None) -> dict[str, list[str]]:
    """Why this document cannot be ingested, by field; {} when it can."""
    problems: dict[str, list[str]] = {}
    if not isinstance(title, str) or not title.strip():
        problems["title"] = ["a title is required"]
    elif len(title.strip()) > MAX_TITLE_CHARS:
        problems["title"] = [f"at most {MAX_TITLE_CHARS} characters"]
    if not isinstance(text, str) or not text.strip():
        problems["text"] = ["the text is empty"]
    elif len(text) > MAX_DOCUMENT_CHARS:
        problems["text"] = [f"the text is {len(text):,} characters long; the limit is {MAX_DOCUMENT_CHARS:,}"]
    elif "\x00" in text:
        problems["text"] = ["the text contains NUL characters: it looks like binary data, not text"]
    if external_id is not None and not isinstance(external_id, str):
        problems["external_id"] = ["must be a string"]
    elif external_id and len(external_id.strip()) > MAX_EXTERNAL_ID_CHARS:
        problems["external_id"] = [f"at most {MAX_EXTERNAL_ID_CHARS} characters"]
    if metadata is not None:
        if not isinstance(metadata, dict):
            problems["metadata"] = ["must be an object, e.g. {\"department\": \"hr\"}"]
        elif problem := json_problem(metadata):
            problems["metadata"] = [problem]
        elif len(json.dumps(metadata, default=str)) > MAX_METADATA_BYTES:
            problems["metadata"] = [f"at most {MAX_METADATA_BYTES} bytes of JSON"]
    return problems


def document_clean(*, title, text, external_id="", metadata=None) -> DocumentInput:
    problems = document_problems(title=title, text=text, external_id=external_id, metadata=metadata)
    if problems:
        raise ServiceError(problems)
    title = title.strip()
    text = text.replace("\r\n", "\n").strip()
    metadata = dict(metadata or {})
    return DocumentInput(title=title, text=text, external_id=(external_id or "").strip() or title,
                         metadata=metadata, content_hash=content_hash(title, text, metadata))


def document_ingest(*, tenant, dataset: Dataset, title: str, text: str, external_id: str = "",
                    metadata: dict | None = None, actor=None) -> IngestOutcome:
    """Add a document, or update the one with the same external id (default: the title) in place."""
    doc = document_clean(title=title, text=text, external_id=external_id, metadata=metadata)
    result = documents_ingest_bulk(tenant=tenant, dataset=dataset, documents=[doc], actor=actor)
    return result.outcomes[0]


def documents_clean(documents: list) -> list[DocumentInput]:
    """Validate every document first (all or nothing); errors keyed `documents[i].field`."""
    cleaned, errors, seen = [], {}, {}
    for index, item in enumerate(documents):
        if isinstance(item, DocumentInput):
            doc = item
        else:
            if not isinstance(item, dict):
                errors[f"documents[{index}]"] = ["must be an object with title and text"]
                continue
            fields = {k: item.get(k) for k in ("title", "text", "external_id", "metadata")}
            fields["external_id"] = fields["external_id"] or ""
            problems = document_problems(**fields)
            if problems:
                for name, messages in problems.items():
                    errors[f"documents[{index}].{name}"] = messages
                continue
            doc = document_clean(**fields)
        if doc.external_id in seen:
            errors[f"documents[{index}].external_id"] = [
                f"{doc.external_id!r} repeats documents[{seen[doc.external_id]}]: send each document once"]
            continue
        seen[doc.external_id] = index
        cleaned.append(doc)
    if errors:
        raise ServiceError(errors)
    return cleaned


def documents_ingest_bulk(*, tenant, dataset: Dataset, documents: list, actor=None, batch_size: int = BATCH_SIZE,
                          progress: Progress | None = None) -> BulkOutcome:
    """Ingest many documents into one dataset: all are validated first (nothing is stored when one is
    invalid), then written in batches, each in its own transaction, reporting `progress(done, total)`
    after each. Re-ingesting a document (same external id) updates it in place; an identical one is
    left untouched."""
    if dataset.tenant_id != getattr(tenant, "pk", tenant):
        raise ServiceError({"dataset": ["no such dataset"]})
    cleaned = documents_clean(documents)
    result = BulkOutcome()
    total = len(cleaned)
    for start in range(0, total, batch_size):
        result.outcomes.extend(_ingest_batch(tenant, dataset, cleaned[start:start + batch_size]))
        result.batches += 1
        if progress is not None:
            progress(min(start + batch_size, total), total)
    changed = {k: v for k, v in result.summary.items() if k != "unchanged" and v}
    if changed:
        data = {**result.summary}
        if total == 1:
            data["external_id"] = cleaned[0].external_id
        audit_record(tenant=dataset.tenant, actor=actor, verb="documents.ingested", target=f"dataset:{dataset.name}",
                     data=data)
    return result


def _chunks_for(document: Document, pieces: list[str]) -> list[Chunk]:
    return [
        Chunk(tenant_id=document.tenant_id, document=document, dataset_id=document.dataset_id, ordinal=ordinal,
              title=document.title, text=piece, metadata=document.metadata)
        for ordinal, piece in enumerate(pieces)
    ]


@transaction.atomic
def _ingest_batch(tenant, dataset: Dataset, docs: list[DocumentInput]) -> list[IngestOutcome]:
    fts.tenant_index_ensure(connection, dataset.tenant_id)
    existing = {
        d.external_id: d
        for d in Document.objects.for_tenant(tenant).filter(dataset=dataset,
                                                             external_id__in=[doc.external_id for doc in docs])
    }
    now = timezone.now()
    outcomes, new, changed, pieces = [], [], [], {}
    for doc in docs:
        prior = existing.get(doc.external_id)
        if prior is not None and prior.content_hash == doc.content_hash:
            outcomes.append(IngestOutcome(prior, "unchanged"))
            continue
        if prior is None:
            document = Document(tenant_id=dataset.tenant_id, dataset=dataset, external_id=doc.external_id)
            new.append(document)
            outcomes.append(IngestOutcome(document, "created"))
        else:
            document = prior
            changed.append(document)
            outcomes.append(IngestOutcome(document, "updated"))
        document.title, document.text, document.metadata = doc.title, doc.text, doc.metadata
        document.content_hash, document.updated_at = doc.content_hash, now
        pieces[id(document)] = chunk_text(doc.text)
        document.chunk_count = len(pieces[id(document)])
    if new:
        Document.objects.bulk_create(new)
    if changed:
        Chunk.objects.for_tenant(tenant).filter(document__in=[d.pk for d in changed]).delete()
        Document.objects.for_tenant(tenant).bulk_update(
            changed, ["title", "text", "metadata", "content_hash", "chunk_count", "updated_at"])
    chunks = []
    for document in new + changed:
        chunks.extend(_chunks_for(document, pieces[id(document)]))
    Chunk.objects.bulk_create(chunks, batch_size=500)
    return outcomes


def document_delete(*, document: Document, actor=None) -> None:
    audit_record(tenant=document.tenant, actor=actor, verb="document.deleted",
                 target=f"dataset:{document.dataset.name}", data={"external_id": document.external_id})
    document.delete()


# --- files ---------------------------------------------------------------------------------------

class FileRefused(ValueError):
    """A file that cannot become a document; the message says why, for the person who sent it."""


def document_from_file(name: str, data: bytes) -> dict:
    """Title, text and external id of an uploaded .txt/.md file, or FileRefused."""
    path = PurePath(name or "")
    label = path.name or "the file"
    if path.suffix.lower() not in TEXT_SUFFIXES:
        raise FileRefused(f"{label}: only text (.txt) and Markdown (.md) files can be uploaded")
    if len(data) > MAX_UPLOAD_BYTES:
        raise FileRefused(f"{label}: {len(data):,} bytes is too large; the limit is {MAX_UPLOAD_BYTES:,} bytes")
    if not data.strip():
        raise FileRefused(f"{label}: the file is empty")
    if b"\x00" in data:
        raise FileRefused(f"{label}: this is a binary file, not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise FileRefused(f"{label}: not UTF-8 text (binary data, or another encoding)") from None
    if not text.strip():
        raise FileRefused(f"{label}: the file is empty")
    title = path.stem
    if path.suffix.lower() in (".md", ".markdown"):
        heading = re.search(r"^\s{0,3}#\s+(.+?)\s*#*\s*$", text, re.MULTILINE)
        if heading:
            title = heading.group(1).strip()
    return {"title": title[:MAX_TITLE_CHARS], "text": text, "external_id": name[:MAX_EXTERNAL_ID_CHARS]}


# --- the tenant's search index ------------------------------------------------------------------

def search_index_create(*, tenant) -> None:
    """A new tenant's full-text index (a table of its own on SQLite; knowledge.fts)."""
    fts.tenant_index_ensure(connection, tenant.pk)


# --- the tool's scope ----------------------------------------------------------------------------

def knowledge_tool_seed(*, tenant) -> None:
    """Give knowledge_search its tenant-wide default scope and describe its group (idempotent)."""
    tool = Tool.objects.for_tenant(tenant).filter(name=TOOL_NAME).first()
    if tool is None:
        return
    bound = set(BoundArgument.objects.for_tenant(tenant).filter(tool=tool, agent="").values_list("name", flat=True))
    for name, value in DEFAULT_BINDINGS.items():
        if name not in bound:
            binding_set(tenant=tenant, tool=tool, name=name, value=value)
    ToolGroup.objects.for_tenant(tenant).filter(name=TOOL_GROUP, description="").update(
        description="Search the organisation's knowledge bases (handbooks, policies, runbooks).",
        notes="Before answering questions about internal policies or procedures, look them up with "
              "knowledge_search and name the documents you used.",
    )


def knowledge_tool_seed_all(**kwargs) -> None:
    if not tables_exist(Tenant, Tool, BoundArgument):
        return
    for tenant in Tenant.objects.only("pk", "slug"):  # columns every migration state has (tools.catalog.services)
        knowledge_tool_seed(tenant=tenant)
