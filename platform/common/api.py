"""The API's shared plumbing: the error envelope, the size-limited parser, pagination.

Every error leaves as `{"error": {"code", "message", "fields"}}` (docs/api.md), never a stack trace. A service's
refusal (`common.errors.ServiceError`) is mapped to its status and envelope here, in `exception_handler`.
"""
import io
import logging

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.parsers import JSONParser
from rest_framework.response import Response

from common.errors import RateLimited, ServiceError
from common.json_values import MAX_JSON_DEPTH

logger = logging.getLogger("toolkeeper.api")


class RequestTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is larger than the limit."
    default_code = "too_large"


class LimitedJSONParser(JSONParser):
    """JSON parser that refuses bodies over TOOLKEEPER_MAX_BODY_BYTES with 413 and nesting too deep to parse
    with 400. The values are checked with every other entry's, by `tenancy.entry.admission.admit`."""

    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.TOOLKEEPER_MAX_BODY_BYTES
        request = (parser_context or {}).get("request")
        declared = request.META.get("CONTENT_LENGTH") if request is not None else None
        if declared and declared.isdigit() and int(declared) > limit:
            raise RequestTooLarge()
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise RequestTooLarge()
        try:
            data = super().parse(io.BytesIO(raw), media_type, parser_context)
        except RecursionError as exc:
            raise exceptions.ParseError(f"JSON may be nested at most {MAX_JSON_DEPTH} levels deep") from exc
        return data


class Pagination(LimitOffsetPagination):
    """`limit` (larger ones are cut to `max_limit`) and `offset`; a value that is no such number is a 400,
    where DRF would silently use the default."""

    max_limit = 500
    max_offset = 10**9

    def get_limit(self, request):
        return self._query_int(request, self.limit_query_param, self.default_limit, minimum=1, cutoff=self.max_limit)

    def get_offset(self, request):
        return self._query_int(request, self.offset_query_param, 0, minimum=0, maximum=self.max_offset)

    def _query_int(self, request, name, default, *, minimum, maximum=None, cutoff=None):
        if name not in request.query_params:
            return default
        text = request.query_params[name]
        value = -1  # not a whole number
        if text.isascii() and text.isdecimal():
            digits = text.lstrip("0")
            value = int(digits or "0") if len(digits) <= 18 else 10**18  # past any bound, without a huge int
        if value < minimum or maximum is not None and value > maximum:
            bound = f" and at most {maximum}" if maximum is not None else ""
            raise exceptions.ValidationError({name: [f"must be a whole number of at least {minimum}{bound}"]})
        return min(value, cutoff) if cutoff else value

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.limit_query_param:
                parameter["schema"]["minimum"] = 1
            elif parameter["name"] == self.offset_query_param:
                parameter["schema"].update(minimum=0, maximum=self.max_offset)
        return parameters


def error_body(code: str, message: str, fields: dict | None = None) -> dict:
    return {"error": {"code": code, "message": message, "fields": fields or {}}}


def _flatten_fields(detail) -> dict:
    if isinstance(detail, dict):
        return {str(key): _flatten_fields(value) for key, value in detail.items()}
    if isinstance(detail, list):
        if all(not isinstance(item, dict | list) for item in detail):
            return [str(item) for item in detail]
        return [_flatten_fields(item) for item in detail]
    return str(detail)


def _invalid_body(detail) -> dict:
    """The envelope of invalid input: messages by field, or the messages joined."""
    if isinstance(detail, dict):
        fields = _flatten_fields(detail)
        non_field = fields.pop("non_field_errors", None)
        message = non_field[0] if non_field else "Some fields are invalid."
        return error_body("invalid", message, fields)
    items = _flatten_fields(detail)
    return error_body("invalid", "; ".join(items) if isinstance(items, list) else str(items))


def _service_error_response(exc: ServiceError) -> Response:
    """A service's refusal, answered as DRF answers its ValidationError (400), PermissionDenied (403) and an
    APIException of code `conflict` (409)."""
    if exc.code != ServiceError.code:
        body = error_body(exc.code, exc.message)
    elif isinstance(exc.detail, dict):
        body = _invalid_body(exc.detail)
    else:  # the messages, and the field they concern where the refusal names one
        body = error_body(exc.code, "; ".join(exc.messages), exc.fields)
    headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, RateLimited) else None
    return Response(body, status=exc.status, headers=headers)


def exception_handler(exc, context):
    if isinstance(exc, ServiceError):
        return _service_error_response(exc)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, RequestDataTooBig):
        exc = RequestTooLarge()
    if not isinstance(exc, exceptions.APIException):
        return None  # the middleware answers unexpected errors without a trace
    headers = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header
    if getattr(exc, "wait", None):
        headers["Retry-After"] = str(int(exc.wait))
    if isinstance(exc, exceptions.ValidationError):
        body = _invalid_body(exc.detail)
    else:
        code = exc.get_codes() if isinstance(exc.get_codes(), str) else exc.default_code
        body = error_body(str(code), str(exc.detail))
    return Response(body, status=exc.status_code, headers=headers)


def json_error(status_code: int, code: str, message: str) -> JsonResponse:
    return JsonResponse(error_body(code, message), status=status_code)
