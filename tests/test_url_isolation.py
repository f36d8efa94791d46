"""Every route, given the other tenant's ids, answers 404 and shows none of its data
(docs/notes/structure-and-testing.md).

The test walks the whole URL conf. A route under /api/ is requested with an API key of tenant A that
has every scope; a console route with A's admin logged in. Parameters are replaced by tenant B's ids
by name. A route whose parameter the test does not know, or a route outside the covered prefixes,
fails the test: a new route must come with coverage here.
"""
import json
import re
from dataclasses import dataclass, field

import pytest
from django.apps import apps
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.urls.resolvers import RegexPattern, RoutePattern
from rest_framework.test import APIClient

from audit.models import Event
from tenancy.models import ApiKey, Invitation, Membership
from tenancy.people.services import invitation_create
from tenancy.scoping import TenantOwned
from tenancy.services import apikey_create
from tests.console.conftest import page_text
from tests.identity.grants import connected_client
from tools.calls.submit import calls_submit
from tools.catalog.services import binding_set, group_create, session_create
from tools.models import AgentSession, BoundArgument, McpServer, Tool, ToolCall, ToolGroup
from tools.redaction.rules import redaction_rule_create
from tools.upstream.client import UpstreamTool
from tools.upstream.servers import mcp_server_create, mcp_tools_reconcile

# account/: a person's own pages, in no tenant (tests/tenancy/test_people.py, tests/identity/test_oauth_pages.py);
# oauth/: the consent page, which offers only the person's own tenants (tests/identity/test_oauth_pages.py);
# metrics: the deployment's scrape, in no tenant, with its own token (tests/toolkeeper/test_metrics.py,
# tests/test_entry_admission.py); integrations/: other services' signed requests, each naming its tenant's object by
# a public id alone, admitted as the member they act for (tests/approvals/test_slack_decisions.py)
SKIPPED_PREFIXES = ("admin/", "api/schema/", "api/docs/", "login/", "logout/", "account/", "oauth/", "metrics",
                    "integrations/")
API_PREFIX = "api/"
CONSOLE_PREFIXES = ("t/",)  # the console, the inbox and other apps' tenant pages
METHODS = ("get", "post", "put", "patch", "delete")
# A body that a create/update/submit/cancel endpoint would accept, so a 404 comes from the lookup.
API_BODY = {
    "name": "current_time", "input": {}, "enabled": False, "description": "walker", "tool": "current_time",
    "value": "UTC", "agent": "", "state": "success", "content": [], "decision": "approve", "message": "x",
}
CONSOLE_BODY = {"name": "walker", "description": "walker", "value": "\"UTC\"", "scopes": "agent"}

B_SESSION_USER = "bea@initech.example"
B_MARKER = "B-ONLY-7f3a91"


@dataclass
class Route:
    template: str  # the concatenated patterns, for messages
    name: str | None  # namespaced URL name
    params: list[str]
    callback: object
    view_cls: object = None
    methods: tuple = ()
    methods_known: bool = True


@dataclass
class Findings:
    problems: list = field(default_factory=list)

    def check(self, condition: bool, message: str):
        if not condition:
            self.problems.append(message)


def _pattern_params(pattern) -> list[str]:
    if isinstance(pattern, RoutePattern):
        return list(pattern.converters)
    if isinstance(pattern, RegexPattern):
        return list(pattern.regex.groupindex)
    return []


def walk(resolver=None, prefix="", namespace="", params=()):
    resolver = resolver or get_resolver()
    for entry in resolver.url_patterns:
        template = prefix + str(entry.pattern)
        found = [*params, *_pattern_params(entry.pattern)]
        if isinstance(entry, URLResolver):
            ns = namespace
            if entry.namespace:
                ns = f"{namespace}{entry.namespace}:"
            yield from walk(entry, template, ns, found)
        elif isinstance(entry, URLPattern):
            name = f"{namespace}{entry.name}" if entry.name else None
            yield _route(template, name, found, entry.callback)


