"""The tenancy guards' finer promises (docs/governance.md, docs/notes/structure-and-testing.md): what a refusal says,
that a guarded query still takes
every argument Django's does, and that model validation checks uniqueness across the table without tripping
the tenant scope."""
import time
from types import SimpleNamespace

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ValidationError
from django.db.models import Count, Max, Q
from django.http import Http404
from django.utils import timezone
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request
from rest_framework.test import APIClient, APIRequestFactory

from tenancy.entry.authentication import CHECKED_KEY_SCOPE, ApiKeyAuthentication, bearer_token
from tenancy.models import SYSTEM_AGENT, ApiKey, Membership, Role, Tenant
from tenancy.permissions import (
    HasTenant,
    console_requirement,
    console_roles,
    required_scopes,
    sees_secrets,
)
from tenancy.scoping import TenantScopeError
from tenancy.selectors import (
    access_object,
    access_row,
    access_tenant,
    apikey_from_token,
    key_sees_agent,
    key_sessions,
    membership_of,
    memberships_of,
    versions_read_with,
)
from tenancy.services import apikey_create, apikey_revoke
from tenancy.versions import versioned_models
from tools.catalog.services import session_create
from tools.models import AgentSession, BoundArgument, Tool, ToolCall


def test_for_tenant_without_a_tenant_says_so(world):
    with pytest.raises(TenantScopeError) as refused:
        Tool.objects.for_tenant(None)
    assert str(refused.value) == "for_tenant() needs a tenant"


def test_an_unscoped_query_names_its_model(world):
    with pytest.raises(TenantScopeError) as refused:
        Tool.objects.count()
    assert str(refused.value) == "unscoped query on Tool: name the tenant"


def test_scoped_aggregate_takes_positional_and_named_aggregates(world):
    tools = Tool.objects.for_tenant(world.a.tenant)
    expected = len(world.a.tools)
    assert tools.aggregate(Count("pk")) == {"pk__count": expected}
    assert tools.aggregate(n=Count("pk")) == {"n": expected}
    assert tools.aggregate(Count("pk"), top=Max("name")) == {"pk__count": expected, "top": max(world.a.tools)}


def test_scoped_iterator_passes_its_chunk_size_on(world):
    """Django needs a chunk size to prefetch while iterating; the guard must not drop it."""
    tools = Tool.objects.for_tenant(world.a.tenant).prefetch_related("groups").order_by("name")
    names = [(tool.name, sorted(g.name for g in tool.groups.all())) for tool in tools.iterator(chunk_size=2)]
    assert [name for name, _ in names] == sorted(world.a.tools)
    assert dict(names)["calculate"] == ["math"]


def _copy_of(api_key: ApiKey) -> ApiKey:
    return ApiKey(tenant=api_key.tenant, name="copy", prefix=api_key.prefix, secret_hash=api_key.secret_hash,
                  scopes=list(api_key.scopes))


def test_full_clean_reports_a_taken_unique_field(world):
    """A unique field is checked across the whole table (another tenant's key holds the prefix) and refused
    as a validation error, not as an unscoped query."""
    copy = _copy_of(world.b.key_objects["agent"])
    copy.tenant = world.a.tenant
    with pytest.raises(ValidationError) as refused:
        copy.full_clean()
    assert refused.value.message_dict == {"prefix": ["Api key with this Prefix already exists."]}


def test_full_clean_skips_the_unique_fields_it_is_told_to_exclude(world):
    copy = _copy_of(world.a.key_objects["agent"])
    copy.full_clean(exclude=["prefix"])
    copy.validate_unique(exclude=["prefix"])


def test_full_clean_reports_a_violated_constraint(world):
    taken = world.a.binding
    copy = BoundArgument(tenant=taken.tenant, tool=taken.tool, agent=taken.agent, name=taken.name, value="UTC")
    with pytest.raises(ValidationError) as refused:
        copy.full_clean()
    assert refused.value.message_dict == {
        "__all__": ["Bound argument with this Tool, Agent and Name already exists."]}


def test_full_clean_skips_the_constraints_on_excluded_fields(world):
    taken = world.a.binding
    copy = BoundArgument(tenant=taken.tenant, tool=taken.tool, agent=taken.agent, name=taken.name, value="UTC")
    copy.full_clean(exclude=["name"])
    copy.validate_constraints(exclude=["name"])


# -- selectors --

