"""List pages cost a fixed number of queries, however many rows they show (docs/architecture.md)."""
import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.engine import index_cache
from tools.calls.submit import calls_submit
from tools.catalog.services import group_create, session_create
from tools.models import AgentSession, CallStatus, Tool, ToolCall

pytestmark = pytest.mark.django_db

PAGES = ["/t/acme/", "/t/acme/tools/", "/t/acme/groups/", "/t/acme/bindings/", "/t/acme/keys/",
         "/t/acme/sessions/", "/t/acme/calls/"]


def _queries(client, url) -> int:
    # Each page as on its first view: what pages cache (the dashboard's audit check, the process's rule index,
    # which outlives a test's rolled-back tenant of the same id) is made again.
    cache.clear()
    index_cache.clear()
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured.captured_queries)


def _grow(world, n):
    tenant = world.a.tenant
    for _ in range(n):
        number = Tool.objects.for_tenant(tenant).count()
        tool = Tool.objects.create(tenant=tenant, name=f"extra_{number}", source="external",
                                   input_schema={"type": "object", "properties": {}})
        group_create(tenant=tenant, name=f"g-{tool.pk}", tools=[tool])
        session = session_create(tenant=tenant, agent=f"bot-{tool.pk}")
        calls_submit(session=session, calls=[{"name": "no_such_tool", "input": {}}])


def test_list_pages_do_not_query_per_row(world):
    client = world.a.console("operator")
    _grow(world, 1)
    before = {url: _queries(client, url) for url in PAGES}
    _grow(world, 5)
    after = {url: _queries(client, url) for url in PAGES}
    assert after == before


# --- list pages leave the large JSON columns they do not show unread --------------------------------

def _sql(client, url) -> str:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
    return "\n".join(query["sql"] for query in captured.captured_queries)


def columns(model, *names) -> list[str]:
    return [f'"{model._meta.db_table}"."{model._meta.get_field(name).column}"' for name in names]


CALL_JSON = columns(ToolCall, "input", "effective_input", "decision", "result", "error")
SESSION_JSON = columns(AgentSession, "context", "state", "active_groups", "loaded_skills")
TOOL_JSON = columns(Tool, "input_schema", "output_schema")


def test_list_pages_do_not_read_json_columns_they_do_not_show(world):
    client = world.a.console("operator")
    session, call, tool = world.a.session, world.a.calls[0], world.a.tools["current_time"]
    calls_submit(session=session, calls=[{"name": "current_time", "input": {}}])
    pages = {
        "/t/acme/": CALL_JSON + SESSION_JSON,
        "/t/acme/calls/": CALL_JSON + SESSION_JSON,
        f"/t/acme/calls/?fragment=rows&call={call.pk}": CALL_JSON + SESSION_JSON,
        f"/t/acme/sessions/{session.pk}/": CALL_JSON,  # the page shows the session's own context
        "/t/acme/sessions/": SESSION_JSON,
        f"/t/acme/tools/{tool.pk}/": CALL_JSON + SESSION_JSON,
        "/t/acme/tools/": TOOL_JSON,
        "/t/acme/groups/": TOOL_JSON,
    }
    for url, unread in pages.items():
        sql = _sql(client, url)
        assert "SELECT" in sql, url
        read = [column for column in unread if column in sql]
        assert not read, (url, read)


def _nested(levels: int):
    value = 1
    for _ in range(levels):
        value = [value]
    return value


def test_list_pages_show_calls_whose_payloads_are_too_deep_to_load(world):
    # Rows stored before the parser capped nesting: loading one overflows the JSON decoder.
    deep = {"k": _nested(900)}
    session = session_create(tenant=world.a.tenant, agent="legacy")
    AgentSession.objects.for_tenant(world.a.tenant).filter(pk=session.pk).update(context=deep, state=deep)
    ToolCall.objects.create(tenant=world.a.tenant, session=world.a.session, call_id="legacy", tool_name="x",
                            tool=world.a.tools["current_time"], status=CallStatus.SUCCEEDED,
                            input=deep, effective_input=deep, result=deep, error=deep, decision=deep)
    client = world.a.console("viewer")
    tool = world.a.tools["current_time"]
    for url in ("/t/acme/", "/t/acme/calls/", f"/t/acme/sessions/{world.a.session.pk}/", "/t/acme/sessions/",
                f"/t/acme/tools/{tool.pk}/"):
        response = client.get(url)
        assert response.status_code == 200, url
        assert "legacy" in response.content.decode(), url
