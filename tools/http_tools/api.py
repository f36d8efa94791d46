"""`/api/v1/http-tools`: HTTP tools for admin keys and operators. Secrets are write-only: answers name them."""
from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers
from rest_framework.decorators import action
from rest_framework.response import Response

from common import serializers as strict
from common.secrets import secret_names
from tenancy.api.base import TenantScopedViewSet
from tenancy.web import acting_user
from tools.http_tools import services as http_tools
from tools.models import HttpEndpoint, ToolSource


@extend_schema_field({"type": "object", "additionalProperties": {"type": "string", "nullable": True},
                      "writeOnly": True})
class SecretsField(serializers.JSONField):
    """Secret names and values: written, never read back. The service checks them (without echoing a value)."""

    def __init__(self, **kwargs):
        super().__init__(write_only=True, required=False, **kwargs)


def templates_field(help_text: str) -> serializers.DictField:
    return serializers.DictField(child=serializers.CharField(trim_whitespace=False, allow_blank=True),
                                 required=False, help_text=help_text)


class HttpToolSerializer(strict.Serializer):
    id = serializers.IntegerField(read_only=True, help_text="the HTTP tool's own id (its endpoint's)")
    tool_id = serializers.IntegerField(read_only=True, help_text="the id of the tool in /api/v1/tools")
    name = serializers.CharField(max_length=64, validators=[
        RegexValidator(r"^[a-zA-Z0-9_-]+\Z", "1-64 letters, digits, '_' or '-'")])
    description = serializers.CharField(allow_blank=True, required=False, max_length=http_tools.DESCRIPTION_MAX,
                                        trim_whitespace=False)
    input_schema = serializers.DictField(required=False, help_text='a JSON Schema of type "object"; its properties '
                                         "are the arguments the templates name")
    read_only = serializers.BooleanField(required=False)
    destructive = serializers.BooleanField(required=False)
    idempotent = serializers.BooleanField(required=False)
    enabled = serializers.BooleanField(required=False)
    timeout_s = serializers.FloatField(required=False, min_value=http_tools.TIMEOUT_RANGE[0],
                                       max_value=http_tools.TIMEOUT_RANGE[1], help_text="the limit of each request")
    method = serializers.ChoiceField(choices=http_tools.METHODS, required=False)
    url = serializers.CharField(max_length=http_tools.URL_MAX, trim_whitespace=False,
                                help_text="http or https; `{arg}` placeholders in the path and the query take the "
                                          "call's arguments, each encoded as one piece")
    query = templates_field("query parameter → template, e.g. {\"q\": \"{text}\"}; left out when its argument is")
    body = serializers.JSONField(required=False, allow_null=True,
                                 help_text="POST, PUT, PATCH: a JSON template; a string that is one placeholder "
                                           "takes the argument's value. Null: the arguments the URL and the query "
                                           "did not use")
    headers = templates_field("header → value; `{secret:NAME}` stands for a stored secret")
    secrets = SecretsField(help_text="write-only: name → value sets or replaces one, name → null removes it; "
                                     "secrets not named stay")
    secret_names = serializers.SerializerMethodField(help_text="the names of the stored secrets (never their values)")
    response = serializers.DictField(
        required=False, help_text='e.g. {"pointer": "/data"}: the part of a JSON answer that is the result')
    oauth_provider = serializers.CharField(
        required=False, allow_null=True, allow_blank=True, max_length=24,
        help_text="the name of an OAuth provider (/api/v1/oauth-providers): each call sends its token (the caller's "
                  "own, or its service account's) as the Authorization. Null: the tenant's credential")
    source_ref = serializers.CharField(read_only=True)
    created_at = serializers.DateTimeField(read_only=True)
    updated_at = serializers.DateTimeField(read_only=True)

    def get_secret_names(self, endpoint) -> list[str]:
        return secret_names(endpoint, "secrets")

    def to_representation(self, endpoint):
        """The tool's fields and its endpoint's, side by side (the serializer's fields are the service's)."""
        tool = endpoint.tool
        stamp = self.fields["created_at"].to_representation
        return {"id": endpoint.pk, "tool_id": tool.pk, **{name: getattr(tool, name) for name in http_tools.TOOL_FIELDS},
                "method": endpoint.method, "url": endpoint.url_template, "query": endpoint.query, "body": endpoint.body,
                "headers": endpoint.headers, "secret_names": self.get_secret_names(endpoint),
                "response": endpoint.response,
                "oauth_provider": endpoint.oauth_provider.name if endpoint.oauth_provider_id else None,
                "source_ref": tool.source_ref, "created_at": stamp(tool.created_at),
                "updated_at": stamp(max(tool.updated_at, endpoint.updated_at))}