def test_a_key_comes_with_its_tenant_and_its_tenants_versions(world, django_assert_num_queries):
    """One statement reads the key, its tenant and the configuration versions a request checks its caches by."""
    catalog, policy = versioned_models()
    catalog.all_tenants.filter(tenant=world.a.tenant).update(version=7)
    policy.all_tenants.filter(tenant=world.a.tenant).delete()  # a missing version row is version 0
    with django_assert_num_queries(1):
        api_key = apikey_from_token(world.a.keys["agent"])
        assert api_key.tenant.slug == world.a.tenant.slug
    assert api_key.pk == world.a.key_objects["agent"].pk
    versions, read_at = versions_read_with(api_key)
    assert versions == {catalog: 7, policy: 0}
    assert 0 < read_at <= time.monotonic()


def test_a_row_read_without_versions_has_none(world):
    assert versions_read_with(world.a.key_objects["agent"]) == (None, 0.0)


def test_only_an_active_key_with_its_own_secret_is_found(world):
    key = world.a.keys["agent"]
    prefix = world.a.key_objects["agent"].prefix
    assert apikey_from_token("not a key") is None
    assert apikey_from_token(f"tk_{'0' * len(prefix)}_{key.rsplit('_', 1)[1]}") is None  # no such prefix
    assert apikey_from_token(f"tk_{prefix}_wrong") is None
    assert apikey_from_token(f"tk_{world.b.key_objects['agent'].prefix}_{key.split('_', 2)[2]}") is None
    apikey_revoke(api_key=world.a.key_objects["agent"])
    assert apikey_from_token(key) is None


def test_memberships_of_lists_the_users_tenants_by_slug_in_one_query(world, django_assert_num_queries):
    user = world.a.users[Role.REVIEWER]
    zeta = Tenant.objects.create(slug="zeta", name="Zeta")
    alpha = Tenant.objects.create(slug="alpha", name="Alpha")
    for tenant in (zeta, alpha):
        Membership.objects.create(user=user, tenant=tenant, role=Role.VIEWER)
    with django_assert_num_queries(1):
        slugs = [membership.tenant.slug for membership in memberships_of(user)]
    assert slugs == ["acme", "alpha", "zeta"]
    assert memberships_of(AnonymousUser()) == []


def test_membership_of_is_the_users_own_in_that_tenant(world):
    reviewer = world.a.users[Role.REVIEWER]
    membership = membership_of(reviewer, world.a.tenant)
    assert (membership.user_id, membership.tenant_id, membership.role) == (reviewer.pk, world.a.tenant.pk,
                                                                           Role.REVIEWER)
    assert membership_of(reviewer, world.b.tenant) is None
    assert membership_of(AnonymousUser(), world.a.tenant) is None


def test_access_tenant_reads_the_membership_with_its_tenant(world, django_assert_num_queries):
    admin = world.a.users["admin"]
    with django_assert_num_queries(1):
        tenant, membership = access_tenant(admin, "acme")
        assert (tenant.slug, membership.tenant.slug, membership.user_id) == ("acme", "acme", admin.pk)
    for user, slug in ((admin, "globex"), (AnonymousUser(), "acme"), (admin, "nowhere")):
        with pytest.raises(Http404) as refused:
            access_tenant(user, slug)
        assert str(refused.value) == "no such tenant"


def test_access_object_applies_its_conditions_and_filters(world):
    tenant, tool = world.a.tenant, world.a.tools["current_time"]
    assert access_object(Tool, tenant, tool.pk) == tool
    assert access_object(Tool, tenant, tool.pk, Q(name="current_time"), enabled=True) == tool
    for conditions, filters in (((Q(name="other"),), {}), ((), {"name": "other"})):
        with pytest.raises(Http404) as refused:
            access_object(Tool, tenant, tool.pk, *conditions, **filters)
        assert str(refused.value) == "no such tool"
    for pk in (world.b.tools["current_time"].pk, "zzz"):
        with pytest.raises(Http404) as refused:
            access_object(Tool, tenant, pk)
        assert str(refused.value) == "no such tool"


def test_access_row_returns_the_tenants_allowed_row_only(world):
    tenant, call = world.a.tenant, world.a.calls[0]
    assert access_row(ToolCall, tenant, call.pk).pk == call.pk
    assert access_row(ToolCall, tenant, call.pk, allowed=lambda row: row.call_id == "call_time").pk == call.pk
    refusals = [(call.pk, lambda row: row.call_id == "other"), (world.b.calls[0].pk, None),
                (world.b.calls[0].pk, lambda row: True), ("zzz", None)]
    for pk, allowed in refusals:
        with pytest.raises(Http404) as refused:
            access_row(ToolCall, tenant, pk, allowed=allowed)
        assert str(refused.value) == "no such tool call"


