from drf_spectacular.utils import PolymorphicProxySerializer
from rest_framework import serializers

from common import serializers as strict
from knowledge.models import Dataset, Document
from knowledge.services import MAX_TITLE_CHARS
from tools.api.serializers import CallSerializer

MAX_DOCUMENTS_PER_REQUEST = 1000


class DatasetSerializer(strict.ModelSerializer):
    document_count = serializers.IntegerField(read_only=True, default=0)

    class Meta:
        model = Dataset
        fields = ["id", "name", "description", "document_count", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]
        extra_kwargs = {"name": {"validators": []}}  # uniqueness per tenant: checked by the service


class DocumentSerializer(serializers.ModelSerializer):
    dataset = serializers.CharField(source="dataset.name", read_only=True)

    class Meta:
        model = Document
        fields = ["id", "dataset", "external_id", "title", "metadata", "content_hash", "chunk_count", "created_at",
                  "updated_at"]
        read_only_fields = fields


class DocumentDetailSerializer(DocumentSerializer):
    class Meta(DocumentSerializer.Meta):
        fields = [*DocumentSerializer.Meta.fields, "text"]
        read_only_fields = fields


class DocumentInputSerializer(strict.Serializer):
    """One document of a bulk ingest. Limits are checked by the ingest service, all documents first."""

    dataset = serializers.CharField(max_length=100)
    title = serializers.CharField(max_length=MAX_TITLE_CHARS, trim_whitespace=True)
    text = serializers.CharField(trim_whitespace=False)
    external_id = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")
    metadata = serializers.DictField(required=False, default=dict)


DOCUMENTS_REQUEST = PolymorphicProxySerializer(
    component_name="DocumentsIngest", resource_type_field_name=None,
    serializers=[DocumentInputSerializer(many=True, min_length=1, max_length=MAX_DOCUMENTS_PER_REQUEST),
                 DocumentInputSerializer],
    many=False)


class IngestedSerializer(serializers.Serializer):
    id = serializers.IntegerField(source="document.pk")
    dataset = serializers.CharField(source="document.dataset.name")
    external_id = serializers.CharField(source="document.external_id")
    title = serializers.CharField(source="document.title")
    chunk_count = serializers.IntegerField(source="document.chunk_count")
    status = serializers.CharField()


class IngestSummarySerializer(serializers.Serializer):
    created = serializers.IntegerField()
    updated = serializers.IntegerField()
    unchanged = serializers.IntegerField()
    batches = serializers.IntegerField()
    batch_size = serializers.IntegerField()
    documents = IngestedSerializer(many=True)


class IngestWorkSerializer(serializers.Serializer):
    work = CallSerializer(many=True, help_text="a `knowledge_ingest` call per dataset: follow it at /api/v1/calls/{id}")
