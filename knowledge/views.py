"""Console pages for knowledge bases (templates/knowledge/), mounted at /t/<tenant>/knowledge/.

Every page goes through `tenancy.web.tenant_view` (login, tenant membership, the objects the URL names —
`dataset_id`, `document_id`: missing or another tenant's → 404 — then the method and the role: reading for
any member, changing for operators). Creating and deleting are the generic views of `tenancy.editing`.
"""
from django.contrib import messages
from django.shortcuts import render
from pydantic import ValidationError as InputError

from knowledge import selectors, services
from knowledge.forms import DatasetForm, ScopeForm, SearchForm, UploadForm
from knowledge.models import Dataset
from knowledge.tools import results_payload
from tenancy.editing import ObjectActionView, ObjectDeleteView, ObjectFormView
from tenancy.web import (
    INVALID_STATUS,
    SERVICE_REFUSALS,
    acting_user,
    add_service_errors,
    page_of,
    service_errors,
    tenant_redirect,
    tenant_view,
)
from tools.calls.submit import work_start
from tools.catalog.schemas import with_bound
from tools.catalog.selectors import bindings_for
from tools.catalog.services import binding_delete, binding_set
from tools.models import BoundArgument, Tool
from tools.python.decorators import python_tool


def _search_tool(tenant) -> Tool | None:
    return Tool.objects.for_tenant(tenant).filter(name=services.TOOL_NAME).first()


# --- datasets ----------------------------------------------------------------------------------

@tenant_view()
def dataset_list(request):
    return render(request, "knowledge/dataset_list.html", {
        "datasets": selectors.datasets_of(request.tenant),
        "search_form": SearchForm(),
    })


dataset_create = ObjectFormView.as_view(
    form_class=DatasetForm, service=services.dataset_create, template_name="knowledge/dataset_form.html",
    success_url="knowledge:dataset_detail", success_params=(("dataset_id", "pk"),),
    success_message="Dataset {object.name} created. Upload documents to fill it.")


def _dataset_page(request, dataset, upload_form, status=200):
    documents = selectors.documents_of(request.tenant, dataset)
    return render(request, "knowledge/dataset_detail.html", {
        "dataset": dataset,
        "page": page_of(request, documents),
        "document_count": documents.count(),
        "upload_form": upload_form,
        "search_form": SearchForm(),
    }, status=status)


def _named_problems(exc) -> list[str]:
    """A refusal of the documents as lines that name what they concern ("documents[3].text: …")."""
    by_field: dict = {}
    for field, message in service_errors(exc):
        by_field.setdefault(field, []).append(message)
    return [f"{field}: {' '.join(texts)}" if field else " ".join(texts) for field, texts in by_field.items()]


@tenant_view()
def dataset_detail(request, dataset):
    return _dataset_page(request, dataset, UploadForm())


@tenant_view(methods=("POST",))
def dataset_upload(request, dataset):
    """Several .txt/.md files at once. One bad file (binary, empty, too large) → nothing is stored."""
    form = UploadForm(request.POST, request.FILES)
    if not form.is_valid():
        return _dataset_page(request, dataset, form, status=INVALID_STATUS)
    documents, problems = [], []
    for upload in form.cleaned_data["files"]:
        try:
            if upload.size > services.MAX_UPLOAD_BYTES:
                raise services.FileRefused(f"{upload.name}: {upload.size:,} bytes is too large; the limit is "
                                           f"{services.MAX_UPLOAD_BYTES:,} bytes")
            document = services.document_from_file(upload.name, upload.read(services.MAX_UPLOAD_BYTES + 1))
        except services.FileRefused as exc:
            problems.append(str(exc))
            continue
        documents.append({**document, "metadata": form.cleaned_data["metadata"]})
    if not problems and len(documents) > services.BATCH_SIZE:
        try:
            services.documents_clean(documents)  # refuse bad files now, not halfway through the work
            work = work_start(tenant=request.tenant, tool_name="knowledge_ingest", actor=acting_user(request),
                              arguments={"dataset_id": dataset.pk, "documents": documents})
        except SERVICE_REFUSALS as exc:
            problems.extend(_named_problems(exc))
        else:
            messages.success(request, f"Ingesting {len(documents)} files: follow the progress here.")
            return tenant_redirect(request, "console:call_detail", call_id=work.pk)
    if not problems:
        try:
            result = services.documents_ingest_bulk(tenant=request.tenant, dataset=dataset, documents=documents,
                                                    actor=acting_user(request))
        except SERVICE_REFUSALS as exc:
            problems.extend(_named_problems(exc))
        else:
            summary = result.summary
            messages.success(request, f"{len(documents)} file(s) ingested: {summary['created']} new, "
                                      f"{summary['updated']} updated, {summary['unchanged']} unchanged.")
            return tenant_redirect(request, "knowledge:dataset_detail", dataset_id=dataset.pk)
    form.add_error("files", "Nothing was stored. Fix or remove these files and upload again:")
    for problem in problems:
        form.add_error("files", problem)
    return _dataset_page(request, dataset, form, status=INVALID_STATUS)


class DatasetDelete(ObjectDeleteView):
    def context(self) -> dict:
        return {"document_count": selectors.documents_of(self.request.tenant, self.object).count()}