def test_key_sessions_and_key_sees_agent_agree(world):
    """A key locked to an agent sees that agent's sessions; only an admin-scoped key sees the system session."""
    tenant = world.a.tenant
    session_create(tenant=tenant, agent="billing-bot", user="x@example.com")
    AgentSession.objects.create(tenant=tenant, agent=SYSTEM_AGENT, user="", context={"system": True})
    agents = {"billing-bot", "support-bot", SYSTEM_AGENT}
    locked_admin = apikey_create(tenant=tenant, name="locked-admin", scopes=["admin"], agent="support-bot").api_key
    billing = apikey_create(tenant=tenant, name="billing", scopes=["agent"], agent="billing-bot").api_key
    expected = [(world.a.key_objects["agent"], {"billing-bot", "support-bot"}),
                (world.a.key_objects["locked"], {"support-bot"}), (world.a.key_objects["admin"], agents),
                (locked_admin, {"support-bot"}), (billing, {"billing-bot"})]
    for api_key, seen in expected:
        sessions = AgentSession.objects.for_tenant(tenant).filter(key_sessions(api_key))
        assert set(sessions.values_list("agent", flat=True)) == seen, api_key.name
        assert {agent for agent in agents if key_sees_agent(api_key, agent)} == seen, api_key.name
        calls = ToolCall.objects.for_tenant(tenant).filter(key_sessions(api_key, prefix="session__"))
        assert calls.count() == (len(world.a.calls) if "support-bot" in seen else 0), api_key.name


# -- authentication --

@pytest.mark.parametrize(("header", "token"), [
    ("Bearer abc", "abc"), ("bearer abc", "abc"), ("BEARER  abc ", "abc"), ("Bearer x y", "x y"),
    ("Basic abc", None), ("Bearer", None), ("Bearer   ", None), ("Bearerabc", None),
])
def test_bearer_token_reads_the_token_of_a_bearer_header(header, token):
    assert bearer_token(header) == token


def _api_request(header: str | None = None, tenant: str | None = None):
    extra = {"HTTP_AUTHORIZATION": header} if header is not None else {}
    if tenant is not None:
        extra["HTTP_X_TENANT"] = tenant
    return Request(APIRequestFactory().get("/api/v1/x", **extra))


def test_a_key_authenticates_as_its_tenant(world):
    request = _api_request(f"Bearer {world.a.keys['agent']}")
    principal, api_key = ApiKeyAuthentication().authenticate(request)
    assert api_key.pk == world.a.key_objects["agent"].pk
    assert principal.api_key is api_key
    assert str(principal) == principal.username == "apikey:agent"
    assert request.tenant == world.a.tenant
    assert request.membership is None


@pytest.mark.parametrize(("header", "message"), [
    ("Basic abc", "Use 'Authorization: Bearer <api key>'."), ("Bearer tk_nope_nope", "Invalid or revoked API key."),
])
def test_a_bad_authorization_header_is_refused_with_its_reason(world, header, message):
    with pytest.raises(AuthenticationFailed) as refused:
        ApiKeyAuthentication().authenticate(_api_request(header))
    assert refused.value.detail == message


def test_no_authorization_header_leaves_the_request_to_other_authenticators(world):
    assert ApiKeyAuthentication().authenticate(_api_request()) is None


def test_the_key_the_http_entry_checked_is_not_looked_up_again(world, django_assert_num_queries):
    """toolkeeper.handlers leaves (token, key) in the ASGI scope: the request uses that key as it is."""
    token, checked = world.a.keys["agent"], world.a.key_objects["agent"]
    checked.last_used_at = timezone.now()  # touched a moment ago: no write either
    request = _api_request(f"Bearer {token}")
    request._request.scope = {CHECKED_KEY_SCOPE: (token, checked)}
    with django_assert_num_queries(0):
        _, api_key = ApiKeyAuthentication().authenticate(request)
    assert api_key is checked
    other = _api_request(f"Bearer {world.b.keys['agent']}")  # a scope for another token does not count
    other._request.scope = {CHECKED_KEY_SCOPE: (token, checked)}
    assert ApiKeyAuthentication().authenticate(other)[1].pk == world.b.key_objects["agent"].pk


LIMITS = "/api/v1/limits"