def _route(template, name, params, callback) -> Route:
    route = Route(template=template, name=name, params=params, callback=callback)
    actions = getattr(callback, "actions", None)
    cls = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
    route.view_cls = cls
    if actions:
        route.methods = tuple(m for m in METHODS if m in actions)
    elif cls is not None:
        route.methods = tuple(m for m in METHODS if m in cls.http_method_names and hasattr(cls, m))
    else:  # a function view: it may allow only some methods (405 is then an acceptable answer)
        route.methods = ("get", "post")
        route.methods_known = False
    return route


def _model_of(route: Route):
    cls = route.view_cls
    model = getattr(cls, "model", None)
    if model is None and getattr(cls, "serializer_class", None) is not None:
        model = getattr(getattr(cls.serializer_class, "Meta", None), "model", None)
    return model


def _json_ids(value, found=None) -> set:
    found = set() if found is None else found
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "id" and isinstance(item, int | str):
                found.add(str(item))
            _json_ids(item, found)
    elif isinstance(value, list):
        for item in value:
            _json_ids(item, found)
    return found


def _governance_rows(tw, note: str) -> None:
    """Rows of the approvals app, when installed: an ask rule, its queue, and a pending approval request."""
    if not apps.is_installed("approvals"):
        return
    from approvals.services import rule_create

    rule_create(tenant=tw.tenant, behavior="ask", tool_pattern="countdown", note=note)
    session = session_create(tenant=tw.tenant, agent="walk-reviewed", user="reviewed@example.com")
    calls_submit(session=session, calls=[{"name": "reset_tools", "input": {"ops": True}}])
    session.refresh_from_db()
    calls_submit(session=session, calls=[{"id": "ask_me", "name": "countdown", "input": {"seconds": 1}}])
    from approvals.models import Grant, Queue

    # a reviewer's grant for the session (docs/governance.md, Grants)
    Grant.objects.create(tenant=tw.tenant, agent="walk-reviewed", tool_name="countdown", scope="session",
                         session=session, arg_match={"seconds": note}, created_by_label=note)
    from approvals.notifications import channel_save, channel_test, reviewer_setting_save

    # an email channel on the first queue, where the walker looks for one: its tests go to the locmem outbox
    queue = Queue.objects.for_tenant(tw.tenant).order_by("pk").first()
    channel = channel_save(queue=queue, name="walk", kind="email", events=["requested"])
    tw.users["admin"].email = f"admin@{tw.tenant.slug}.example.com"
    tw.users["admin"].save()
    channel_test(channel=channel, actor=tw.users["admin"])
    reviewer_setting_save(tenant=tw.tenant, user=tw.users["reviewer"], muted=True, excluded=[channel])


def _knowledge_rows(tw, marker: str) -> None:
    """Rows of the knowledge app, when installed: a dataset with one document."""
    if not apps.is_installed("knowledge"):
        return
    from knowledge.services import dataset_create, document_ingest

    dataset = dataset_create(tenant=tw.tenant, name="walk-data", description=f"{marker} dataset")
    document_ingest(tenant=tw.tenant, dataset=dataset, title=f"{marker} document", text=f"{marker} text")


def _mcp_rows(tw, marker: str) -> None:
    """An MCP server with a credential and a synced tool. Disabled, so a control request (sync, test) is refused
    without reaching out to anything."""
    server = mcp_server_create(tenant=tw.tenant, name="walk", transport="streamable_http",
                               url="https://93.184.215.14/mcp", headers={"Authorization": f"Bearer {marker}-token"},
                               include=[f"{marker}-tool", "search"])
    mcp_tools_reconcile(server=server, listed=[UpstreamTool(f"{marker}-tool", f"{marker} tool", {"type": "object"})])
    server.enabled = False
    server.save()


def _http_rows(tw, marker: str) -> None:
    """An HTTP tool with a secret, and an OAuth provider with a client (nothing here calls them)."""
    from tools.accounts.providers import provider_create
    from tools.http_tools.services import http_tool_create

    http_tool_create(tenant=tw.tenant, name="walk_http", description=f"{marker} http tool",
                     url="https://93.184.215.14/walk", headers={"Authorization": "Bearer {secret:token}"},
                     secrets={"token": f"{marker}-http-token"})
    provider_create(tenant=tw.tenant, name="walk", api_url="https://93.184.215.14/walk",
                    token_endpoint="https://93.184.215.14/token",
                    authorization_endpoint="https://93.184.215.14/authorize", scopes=f"{marker}-scope",
                    client={"client_id": f"{marker}-client", "client_secret": f"{marker}-client-secret"})


