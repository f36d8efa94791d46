"""Services refuse with the platform's own errors (`common.errors`), and the API maps them in one place.

The layout is read from the source: outside the `api` packages, only the modules that plug into DRF import
it, so no service can raise a DRF exception. The mapping is checked twice: against DRF's own exceptions of the
same detail (the answers the API gave before services had errors of their own), and through real endpoints,
one per kind of refusal.
"""
import ast
from pathlib import Path

import pytest
from rest_framework import exceptions, status
from rest_framework.test import APIClient

from approvals.engine import index_cache
from approvals.models import ApprovalRequest
from approvals.services import queue_save, rule_create
from common.api import exception_handler
from common.errors import Conflict, NotPermitted, ServiceError
from tools.calls.submit import calls_submit
from tools.models import CallStatus

ROOT = Path(__file__).resolve().parents[2]
SERVICE_PACKAGES = ["tools", "approvals", "knowledge", "skills", "platform/tenancy", "platform/audit"]
# DRF by nature: they plug into it (authentication, permission and throttle classes) or build an API answer
# (the refusal of a waiting request whose key or membership ended). No service raises what they define.
DRF_MODULES = {"platform/tenancy/entry/authentication.py", "platform/tenancy/permissions.py",
               "platform/tenancy/entry/admission.py", "platform/tenancy/grants.py"}


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _is_drf(name: str) -> bool:
    return name == "rest_framework" or name.startswith("rest_framework.")


def test_only_the_api_packages_and_the_drf_plugins_import_drf():
    importers = []
    for package in SERVICE_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            # an app's api package, or a feature's api module (tools.http_tools.api)
            if ({"api", "migrations"} & set(relative.parts) or path.name == "api.py"
                    or str(relative) in DRF_MODULES):
                continue
            if any(_is_drf(name) for name in _imported_modules(path)):
                importers.append(str(relative))
    assert importers == []


def test_the_drf_plugins_still_exist():
    """The exceptions above name real modules (a renamed one would silently widen the rule)."""
    assert all((ROOT / module).is_file() for module in DRF_MODULES)


def test_the_errors_sit_below_django_and_drf():
    imported = _imported_modules(ROOT / "platform/common/errors.py")
    assert not {name for name in imported if name.split(".")[0] in ("django", "rest_framework")}


class _DrfConflict(exceptions.APIException):
    """What services raised for a conflict before they had errors of their own."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the current state."
    default_code = "conflict"


def _answer(exc) -> tuple[int, dict]:
    response = exception_handler(exc, {})
    return response.status_code, response.data


@pytest.mark.parametrize("detail", [
    {"name": ["a group named 'math' exists"]},
    {"calls": ["call ids must be unique within a batch"], "timeout_s": ["between 0.1 and 86400 seconds"]},
    {"name": "one message, not a list"},
    {"non_field_errors": ["about the whole request"], "name": ["and a field"]},
    "set TOOLKEEPER_AUDIT_KEY to sign audit chains",
    ["first", "second"],
])
def test_a_refusal_is_answered_as_drf_answered_its_validation_error(detail):
    assert _answer(ServiceError(detail)) == _answer(exceptions.ValidationError(detail))


def test_not_permitted_is_answered_as_drf_answered_permission_denied():
    message = "you are not a reviewer of this request's queue"
    assert _answer(NotPermitted(message)) == _answer(exceptions.PermissionDenied(message))
    assert _answer(NotPermitted(message)) == (403, {"error": {"code": "permission_denied", "message": message,
                                                              "fields": {}}})


def test_a_conflict_is_answered_as_the_apis_conflict_was():
    message = "the call is already succeeded"
    assert _answer(Conflict(message)) == _answer(_DrfConflict(message))
    assert _answer(Conflict(message)) == (409, {"error": {"code": "conflict", "message": message, "fields": {}}})


# --- through the endpoints -----------------------------------------------------------------------

def test_cancelling_a_settled_call_is_a_409(world):
    settled = world.a.calls[0]
    assert settled.status == CallStatus.SUCCEEDED
    response = world.a.client("agent").post(f"/api/v1/calls/{settled.pk}/cancel")
    assert response.status_code == 409
    assert response.json() == {"error": {"code": "conflict", "message": "the call is already succeeded",
                                         "fields": {}}}


def test_a_reviewer_outside_the_requests_queue_gets_a_403(world):
    index_cache.clear()  # compiled rules are cached per process by tenant and policy version
    queue = queue_save(tenant=world.a.tenant, name="named", reviewers=[world.a.users["admin"]])
    rule_create(tenant=world.a.tenant, behavior="ask", tool_pattern="calculate", queue=queue)
    [call] = calls_submit(session=world.a.session, calls=[{"name": "calculate", "input": {"expression": "1+1"}}])
    assert call.status == CallStatus.AWAITING_APPROVAL, call.error
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    reviewer = APIClient()
    reviewer.force_login(world.a.users["reviewer"])
    response = reviewer.post(f"/api/v1/approvals/{request.pk}/decide", {"decision": "approve"}, format="json",
                             HTTP_X_TENANT=world.a.tenant.slug)
    index_cache.clear()
    assert response.status_code == 403
    assert response.json() == {"error": {"code": "permission_denied",
                                         "message": "you are not a reviewer of this request's queue", "fields": {}}}


def test_a_group_name_taken_is_a_400_on_its_field(world):
    response = world.a.client("admin").post("/api/v1/groups", {"name": "math"}, format="json")
    assert response.status_code == 400
    assert response.json() == {"error": {"code": "invalid", "message": "Some fields are invalid.",
                                         "fields": {"name": ["a group named 'math' exists"]}}}