def test_a_console_session_needs_a_tenant_it_belongs_to(world):
    reviewer = world.a.users[Role.REVIEWER]
    client = APIClient()
    client.force_login(reviewer)
    XXXX = Tenant.objects.create(slug="XXXX", name="Default-looking")  # noqa: N806
    Membership.objects.create(user=reviewer, tenant=XXXX, role=Role.ADMIN)
    for tenant in (None, "", "globex", "nowhere"):
        extra = {} if tenant is None else {"HTTP_X_TENANT": tenant}
        response = client.get(LIMITS, **extra)
        assert response.status_code == 403, tenant
        assert response.json()["error"]["message"] == "Name a tenant you belong to in the X-Tenant header.", tenant
    assert client.get(LIMITS, HTTP_X_TENANT="acme").status_code == 200


# -- permissions --

class View:
    def __init__(self, **attributes):
        self.__dict__.update(attributes)


def test_required_scopes_default_to_admin_and_take_one_or_several():
    assert required_scopes(View()) == ("admin",)
    assert required_scopes(View(required_scope="agent")) == ("agent",)
    assert required_scopes(View(required_scope=("agent", "external"))) == ("agent", "external")


@pytest.mark.parametrize(("view", "method", "requirement", "roles"), [
    (View(), "GET", "member", ("admin", "operator", "reviewer", "viewer")),
    (View(required_scope=("agent", "admin")), "HEAD", "member", ("admin", "operator", "reviewer", "viewer")),
    (View(), "POST", "can_operate", ("admin", "operator")),
    (View(required_scope="agent"), "GET", "can_operate", ("admin", "operator")),
    (View(action="decide", reviewer_actions=("decide",)), "POST", "can_review", ("admin", "operator", "reviewer")),
    (View(action="list", reviewer_actions=("decide",)), "GET", "member", ("admin", "operator", "reviewer", "viewer")),
    (View(action="destroy", reviewer_actions=("decide",)), "DELETE", "can_operate", ("admin", "operator")),
])
def test_console_requirement_and_roles(view, method, requirement, roles):
    assert console_requirement(view, method) == requirement
    assert console_roles(view, method) == roles


def _request(**attributes):
    return SimpleNamespace(**{"auth": None, "method": "GET", **attributes})


def test_has_tenant_admits_keys_by_scope_and_members_by_role(world):
    a = world.a
    agent_view, admin_view = View(required_scope="agent"), View()
    either = View(required_scope=("external", "agent"))
    member = {role: membership_of(a.users[role], a.tenant) for role in ("admin", Role.OPERATOR, Role.VIEWER)}
    cases = [
        (_request(auth=a.key_objects["agent"]), agent_view, False),  # no tenant: nobody is admitted
        (_request(membership=member["admin"]), admin_view, False),
        (_request(tenant=a.tenant, auth=a.key_objects["agent"]), agent_view, True),
        (_request(tenant=a.tenant, auth=a.key_objects["agent"]), either, True),
        (_request(tenant=a.tenant, auth=a.key_objects["external"]), agent_view, False),
        (_request(tenant=a.tenant, auth=a.key_objects["admin"]), admin_view, True),
        (_request(tenant=a.tenant), admin_view, False),
        (_request(tenant=a.tenant, membership=member[Role.VIEWER]), admin_view, True),
        (_request(tenant=a.tenant, membership=member[Role.VIEWER], method="POST"), admin_view, False),
        (_request(tenant=a.tenant, membership=member[Role.OPERATOR], method="POST"), admin_view, True),
        (_request(tenant=a.tenant, membership=member["admin"], method="POST"), agent_view, True),
    ]
    for request, view, admitted in cases:
        assert HasTenant().has_permission(request, view) is admitted, (request, view.__dict__)


def test_has_tenant_says_why_it_refused(world):
    a = world.a
    refusal = HasTenant()
    assert not refusal.has_permission(_request(tenant=a.tenant, auth=a.key_objects["external"]), View())
    assert refusal.message == "This API key lacks the scope this endpoint needs."
    viewer = membership_of(a.users[Role.VIEWER], a.tenant)
    assert not refusal.has_permission(_request(tenant=a.tenant, membership=viewer, method="PATCH"), View())
    assert refusal.message == "Your role in this tenant does not allow this."


def test_sees_secrets_is_for_operators_admins_and_admin_keys(world):
    a = world.a
    assert sees_secrets(_request(auth=a.key_objects["admin"]))
    assert not sees_secrets(_request(auth=a.key_objects["agent"]))
    assert not sees_secrets(_request())
    for role, sees in (("admin", True), (Role.OPERATOR, True), (Role.REVIEWER, False), (Role.VIEWER, False)):
        assert sees_secrets(_request(membership=membership_of(a.users[role], a.tenant))) is sees, role