@pytest.fixture
def scene(world):
    a, b = world.a, world.b
    # Data only tenant B has, so its strings can be searched for in A's answers.
    AgentSession.objects.for_tenant(b.tenant).filter(pk=b.session.pk).update(user=B_SESSION_USER)
    b.session.refresh_from_db()
    group_create(tenant=b.tenant, name="globex-private", description=f"{B_MARKER} group", notes=f"{B_MARKER} notes",
                 tools=[b.tools["calculate"]])
    binding_set(tenant=b.tenant, tool=b.tools["calculate"], name="expression", value=f"{B_MARKER} value",
                agent="globex-agent")
    b_session2 = session_create(tenant=b.tenant, agent="globex-agent", user=B_SESSION_USER)
    calls_submit(session=b_session2, calls=[{"id": "b_call", "name": "reset_tools", "input": {"ops": True}}])
    for tw in (a, b):
        _governance_rows(tw, note=f"{B_MARKER} rule" if tw is b else "A rule")
        _knowledge_rows(tw, B_MARKER if tw is b else "A-only")
        _mcp_rows(tw, B_MARKER if tw is b else "A-only")
        _http_rows(tw, B_MARKER if tw is b else "A-only")
        redaction_rule_create(tenant=tw.tenant, name=f"{B_MARKER if tw is b else 'A-only'} rule", pattern="walk-\\d+")
        invitation_create(tenant=tw.tenant, email=f"{'b-only-7f3a91' if tw is b else 'a-only'}@example.com",
                          role="viewer")
        _oauth_grant(tw, B_MARKER if tw is b else "A-only")
    issued = apikey_create(tenant=a.tenant, name="walker", scopes=["agent", "external", "admin"])
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.key}")
    console = a.console("admin")
    api.raise_request_exception = False  # a crash is a finding of this test, reported with the others
    console.raise_request_exception = False

    b_strings = {b.tenant.slug, B_SESSION_USER, B_MARKER, str(b.session.pk), str(b_session2.pk)}
    b_strings |= {str(pk) for pk in ToolCall.objects.for_tenant(b.tenant).values_list("pk", flat=True)}
    b_strings |= {f"tk_{k.prefix}" for k in ApiKey.objects.for_tenant(b.tenant)}
    b_strings |= {k.prefix for k in ApiKey.objects.for_tenant(b.tenant)}
    b_strings |= {e.hash for e in Event.objects.for_tenant(b.tenant)}
    b_strings |= {i.email for i in Invitation.objects.for_tenant(b.tenant)}
    b_strings |= {m.user.username for m in Membership.objects.for_tenant(b.tenant).select_related("user")}
    assert not any(s in (a.tenant.slug, "") for s in b_strings)

    def ids(tw):
        first_call = ToolCall.objects.for_tenant(tw.tenant).filter(session=tw.session).order_by("created_at").first()
        return {
            "tenant": tw.tenant.slug,
            "session_id": str(tw.session.pk),
            "call_id": str(first_call.pk),
            "tool_id": tw.tools["current_time"].pk,
            "group_id": tw.groups["math"].pk,
            "binding_id": tw.binding.pk,
            "key_id": tw.key_objects["agent"].pk,
            "_tenant": tw.tenant,
        }

    return {"world": world, "api": api, "console": console, "b_strings": b_strings, "ids_a": ids(a),
            "ids_b": ids(b), "b_session2": b_session2}


# Model of a viewset route -> how to name that tenant's row for a `pk`/`id` parameter.
PK_BY_MODEL = {
    Tool: "tool_id",
    ToolGroup: "group_id",
    BoundArgument: "binding_id",
    ApiKey: "key_id",
    AgentSession: "session_id",
    ToolCall: "call_id",
}


