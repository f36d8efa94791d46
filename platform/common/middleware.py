"""API paths always answer in the JSON error envelope, even for 404s and unexpected errors."""
import logging

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.exceptions import RequestDataTooBig
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.security import SecurityMiddleware

from common.api import json_error

logger = logging.getLogger("toolkeeper.api")

API_PREFIXES = ("/api/", "/mcp")
GENERIC_ERRORS = {
    400: ("bad_request", "The request is malformed."),
    403: ("forbidden", "You may not do this."),
    404: ("not_found", "Not found."),
    405: ("method_not_allowed", "This method is not allowed here."),
    413: ("too_large", "The request body is larger than the limit."),
    500: ("server_error", "An internal error occurred."),
}


def _is_api(request) -> bool:
    return request.path.startswith(API_PREFIXES)


class ApiErrorMiddleware:
    async_capable = True
    sync_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        return self._finish(request, self.get_response(request))

    async def _acall(self, request):
        return self._finish(request, await self.get_response(request))

    def _finish(self, request, response):
        if (_is_api(request) and response.status_code >= 400
                and "json" not in response.get("Content-Type", "")):
            # Django's own error pages (bad host, unknown route, a crash) in the envelope, without details.
            status = response.status_code
            code, message = GENERIC_ERRORS.get(status, ("error", "The request failed."))
            return json_error(status, code, message)
        return response

    def process_exception(self, request, exception):
        if not _is_api(request):
            return None
        if isinstance(exception, RequestDataTooBig):
            return json_error(413, "too_large", "The request body is larger than the limit.")
        logger.exception("unhandled error on %s", request.path)
        return json_error(500, "server_error", "An internal error occurred.")


class EventLoopMiddleware:
    """Runs a Django middleware whose hooks only compute (headers, redirects, the host check) on the
    event loop, where Django's async path would cross to a thread and back for each hook."""

    async_capable = True
    sync_capable = False
    wraps: type

    def __init__(self, get_response):
        self.get_response = get_response
        self.inner = self.wraps(get_response)
        markcoroutinefunction(self)

    async def __call__(self, request):
        response = None
        if hasattr(self.inner, "process_request"):
            response = self.inner.process_request(request)
        response = response or await self.get_response(request)
        if hasattr(self.inner, "process_response"):
            response = self.inner.process_response(request, response)
        return response


class SecurityHeadersMiddleware(EventLoopMiddleware):
    wraps = SecurityMiddleware


class CommonRequestMiddleware(EventLoopMiddleware):
    wraps = CommonMiddleware


class FrameOptionsMiddleware(EventLoopMiddleware):
    wraps = XFrameOptionsMiddleware