dataset_delete = DatasetDelete.as_view(
    service=services.dataset_delete, template_name="knowledge/dataset_delete.html",
    success_url="knowledge:dataset_list", success_message="Dataset {object.name} and its documents deleted.")


# --- documents ---------------------------------------------------------------------------------

@tenant_view()
def document_detail(request, document):
    return render(request, "knowledge/document_detail.html", {
        "document": document,
        "chunks": document.chunks.order_by("ordinal").only("ordinal", "text"),
    })


document_delete = ObjectActionView.as_view(
    service=services.document_delete, success_url="knowledge:dataset_detail",
    success_params=(("dataset_id", "dataset_id"),), success_message="Document {object.title} deleted.")


# --- trying the tool ---------------------------------------------------------------------------

@tenant_view()
def search(request):
    """Run knowledge_search as an agent's call would: the query from the form, the agent's bound
    arguments merged last (the same `bindings_for` the pipeline uses), validated like a call."""
    form = SearchForm(request.GET if "query" in request.GET else None)
    tool = _search_tool(request.tenant)
    context = {"form": form, "tool": tool, "result": None, "error": None, "bound": None,
               "agents": _bound_agents(request.tenant, tool)}
    if form.is_bound and form.is_valid() and tool is not None:
        data = form.cleaned_data
        bound = bindings_for(request.tenant, data["agent"], [tool.pk]).get(tool.pk, {})
        arguments = with_bound({"query": data["query"], "top_k": data["top_k"] or 5}, bound)
        context["bound"] = bound
        try:
            spec = python_tool(services.TOOL_NAME)
            valid = spec.input_model.model_validate(arguments)
            hits = selectors.chunks_search(tenant=request.tenant, query=valid.query, datasets=valid.datasets,
                                           filters=valid.filter, top_k=valid.top_k)
            context["hits"], context["result"] = hits, results_payload(valid.query, hits)
        except (InputError, selectors.InvalidQuery) as exc:
            context["error"] = str(exc)
    return render(request, "knowledge/search.html", context)


def _bound_agents(tenant, tool) -> list[str]:
    if tool is None:
        return []
    return sorted(set(BoundArgument.objects.for_tenant(tenant).filter(tool=tool).exclude(agent="")
                      .values_list("agent", flat=True)))


# --- the tool's scope --------------------------------------------------------------------------

def _scopes(tenant, tool) -> list[dict]:
    """One row per agent with bindings (tenant-wide first): the datasets and filter it searches with."""
    rows: dict[str, dict] = {}
    for binding in BoundArgument.objects.for_tenant(tenant).filter(tool=tool, name__in=services.DEFAULT_BINDINGS):
        rows.setdefault(binding.agent, {"agent": binding.agent})[binding.name] = binding.value
    for agent, row in rows.items():
        effective = bindings_for(tenant, agent, [tool.pk]).get(tool.pk, {})
        row["effective"] = {name: effective.get(name, services.DEFAULT_BINDINGS[name])
                            for name in services.DEFAULT_BINDINGS}
    return [rows[agent] for agent in sorted(rows)]


@tenant_view(methods=("GET", "POST"))
def bindings(request):
    tool = _search_tool(request.tenant)
    names = list(Dataset.objects.for_tenant(request.tenant).order_by("name").values_list("name", flat=True))
    form = ScopeForm(dataset_names=names)
    if request.method == "POST" and tool is not None:
        if "remove_agent" in request.POST:
            agent = request.POST["remove_agent"].strip()
            if agent:  # the tenant-wide scope is edited, never removed: it keeps the arguments hidden
                for binding in BoundArgument.objects.for_tenant(request.tenant).filter(
                        tool=tool, agent=agent, name__in=services.DEFAULT_BINDINGS):
                    binding_delete(binding=binding, actor=acting_user(request))
                messages.success(request, f"{agent} now searches with the tenant-wide scope.")
            return tenant_redirect(request, "knowledge:bindings")
        form = ScopeForm(request.POST, dataset_names=names)
        if form.is_valid():
            agent = form.cleaned_data["agent"]
            try:
                for name, value in form.scope().items():
                    binding_set(tenant=request.tenant, tool=tool, name=name, value=value, agent=agent,
                                actor=acting_user(request))
            except SERVICE_REFUSALS as exc:
                add_service_errors(form, exc)
            else:
                messages.success(request, f"Scope saved for {agent or 'every agent'}.")
                return tenant_redirect(request, "knowledge:bindings")
    elif request.GET.get("agent") is not None and tool is not None:
        agent = request.GET["agent"].strip()
        current = bindings_for(request.tenant, agent, [tool.pk]).get(tool.pk, {})
        datasets = current.get("datasets", "*")
        form = ScopeForm(dataset_names=names, initial={
            "agent": agent, "all_datasets": datasets == "*",
            "datasets": [] if datasets == "*" else datasets, "filter": current.get("filter", {})})
    return render(request, "knowledge/bindings.html", {
        "tool": tool, "form": form, "scopes": _scopes(request.tenant, tool) if tool else [],
    }, status=INVALID_STATUS if form.errors else 200)