def _api_kwargs(route: Route, ids: dict) -> dict:
    kwargs = {}
    for param in route.params:
        if param in ("session_id", "call_id"):
            kwargs[param] = ids[param]
        elif param in ("pk", "id"):
            kwargs[param] = _row_id(route, param, ids)
        else:
            raise LookupError(f"{route.template}: the isolation test does not know the parameter `{param}`")
    return kwargs


def _row_id(route: Route, param: str, ids: dict):
    model = _model_of(route)
    if model in PK_BY_MODEL:
        return ids[PK_BY_MODEL[model]]
    if model is None or not issubclass(model, TenantOwned):
        raise LookupError(f"{route.template}: the isolation test cannot tell what `{param}` names ({route.view_cls})")
    row = model.all_tenants.filter(tenant=ids["_tenant"]).order_by("pk").first()
    if row is None:
        raise LookupError(f"{route.template}: tenant {ids['_tenant'].slug} has no {model.__name__} row; "
                          "add one to the world fixture so the route can be checked")
    return row.pk


CONSOLE_PARAMS = ("tenant", "tool_id", "group_id", "binding_id", "key_id", "session_id", "call_id")
# Parameters of other apps' pages: the tenant's first row of the model.
PARAM_MODELS = {
    "rule_id": "approvals.PermissionRule",
    "queue_id": "approvals.Queue",
    "channel_id": "approvals.NotificationChannel",
    "request_id": "approvals.ApprovalRequest",
    "dataset_id": "knowledge.Dataset",
    "document_id": "knowledge.Document",
    "server_id": "tools.McpServer",
    "http_tool_id": "tools.HttpEndpoint",
    "oauth_provider_id": "tools.OAuthProvider",
    "skill_id": "skills.Skill",
    "redaction_rule_id": "tools.RedactionRule",
    "member_id": "tenancy.Membership",
    "invitation_id": "tenancy.Invitation",
    "grant_id": "tenancy.OAuthGrant",
    "approval_grant_id": "approvals.Grant",
}


def _oauth_grant(tw, marker: str) -> None:
    """An MCP client a member connected with OAuth (tenancy.oauth)."""
    connected_client(tenant=tw.tenant, user=tw.users["admin"], agent=f"{marker}-ide",
                     client_id=f"walker-{tw.tenant.slug}", name=f"{marker} IDE")


def _first_row(label: str, param: str, route: Route, tenant):
    try:
        model = apps.get_model(label)
    except LookupError:
        raise LookupError(f"{route.template}: the isolation test does not know the parameter `{param}`") from None
    row = model._base_manager.filter(tenant=tenant).order_by("pk").first()  # every tenant's rows
    if row is None:
        raise LookupError(f"{route.template}: tenant {tenant.slug} has no {model.__name__} row for `{param}`; "
                          "add one to the world fixture so the route can be checked")
    return row.pk


def _console_kwargs(route: Route, ids: dict, tenant_slug: str) -> dict:
    kwargs = {}
    for param in route.params:
        if param == "tenant":
            kwargs[param] = tenant_slug
        elif param in CONSOLE_PARAMS:
            kwargs[param] = ids[param]
        elif param in PARAM_MODELS:
            kwargs[param] = _first_row(PARAM_MODELS[param], param, route, ids["_tenant"])
        else:
            raise LookupError(f"{route.template}: the isolation test does not know the parameter `{param}`")
    return kwargs


# Console links to objects: /t/<slug>/<kind>/<id>/ — B's ids must never be linked from A's pages.
LINK = re.compile(r"/t/[\w-]+/(tools|groups|bindings|keys|sessions|calls|mcp-servers)/([\w-]+)/")
LINK_MODELS = {"tools": Tool, "groups": ToolGroup, "bindings": BoundArgument, "keys": ApiKey,
               "sessions": AgentSession, "calls": ToolCall, "mcp-servers": McpServer}
B_IDS: dict = {}  # model -> B's ids as strings, filled by the test


def _leaks(response, b_strings) -> list[str]:
    body = page_text(response)
    leaked = sorted(s for s in b_strings if s in body)
    if "html" in response.get("Content-Type", ""):
        for kind, ident in LINK.findall(body):
            if ident in B_IDS.get(LINK_MODELS[kind], ()):
                leaked.append(f"link to B's {kind} {ident}")
    location = response.get("Location", "")
    leaked += sorted(f"Location:{s}" for s in b_strings if s in location)
    return leaked


