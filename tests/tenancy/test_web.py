"""The web helpers every app's pages use (`tenancy.web`, `tenancy.editing`) live below the apps: no app
imports the console, which stays the top layer."""
import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
from django import forms
from django.core.exceptions import ImproperlyConfigured
from django.urls import get_resolver, resolve, reverse

from common.errors import ServiceError
from tenancy.editing import ObjectActionView, ObjectDeleteView, ObjectFormView
from tenancy.models import ApiKey
from tenancy.web import URL_OBJECTS, acting_user, add_service_errors, register_url_objects, service_messages
from tools.models import ToolCall

ROOT = Path(__file__).resolve().parents[2]
# Every package but the console itself; the project package only names it in settings and the URL conf.
LOWER = ["platform/tenancy", "platform/audit", "platform/realtime", "platform/toolkeeper", "tools", "approvals",
         "skills", "knowledge"]


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_app_imports_the_console():
    importers = []
    for package in LOWER:
        for path in sorted((ROOT / package).rglob("*.py")):
            if any(name == "console" or name.startswith("console.") for name in _imported_modules(path)):
                importers.append(str(path.relative_to(ROOT)))
    assert importers == []


class _Form(forms.Form):
    name = forms.CharField()


@pytest.mark.parametrize("detail, on_name, on_top", [
    ({"name": ["taken"], "other": "bad"}, ["taken"], ["bad"]),
    (["first", "second"], [], ["first", "second"]),
    ("plain", [], ["plain"]),
])
def test_a_service_refusal_lands_on_its_field_or_on_top(detail, on_name, on_top):
    form = _Form({"name": "x"})
    assert form.is_valid()
    add_service_errors(form, ServiceError(detail))
    assert form.errors.get("name", []) == on_name
    assert form.non_field_errors() == on_top
    assert service_messages(ServiceError(detail)) == on_name + on_top


def test_a_url_parameter_names_one_thing():
    assert get_resolver().url_patterns  # the URL confs declare their parameters when they load
    assert URL_OBJECTS["call_id"] == (ToolCall, "call")  # declared by the console and by the inbox alike
    register_url_objects({"call_id": (ToolCall, "call")})
    with pytest.raises(ImproperlyConfigured):
        register_url_objects({"call_id": (ToolCall, "tool_call")})
    assert URL_OBJECTS["call_id"] == (ToolCall, "call")


def test_the_acting_user_of_a_key_is_the_key():
    user = SimpleNamespace(username="acme-admin")
    assert acting_user(SimpleNamespace(user=user)) is user  # a console request has no `auth`
    assert acting_user(SimpleNamespace(user=user, auth=None)) is user
    assert acting_user(SimpleNamespace(user=user, auth=ApiKey(name="ci"))) == "apikey:ci"


@pytest.mark.parametrize("name, kwargs, view, methods", [
    ("console:group_create", {}, ObjectFormView, {"get", "post"}),
    ("console:group_delete", {"group_id": 1}, ObjectDeleteView, {"get", "post"}),
    ("console:binding_delete", {"binding_id": 1}, ObjectDeleteView, {"get", "post"}),
    ("console:apikey_revoke", {"key_id": 1}, ObjectDeleteView, {"get", "post"}),
    ("inbox:rule_edit", {"rule_id": 1}, ObjectFormView, {"get", "post"}),
    ("knowledge:document_delete", {"document_id": 1}, ObjectActionView, {"post"}),
])
def test_generic_pages_show_the_url_walk_which_methods_they_take(name, kwargs, view, methods):
    callback = resolve(reverse(name, kwargs={"tenant": "acme", **kwargs})).func
    assert issubclass(callback.view_class, view)
    assert {m for m in ("get", "post", "put", "patch", "delete") if hasattr(callback.view_class, m)} == methods
