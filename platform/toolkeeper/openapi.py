"""The OpenAPI document (`/api/schema/`): what every operation shares is added here, derived from the view.

`AutoSchema` states the scope each operation needs (`x-required-scope` and a sentence in the
description, both read from the view's `required_scope` and the console rules of
`tenancy.permissions`, so they cannot drift from what is enforced) and documents the error
responses that apply, each in the error envelope of `common.api.error_body`. Views add the
statuses only they know of (409) with `CONFLICT`. A request serializer states a rule between its
fields that a field's own schema cannot (`only_with`) in `schema_rules`, added to its request schema.
"""
import uritemplate
from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.utils import OpenApiResponse, PolymorphicProxySerializer
from rest_framework import serializers

from tenancy.permissions import console_roles, required_scopes


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="A stable machine-readable code, e.g. `invalid`, `not_found`.")
    message = serializers.CharField(help_text="What went wrong, for a person.")
    fields = serializers.DictField(
        help_text="For invalid input: the messages per field (nested like the body); otherwise empty.")


class ErrorSerializer(serializers.Serializer):
    """Every error answer of the API."""

    error = ErrorDetailSerializer()


def error_response(description: str) -> OpenApiResponse:
    return OpenApiResponse(ErrorSerializer, description=description)


CONFLICT = error_response("Conflict: the object is not in a state that allows this.")

BAD_REQUEST = error_response("Invalid input; `error.fields` names the fields that are wrong.")
UNAUTHENTICATED = error_response("No credentials, or an invalid or revoked API key.")
FORBIDDEN = error_response("The API key lacks the scope, or the console member the role, this operation needs.")
NOT_FOUND = error_response("No such object in the caller's tenant (another tenant's objects are missing too).")
TOO_LARGE = error_response("The request body is larger than the limit (TOOLKEEPER_MAX_BODY_BYTES).")
UNSUPPORTED_MEDIA_TYPE = error_response("The request body is not JSON (`Content-Type: application/json`).")
RATE_LIMITED = error_response("Too many requests; retry after the number of seconds in `Retry-After`.")

# Any JSON value but null (a JSON field that refuses null).
NOT_NULL = {"anyOf": [{"type": "object", "additionalProperties": {}}, {"type": "array", "items": {}},
                      {"type": "string"}, {"type": "number"}, {"type": "boolean"}]}
RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait before retrying."}}


def only_with(field: str, companion: str) -> dict:
    """A rule of a request body: `field` is sent only together with `companion` (OpenAPI 3.0 has no
    `dependentRequired`, so it is said with `not` and `anyOf`)."""
    return {"anyOf": [{"not": {"required": [field]}}, {"required": [field, companion]}]}


class AutoSchema(SpectacularAutoSchema):
    def get_description(self) -> str:
        own = super().get_description()
        return f"{own}\n\n{self._access_sentence()}" if own else self._access_sentence()

    def get_extensions(self) -> dict:
        return {**super().get_extensions(), "x-required-scope": list(required_scopes(self.view)),
                "x-console-roles": list(console_roles(self.view, self.method))}

    def _access_sentence(self) -> str:
        scopes = " or ".join(f"`{scope}`" for scope in required_scopes(self.view))
        roles = ", ".join(console_roles(self.view, self.method))
        return (f"Needs an API key with the {scopes} scope, or a console login (tenant in `X-Tenant`) "
                f"with the role {roles}.")

    def _get_request_for_media_type(self, serializer, direction="request"):
        schema, required = super()._get_request_for_media_type(serializer, direction)
        # One of several shapes (a call or a batch, a document or a list): there is no empty form.
        return schema, required or isinstance(serializer, PolymorphicProxySerializer)

    def _map_basic_serializer(self, serializer, direction):
        schema = super()._map_basic_serializer(serializer, direction)
        for rule in getattr(serializer, "schema_rules", ()) if direction == "request" else ():
            if set(rule) & set(schema):  # a keyword the schema has already: both must hold
                schema.setdefault("allOf", []).append(rule)
            else:
                schema.update(rule)
        return schema

    def _unwrap_list_serializer(self, serializer, direction):
        schema = super()._unwrap_list_serializer(serializer, direction)
        # drf-spectacular leaves out the item counts a `many=True` serializer enforces.
        if schema and isinstance(serializer, serializers.ListSerializer):
            if serializer.min_length is not None:
                schema["minItems"] = serializer.min_length
            if serializer.max_length is not None:
                schema["maxItems"] = serializer.max_length
        return schema

    def _get_response_bodies(self, direction="response") -> dict:
        responses = super()._get_response_bodies(direction)
        for status, response in self._error_responses().items():
            if status not in responses:
                responses[status] = self._get_response_for_code(response, status, direction=direction)
        if "429" in responses:
            responses["429"]["headers"] = {**responses["429"].get("headers", {}), **RETRY_AFTER}
        return responses

    def _error_responses(self) -> dict[str, OpenApiResponse]:
        has_body = self.method in ("POST", "PUT", "PATCH") and self._get_request_body() is not None
        has_query = any(p["in"] == "query" for p in self._get_parameters())
        errors = {}
        if has_query or self.method not in ("GET", "HEAD"):  # a change can be refused by a service's check
            errors["400"] = BAD_REQUEST
        errors["401"] = UNAUTHENTICATED
        errors["403"] = FORBIDDEN
        if uritemplate.variables(self.path):
            errors["404"] = NOT_FOUND
        if has_body:
            errors["413"] = TOO_LARGE
            errors["415"] = UNSUPPORTED_MEDIA_TYPE
        errors["429"] = RATE_LIMITED
        return errors