def _request(client, method: str, url: str, *, api: bool):
    if api:
        if method in ("get", "delete"):
            return getattr(client, method)(url)
        return getattr(client, method)(url, API_BODY, format="json")
    if method == "get":
        return client.get(url)
    if method == "post":
        return client.post(url, CONSOLE_BODY)
    return getattr(client, method)(url)


def _follow(client, response, limit=5):
    seen = []
    while response.status_code in (301, 302, 303, 307, 308) and limit:
        location = response["Location"]
        if location in seen:
            raise AssertionError(f"redirect loop through {seen + [location]}")
        seen.append(location)
        response = client.get(location)
        limit -= 1
    return response


def _check_foreign(findings, client, route, url, b_strings, *, api):
    for method in route.methods:
        response = _request(client, method, url, api=api)
        allowed_405 = not route.methods_known and response.status_code == 405
        findings.check(response.status_code == 404 or allowed_405,
                       f"{method.upper()} {url} ({route.name}) answered {response.status_code}, expected 404")
        leaked = _leaks(response, b_strings)
        findings.check(not leaked, f"{method.upper()} {url} ({route.name}) shows tenant B data: {leaked}")
        if api and response.status_code == 404:
            findings.check(set(response.json()) == {"error"}, f"{method.upper()} {url}: 404 outside the envelope")


def _check_own_list(findings, client, route, url, b_strings, *, api, b_ids_by_model):
    for method in route.methods:
        response = _request(client, method, url, api=api)
        if method == "get":
            if not api:
                response = _follow(client, response)
            findings.check(response.status_code == 200, f"GET {url} ({route.name}) answered {response.status_code}")
        else:
            findings.check(response.status_code < 500, f"{method.upper()} {url} answered {response.status_code}")
        leaked = _leaks(response, b_strings)
        findings.check(not leaked, f"{method.upper()} {url} ({route.name}) shows tenant B data: {leaked}")
        if api and "json" in response.get("Content-Type", "") and response.content:
            model = _model_of(route)
            if model is not None and model in b_ids_by_model:
                foreign = _json_ids(json.loads(response.content)) & b_ids_by_model[model]
                findings.check(not foreign, f"{method.upper()} {url} lists tenant B's {model.__name__} ids {foreign}")