class HttpToolImportSerializer(strict.Serializer):
    document = serializers.CharField(max_length=http_tools.IMPORT_MAX_BYTES, trim_whitespace=False,
                                     help_text="an OpenAPI 3 document, JSON or YAML: at most 1 MiB, 200,000 values and "
                                               "64 levels, no anchors or aliases")
    prefix = serializers.CharField(required=False, allow_blank=True, max_length=32, trim_whitespace=False,
                                   help_text="put before each tool's name (its operationId, or method and path)")
    base_url = serializers.CharField(required=False, allow_blank=True, max_length=http_tools.URL_MAX,
                                     trim_whitespace=False, help_text="the API's URL; empty: the document's first "
                                                                      "server")
    operations = serializers.ListField(child=serializers.CharField(max_length=300, trim_whitespace=False),
                                       required=False, max_length=500,
                                       help_text='the operations to import, by operationId or "GET /path"; '
                                                 "empty: all")
    headers = templates_field("headers of every tool made, as for one HTTP tool")
    secrets = SecretsField(help_text="write-only: the secrets of every tool made")
    oauth_provider = serializers.CharField(required=False, allow_null=True, max_length=24,
                                           help_text="the OAuth provider every tool made calls with")
    timeout_s = serializers.FloatField(required=False, min_value=http_tools.TIMEOUT_RANGE[0],
                                       max_value=http_tools.TIMEOUT_RANGE[1])


class HttpToolImportedSerializer(serializers.Serializer):
    operation = serializers.CharField(help_text='"METHOD /path"')
    name = serializers.CharField(help_text="the tool's name (taken or meant)")
    created = serializers.BooleanField()
    id = serializers.IntegerField(allow_null=True, help_text="the HTTP tool made")
    reason = serializers.CharField(allow_blank=True, help_text="why no tool was made")


class HttpToolImportResultSerializer(serializers.Serializer):
    operations = HttpToolImportedSerializer(many=True)


class HttpToolViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                      mixins.UpdateModelMixin, mixins.DestroyModelMixin, TenantScopedViewSet):
    """Tools whose calls an HTTP endpoint answers (`tools.http_tools.services`)."""

    serializer_class = HttpToolSerializer
    model = HttpEndpoint

    def safely_get_queryset(self, queryset):
        return (queryset.filter(tool__source=ToolSource.HTTP).select_related("tool", "oauth_provider")
                .order_by("tool__name"))

    def represent(self, tool, status: int = 200) -> Response:
        return Response(self.get_serializer(self.get_queryset().get(tool=tool)).data, status=status)

    def create(self, request, *args, **kwargs):
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        tool = http_tools.http_tool_create(tenant=self.tenant, actor=acting_user(request), **body.validated_data)
        return self.represent(tool, status=201)

    def update(self, request, *args, **kwargs):
        endpoint = self.get_object()
        body = self.get_serializer(endpoint, data=request.data, partial=kwargs.get("partial", False))
        body.is_valid(raise_exception=True)
        tool = http_tools.http_tool_update(tool=endpoint.tool, actor=acting_user(request), **body.validated_data)
        return self.represent(tool)

    def perform_destroy(self, instance):
        http_tools.http_tool_delete(tool=instance.tool, actor=acting_user(self.request))

    @extend_schema(request=HttpToolImportSerializer, responses=HttpToolImportResultSerializer)
    @action(detail=False, methods=["post"], url_path="import", url_name="import")
    def import_document(self, request):
        """One HTTP tool per operation of an OpenAPI 3 document; the answer says, per operation, what was made
        or why not (a document that cannot be read is a 400)."""
        body = HttpToolImportSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        report = http_tools.http_tools_import(tenant=self.tenant, actor=acting_user(request), **body.validated_data)
        return Response({"operations": report})
