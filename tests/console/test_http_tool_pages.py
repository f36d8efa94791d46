"""The console's HTTP tool pages: declared form tests (tests/view_cases.py), another tool's id is no page here,
and no page ever shows a stored secret (its name only)."""
import json

import pytest
from django.urls import reverse

from tests.console.conftest import console_routes, console_url, page_text
from tests.view_cases import CreateCases, DeleteCases, EditCases
from tools.http_tools.services import http_tool_create
from tools.models import HttpEndpoint, Tool

pytestmark = pytest.mark.django_db

PUBLIC = "https://93.184.215.14"
SECRET = "page-5ecret-Http-4a9b"  # noqa: S105
SCHEMA = {"type": "object", "properties": {"repo": {"type": "string"}}, "required": ["repo"]}


def _endpoint(tw, name="repo_lookup", **fields) -> HttpEndpoint:
    tool = http_tool_create(tenant=tw.tenant, name=name, input_schema=SCHEMA, url=PUBLIC + "/repos/{repo}",
                            headers={"Authorization": "Bearer {secret:token}"}, secrets={"token": SECRET}, **fields)
    return HttpEndpoint.objects.for_tenant(tw.tenant).get(tool=tool)


def _form(**fields) -> dict:
    return {"name": "repo_lookup", "description": "Look a repository up.", "input_schema": json.dumps(SCHEMA),
            "method": "POST", "url": PUBLIC + "/repos/{repo}", "query": "", "body": "", "pointer": "",
            "headers": "Authorization: Bearer {secret:token}", "timeout_s": "30", "enabled": "on", **fields}


class TestHttpToolCreate(CreateCases):
    url_name = "console:http_tool_create"
    model = Tool
    audit_verb = "tool.created"
    success_url = "console:tool_detail"
    success_params = (("tool_id", "pk"),)

    def valid(self, world):
        return (_form(secrets=f"token: {SECRET}", query='{"n": "{repo}"}', pointer="/data", timeout_s="12"),
                {"name": "repo_lookup", "source": "http", "timeout_s": 12.0, "enabled": True})

    def invalid(self, world):
        return [
            (_form(url="http://127.0.0.1/x"), "is a loopback address"),
            (_form(url="https://{repo}.example.com/"), "not in the scheme or the host"),
            (_form(secrets=f"token {SECRET}"), "write Name: value"),
            (_form(), "names no stored secret"),  # the header names a secret not given
            (_form(secrets=f"token: {SECRET}", url=PUBLIC + "/{nope}"), "names no property"),
            (_form(secrets=f"token: {SECRET}", body="{not json"), "not valid JSON"),
            (_form(secrets=f"token: {SECRET}", name="calculate"), "exists"),
        ]


class TestHttpToolEdit(EditCases):
    url_name = "console:http_tool_edit"
    param = "http_tool_id"
    model = Tool
    audit_verb = "tool.updated"
    success_url = "console:tool_detail"
    success_params = (("tool_id", "pk"),)

    def target(self, tw):
        return _endpoint(tw)

    def saved(self, tw, before, obj):
        return Tool.objects.for_tenant(tw.tenant).get(pk=obj.tool_id)

    def valid(self, world):
        return (_form(description="Changed.", timeout_s="7", enabled="", method="GET"),
                {"description": "Changed.", "timeout_s": 7.0, "enabled": False, "source_ref": "GET " + PUBLIC
                 + "/repos/{repo}"})

    def invalid(self, world):
        return [
            (_form(url="https://93.184.215.99/repos/{repo}"), "send the secrets again"),
            (_form(method="GET", body='{"a": 1}'), "GET sends no body"),
            (_form(timeout_s="0"), "greater than or equal to 0.1"),
        ]


class TestHttpToolDelete(DeleteCases):
    url_name = "console:http_tool_delete"
    param = "http_tool_id"
    model = HttpEndpoint
    audit_verb = "tool.deleted"
    success_url = "console:tool_list"

    def target(self, tw):
        return _endpoint(tw)

    def done(self, tw, obj) -> bool:
        return not Tool.objects.for_tenant(tw.tenant).filter(pk=obj.tool_id).exists()


def test_secrets_are_set_removed_and_never_shown(world):
    a = world.a
    endpoint = _endpoint(a)
    tool = endpoint.tool
    client = a.console("operator")
    edit = reverse("console:http_tool_edit", kwargs={"tenant": a.tenant.slug, "http_tool_id": endpoint.pk})
    added = client.post(edit, _form(secrets="spare: spare-5ecret-value"))
    assert added.status_code == 302, added.content.decode()[:2000]
    assert HttpEndpoint.objects.for_tenant(a.tenant).get(tool=tool).secrets == {
        "token": SECRET, "spare": "spare-5ecret-value"}
    refused = client.post(edit, _form(secrets=f"other: {SECRET}-2", timeout_s="0"))
    assert refused.status_code == 400 and f"{SECRET}-2" not in refused.content.decode()
    removed = client.post(edit, _form(remove_secrets=["spare"]))
    assert removed.status_code == 302, removed.content.decode()[:2000]
    assert HttpEndpoint.objects.for_tenant(a.tenant).get(tool=tool).secrets == {"token": SECRET}

    pages = {}
    for name, params in console_routes():
        if set(params) <= {"tenant", "tool_id", "http_tool_id"}:  # the tool's pages and the tenant's lists
            url = console_url(name, params, a, ids={"tool_id": tool.pk, "http_tool_id": endpoint.pk})
            if (response := client.get(url)).status_code == 200:
                pages[url] = page_text(response)
    detail = pages[reverse("console:tool_detail", kwargs={"tenant": a.tenant.slug, "tool_id": tool.pk})]
    assert "data-http-endpoint" in detail and '<span class="tag">token</span>' in detail
    assert "Bearer {secret:token}" in detail  # the header's template, not its value
    assert "1 secret set (token)" in pages[edit]
    assert "New HTTP tool" in pages[reverse("console:tool_list", kwargs={"tenant": a.tenant.slug})]
    for url, html in pages.items():
        assert SECRET not in html and "spare-5ecret" not in html, url