def _b_ids_by_model(tenant) -> dict:
    models = {m for m in apps.get_models() if issubclass(m, TenantOwned)}
    return {m: {str(pk) for pk in m.all_tenants.filter(tenant=tenant).values_list("pk", flat=True)} for m in models}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_every_route_is_covered_and_isolated(scene):
    world = scene["world"]
    b_strings = scene["b_strings"]
    b_ids_by_model = _b_ids_by_model(world.b.tenant)
    B_IDS.clear()
    B_IDS.update(b_ids_by_model)
    findings = Findings()
    controls = []
    covered = 0
    for route in walk():
        if route.template.startswith(SKIPPED_PREFIXES):
            continue
        is_api = route.template.startswith(API_PREFIX)
        is_console = route.template.startswith(CONSOLE_PREFIXES) or route.template in ("", "^$")
        if not (is_api or is_console):
            findings.problems.append(f"route {route.template!r} ({route.name}) is not covered by the isolation test")
            continue
        if route.name is None:
            findings.problems.append(f"route {route.template!r} has no name: name it so the test can reverse it")
            continue
        if not route.methods:
            findings.problems.append(f"route {route.template!r}: cannot tell which methods it allows")
            continue
        covered += 1
        try:
            if is_api:
                foreign = [_api_kwargs(route, scene["ids_b"])] if route.params else []
                own = _api_kwargs(route, scene["ids_a"])
            else:
                foreign = []
                if route.params:
                    foreign.append(_console_kwargs(route, scene["ids_b"], world.b.tenant.slug))
                    if any(p != "tenant" for p in route.params):
                        foreign.append(_console_kwargs(route, scene["ids_b"], world.a.tenant.slug))
                own = _console_kwargs(route, scene["ids_a"], world.a.tenant.slug)
        except LookupError as exc:
            findings.problems.append(str(exc))
            continue
        client = scene["api"] if is_api else scene["console"]
        for kwargs in foreign:
            _check_foreign(findings, client, route, reverse(route.name, kwargs=kwargs), b_strings, api=is_api)
        if route.params and route.params != ["tenant"]:
            controls.append((route, reverse(route.name, kwargs=own), client, is_api))
        else:
            # A's own page or list (no foreign id in the URL): answers, and shows none of B's data.
            _check_own_list(findings, client, route, reverse(route.name, kwargs=own), b_strings, api=is_api,
                            b_ids_by_model=b_ids_by_model)
            if route.params == ["tenant"]:
                _check_foreign(findings, client, route, reverse(route.name, kwargs={"tenant": world.b.tenant.slug}),
                               b_strings, api=is_api)
    # Controls last (they may change A's rows): with A's own ids the same routes do not answer 404, so
    # the 404s above come from the tenant check, not from a broken route.
    second_pass = []
    for route, url, client, is_api in controls:
        method = "get" if "get" in route.methods else route.methods[0]
        if method == "delete":
            continue
        response = _request(client, method, url, api=is_api)
        if method == "get" and response.status_code == 405 and not route.methods_known:
            second_pass.append((route, url, client, is_api))  # a POST-only view: tried after every GET
            continue
        if method == "get":
            findings.check(response.status_code == 200, f"control GET {url} answered {response.status_code}")
        else:
            findings.check(response.status_code not in (404, 405) and response.status_code < 500,
                           f"control {method.upper()} {url} answered {response.status_code}")
    for _route, url, client, is_api in second_pass:
        response = _request(client, "post", url, api=is_api)
        findings.check(response.status_code not in (404, 405) and response.status_code < 500,
                       f"control POST {url} answered {response.status_code}")
    assert covered >= 12, f"the walker found only {covered} routes"
    assert not findings.problems, "\n".join(findings.problems)


def test_walker_sees_the_api_and_console_routes():
    names = {route.name for route in walk()}
    for expected in ("api:session-detail", "api:session-calls", "api:call-detail", "api:call-cancel",
                     "api:tool-detail", "api:group-list", "api:binding-detail", "api:audit-list", "console:dashboard",
                     "api:mcp-server-detail", "api:mcp-server-sync", "api:mcp-server-test", "console:mcp_server_detail",
                     "console:mcp_server_sync"):
        assert expected in names


def test_console_session_on_the_api_cannot_name_a_foreign_tenant(world):
    client = APIClient()
    client.force_login(world.a.users["admin"])
    own = client.get("/api/v1/groups", HTTP_X_TENANT=world.a.tenant.slug)
    assert own.status_code == 200
    names = {g["name"] for g in own.json()["results"]}
    assert "math" in names
    foreign = client.get("/api/v1/groups", HTTP_X_TENANT=world.b.tenant.slug)
    assert foreign.status_code == 403
    assert world.b.tenant.slug not in foreign.content.decode()
    detail = client.get(f"/api/v1/groups/{world.b.groups['math'].pk}", HTTP_X_TENANT=world.a.tenant.slug)
    assert detail.status_code == 404


def test_foreign_tool_names_are_not_accepted_in_bodies(world):
    b_only = Tool.objects.create(tenant=world.b.tenant, name="globex_only", source="external",
                                 input_schema={"type": "object", "properties": {"q": {"type": "string"}}})
    client = world.a.client("admin")
    group = client.post("/api/v1/groups", {"name": "steal", "tools": [b_only.name]}, format="json")
    assert group.status_code == 400
    assert "tools" in group.json()["error"]["fields"]
    binding = client.post("/api/v1/bindings", {"tool": b_only.name, "name": "q", "value": "x"}, format="json")
    assert binding.status_code == 400
    assert not ToolGroup.objects.for_tenant(world.a.tenant).filter(name="steal").exists()
    assert not BoundArgument.objects.for_tenant(world.b.tenant).filter(name="q").exists()
