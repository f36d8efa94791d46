from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from audit.api.views import AuditVerifyView, AuditViewSet
from tenancy.api.urls import urlpatterns as tenancy_api
from tenancy.oauth import pages as oauth_pages
from tenancy.people import pages as people_pages
from tenancy.signin import pages as signin_pages
from toolkeeper.metrics import metrics_view
from tools.accounts import pages as account_pages

api_v1 = [
    path("", include("tools.api.urls")),
    path("", include("approvals.api.urls")),
    path("", include("knowledge.api.urls")),
    path("", include("skills.api.urls")),
    *tenancy_api,
    path("audit", AuditViewSet.as_view({"get": "list"}), name="audit-list"),
    path("audit/verify", AuditVerifyView.as_view(), name="audit-verify"),
]

urlpatterns = [
    path("api/v1/", include((api_v1, "api"), namespace="api")),
    path("api/schema/", SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[]),
         name="schema"),
    # The split view serves Swagger UI's start-up script as a file: no inline script (common.csp).
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema", authentication_classes=[],
                                                          permission_classes=[]), name="swagger-ui"),
    # one sign-in page for the console and the admin site: the deployment's ways in are all there
    path("admin/login/", RedirectView.as_view(pattern_name="login", query_string=True)),
    path("admin/", admin.site.urls),
    path("login/", signin_pages.SignInView.as_view(), name="login"),
    path("login/sso/", signin_pages.signin_start, name="signin_start"),
    path("login/sso/callback/", signin_pages.signin_callback, name="signin_callback"),
    path("login/sso/logout/", signin_pages.signin_backchannel_logout, name="signin_backchannel_logout"),
    path("logout/", signin_pages.SignOutView.as_view(), name="logout"),
    # a person's own pages, outside any tenant
    path("account/profile/", people_pages.profile, name="profile"),
    path("account/invitations/<str:token>/", people_pages.invitation_accept, name="invitation_accept"),
    path("account/connections/", oauth_pages.connections, name="oauth_connections"),
    path("account/connections/<int:grant_id>/disconnect/", oauth_pages.connection_revoke,
         name="oauth_connection_revoke"),
    # the consent page of Toolkeeper's authorization server (its endpoints: tools.gateway.oauth)
    path("oauth/consent/", oauth_pages.consent, name="oauth_consent"),
    path("account/upstream/callback/", account_pages.accounts_callback, name="accounts_callback"),
    path("oauth/upstream-client.json", account_pages.accounts_client_document, name="accounts_client_document"),
    # Prometheus's scrape: a bearer token's, outside any tenant (404 unless configured; docs/observability.md)
    path("metrics", metrics_view, name="metrics"),
    # Slack's interactivity requests (approvals.slack): signed by Slack, outside any login
    path("integrations/", include("approvals.integration_urls")),
    path("t/<slug:tenant>/", include("approvals.urls")),
    path("t/<slug:tenant>/knowledge/", include("knowledge.urls")),
    path("t/<slug:tenant>/skills/", include("skills.urls")),
    path("", include("console.urls")),
]
