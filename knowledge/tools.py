"""`knowledge_search`: the model writes the query; the server decides where it may search.

`datasets` and `filter` are arguments of the function, but the knowledge app binds both for every
tenant (tenant-wide defaults: all datasets, no filter — `services.DEFAULT_BINDINGS`), so they are
never in the schema a model sees; an operator narrows them per agent with bound arguments. Should
the tenant-wide bindings be removed, the function still refuses values the model sent itself and
falls back to the same safe default. The tenant is never an argument: it is the call's.
"""
from typing import Annotated, Literal

from pydantic import Field

from knowledge.models import Dataset
from knowledge.selectors import ALL_DATASETS, MAX_TOP_K, InvalidQuery, chunks_search
from knowledge.services import documents_ingest_bulk
from tools.python.decorators import ToolContext, ToolError, tool

SERVER_BOUND = ("datasets", "filter")
FilterValue = str | int | float | bool | None


def search_result(*, tenant, query: str, top_k: int, datasets, filters) -> dict:
    """Run a search exactly as the tool does (the console's "try it as an agent" uses this too)."""
    try:
        hits = chunks_search(tenant=tenant, query=query, datasets=datasets, filters=filters, top_k=top_k)
    except InvalidQuery as exc:
        raise ToolError(str(exc), error_type="InvalidQuery") from exc
    return results_payload(query, hits)


def results_payload(query: str, hits) -> dict:
    """What the model receives."""
    return {
        "query": query,
        "count": len(hits),
        "results": [
            {"rank": hit.rank, "document_id": hit.document_id, "title": hit.title, "dataset": hit.dataset,
             "snippet": hit.snippet, "score": round(hit.score, 6)}
            for hit in hits
        ],
    }


@tool(read_only=True, idempotent=True, timeout=15, groups=("knowledge",))
def knowledge_search(
    query: str,
    top_k: Annotated[int, Field(ge=1, le=MAX_TOP_K)] = 5,
    datasets: list[str] | Literal["*"] = ALL_DATASETS,
    filter: dict[str, FilterValue | list[FilterValue]] | None = None,  # noqa: A002 (the argument's public name)
    ctx: ToolContext = None,
) -> dict:
    """Search the organization's knowledge bases (handbooks, policies, runbooks, how-tos) and return the best-matching passages, best first, with the title and id of the document each comes from.

    Args:
        query: What to look for, in plain words, e.g. "set up the VPN on a laptop". At most 500 characters.
        top_k: How many documents to return, 1 to 20.
        datasets: Set by the server: the datasets searched ("*": all of the tenant's).
        filter: Set by the server: metadata every result must match, e.g. {"department": "hr"}.
    """  # noqa: E501
    if ctx is None or ctx.tenant is None:
        raise ToolError("knowledge_search runs only inside a governed call", error_type="ToolUnavailable")
    sent = getattr(ctx.call, "input", None) or {}
    overridden = sorted(set(sent) & set(SERVER_BOUND))
    if overridden:
        raise ToolError(f"{', '.join(overridden)} {'is' if len(overridden) == 1 else 'are'} set by the server "
                        "and cannot be chosen in a call", error_type="BoundArgumentOverride")
    return search_result(tenant=ctx.tenant, query=query, top_k=top_k, datasets=datasets, filters=filter)


@tool(kind="builtin", idempotent=True, concurrency_safe=False, timeout=3600)
def knowledge_ingest(dataset_id: int, documents: list[dict], ctx: ToolContext = None) -> dict:
    """Ingest many documents into a dataset of this tenant, reporting progress batch by batch.

    Started by operators (the documents API and the console's upload, for large ingests); it belongs to no
    tool group, so models are never offered it.

    Args:
        dataset_id: The dataset to ingest into.
        documents: Documents as the documents API takes them: title, text, optional external_id and metadata.
    """
    dataset = Dataset.objects.for_tenant(ctx.tenant).filter(pk=dataset_id).first()
    if dataset is None:
        raise ToolError(f"no dataset {dataset_id} in this tenant", error_type="InvalidInput")

    def progress(done: int, total: int) -> None:
        ctx.emit(f"{done}/{total} documents ingested", progress=done / total if total else 1.0)

    result = documents_ingest_bulk(tenant=ctx.tenant, dataset=dataset, documents=documents, progress=progress)
    return {"dataset": dataset.name, "batches": result.batches, **result.summary}
