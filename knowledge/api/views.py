"""Admin endpoints for knowledge bases: `/api/v1/datasets` (CRUD) and `/api/v1/documents`
(list, retrieve, delete, and a bulk POST). Up to `services.BATCH_SIZE` documents are ingested in the request;
larger ingests run as work that reports progress (a `knowledge_ingest` call), in batches, each batch its own
transaction. Bodies are capped by the API parser (413 beyond
TOOLKEEPER_MAX_BODY_BYTES)."""
from django.db.models import Count
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from common.errors import ServiceError
from knowledge import services
from knowledge.api import serializers as s
from knowledge.models import Dataset, Document
from tenancy.api.base import TenantModelViewSet, TenantScopedViewSet
from tenancy.web import acting_user
from tools.api.serializers import calls_data
from tools.calls.submit import work_start

MAX_DOCUMENTS_PER_REQUEST = s.MAX_DOCUMENTS_PER_REQUEST


class DatasetViewSet(TenantModelViewSet):
    serializer_class = s.DatasetSerializer
    http_method_names = ["get", "post", "put", "patch", "delete"]

    def safely_get_queryset(self, queryset):
        return queryset.annotate(document_count=Count("documents")).order_by("name")

    def perform_create(self, serializer):
        serializer.instance = services.dataset_create(tenant=self.tenant, actor=acting_user(self.request),
                                                      **serializer.validated_data)

    def perform_update(self, serializer):
        serializer.instance = services.dataset_update(dataset=serializer.instance, actor=acting_user(self.request),
                                                      **serializer.validated_data)

    def perform_destroy(self, instance):
        services.dataset_delete(dataset=instance, actor=acting_user(self.request))


class DocumentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin,
                      TenantScopedViewSet):
    serializer_class = s.DocumentSerializer
    model = Document

    def get_serializer_class(self):
        return s.DocumentDetailSerializer if self.action == "retrieve" else s.DocumentSerializer

    @extend_schema(parameters=[OpenApiParameter("dataset", str, description="a dataset name")])
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    def safely_get_queryset(self, queryset):
        queryset = queryset.select_related("dataset").order_by("dataset__name", "title", "id")
        if self.action == "list":
            queryset = queryset.defer("text")
            if name := self.request.query_params.get("dataset"):
                queryset = queryset.filter(dataset__name=name)
        return queryset

    @extend_schema(request=s.DOCUMENTS_REQUEST, responses={
        201: OpenApiResponse(s.IngestSummarySerializer, "Ingested; at least one document was created."),
        200: OpenApiResponse(s.IngestSummarySerializer, "Ingested; every document was updated or unchanged."),
        202: OpenApiResponse(s.IngestWorkSerializer, "Too many documents for one request: ingesting as work."),
    })
    def create(self, request):
        """Ingest documents: a list of {dataset, title, text, external_id?, metadata?} (or one such object).

        Re-sending a document with the same dataset and external id (default: its title) updates it in
        place. Every document is validated before any is stored."""
        items = request.data if isinstance(request.data, list) else [request.data]
        if not items:
            raise ValidationError("send at least one document")
        if len(items) > MAX_DOCUMENTS_PER_REQUEST:
            raise ValidationError(f"at most {MAX_DOCUMENTS_PER_REQUEST} documents per request")
        not_objects = {f"documents[{i}]": ["must be an object with dataset, title and text"]
                       for i, item in enumerate(items) if not isinstance(item, dict)}
        if not_objects:
            raise ValidationError(not_objects)
        body = s.DocumentInputSerializer(data=items, many=True)
        if not body.is_valid():
            errors = body.errors
            by_index = errors.items() if isinstance(errors, dict) else enumerate(errors)
            raise ValidationError({f"documents[{i}].{name}": [str(m) for m in messages]
                                   for i, item in by_index if item for name, messages in item.items()})
        names = {item["dataset"] for item in body.validated_data}
        datasets = {d.name: d for d in Dataset.objects.for_tenant(self.tenant).filter(name__in=names)}
        missing = {f"documents[{i}].dataset": [f"no dataset named {item['dataset']!r}"]
                   for i, item in enumerate(body.validated_data) if item["dataset"] not in datasets}
        if missing:
            raise ValidationError(missing)
        by_dataset: dict[str, list] = {}
        for item in body.validated_data:
            by_dataset.setdefault(item["dataset"], []).append(
                {k: item[k] for k in ("title", "text", "external_id", "metadata")})
        for name, documents in by_dataset.items():  # validate everything before storing anything
            try:
                services.documents_clean(documents)
            except ServiceError as exc:
                raise ServiceError({f"{name}: {key}": value for key, value in exc.fields.items()}) from exc
        if len(body.validated_data) > services.BATCH_SIZE:
            # Large: run as work that reports progress (GET /api/v1/calls/{id} and …/events follow it).
            work = [work_start(tenant=self.tenant, tool_name="knowledge_ingest", actor=acting_user(request),
                               arguments={"dataset_id": datasets[name].pk, "documents": documents})
                    for name, documents in by_dataset.items()]
            return Response({"work": calls_data(work)}, status=202)
        outcomes, batches = [], 0
        for name, documents in by_dataset.items():
            result = services.documents_ingest_bulk(tenant=self.tenant, dataset=datasets[name], documents=documents,
                                                    actor=acting_user(request))
            outcomes.extend(result.outcomes)
            batches += result.batches
        summary = {status: sum(1 for o in outcomes if o.status == status)
                   for status in ("created", "updated", "unchanged")}
        return Response({**summary, "batches": batches, "batch_size": services.BATCH_SIZE,
                         "documents": s.IngestedSerializer(outcomes, many=True).data},
                        status=201 if summary["created"] else 200)

    def perform_destroy(self, instance):
        services.document_delete(document=instance, actor=acting_user(self.request))

