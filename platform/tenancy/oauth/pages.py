"""The consent page, where a signed-in person lets an MCP client act for them as an agent of one of their
tenants, and the page of their connected clients, where they disconnect one (docs/identity.md, "OAuth for MCP
clients")."""
from __future__ import annotations

from urllib.parse import urlsplit

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST
from mcp.server.auth.provider import construct_redirect_uri

from common.csp import HEADER, console_policy
from common.errors import RateLimited, ServiceError
from tenancy.entry.limits import requests_admit
from tenancy.models import OAuthGrant, Scope
from tenancy.oauth import services
from tenancy.oauth.consent import consent_from
from tenancy.selectors import issuer
from tenancy.web import INVALID_STATUS, add_service_errors, rate_limited_page

EXPIRED = "This request to connect a client has expired or was changed: start again from your MCP client."
SCOPE_LABELS = {
    Scope.AGENT: "see the tools the agent's sessions may see, and call them under the tenant's rules",
    Scope.EXTERNAL: "post the results of external tools",
    Scope.ADMIN: "change the tenant's configuration",
}


class ConsentForm(forms.Form):
    tenant = forms.ChoiceField(label="Tenant")
    agent = forms.CharField(label="Agent", max_length=services.AGENT_MAX,
                            help_text="The agent the client acts as: its sessions see what this agent may see.")
    scopes = forms.MultipleChoiceField(label="It may", widget=forms.CheckboxSelectMultiple, required=False)

    def __init__(self, *args, memberships, requested, **kwargs):
        super().__init__(*args, **kwargs)
        self.memberships = {m.tenant.slug: m for m in memberships}
        self.fields["tenant"].choices = [(m.tenant.slug, f"{m.tenant.name} (you are {m.role})") for m in memberships]
        offered = [Scope.AGENT.value, *[s for s in requested if s in SCOPE_LABELS and s != Scope.AGENT]]
        self.fields["scopes"].choices = [(s, SCOPE_LABELS[s]) for s in offered]
        self.fields["scopes"].initial = [Scope.AGENT.value]

    def clean_scopes(self):
        return list(dict.fromkeys([Scope.AGENT.value, *self.cleaned_data["scopes"]]))


def _origin(uri: str) -> str:
    parts = urlsplit(uri)
    return f"{parts.scheme}://{parts.netloc}"


def _with_client_origin(request, response, redirect_uri: str):
    """The page's form ends in a redirect to the client: its origin joins the page's form-action."""
    host = request.get_host()
    response[HEADER] = console_policy(request.csp_nonce, host, form_targets=(_origin(redirect_uri),))
    return response


def _back_to_client(consent: services.Consent, **params) -> HttpResponseRedirect:
    return HttpResponseRedirect(construct_redirect_uri(consent.redirect_uri, state=consent.state, iss=issuer(),
                                                       **params))


@never_cache
@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def consent(request):
    pending = consent_from(request.GET.get("request", ""))
    client = services.client_get(pending.client_id) if pending else None
    if pending is None or client is None:
        return render(request, "console/oauth_consent.html", {"refused": EXPIRED}, status=400)
    memberships = services.consent_tenants(request.user)
    form = ConsentForm(request.POST if request.method == "POST" else None, memberships=memberships,
                       requested=pending.scopes, initial={"agent": client.name[:services.AGENT_MAX]})
    context = {"client": client, "pending": pending, "form": form, "memberships": memberships,
               "redirect_host": urlsplit(pending.redirect_uri).netloc, "client_host": urlsplit(client.client_id).netloc}
    if request.method == "POST":
        if "deny" in request.POST:
            return _back_to_client(pending, error="access_denied",
                                   error_description="The person did not let the client connect.")
        if form.is_valid():
            tenant = form.memberships[form.cleaned_data["tenant"]].tenant
            try:
                requests_admit(tenant=tenant, user=request.user)
                code = services.code_issue(consent=pending, user=request.user, tenant=tenant,
                                           agent=form.cleaned_data["agent"].strip(),
                                           scopes=form.cleaned_data["scopes"])
            except RateLimited as exc:
                return rate_limited_page(request, exc)
            except ServiceError as exc:
                add_service_errors(form, exc)
            else:
                return _back_to_client(pending, code=code)
        response = render(request, "console/oauth_consent.html", context, status=INVALID_STATUS)
    else:
        response = render(request, "console/oauth_consent.html", context)
    return _with_client_origin(request, response, pending.redirect_uri)


@never_cache
@login_required
@require_http_methods(["GET", "HEAD"])
def connections(request):
    """The person's connected MCP clients, in every tenant."""
    grants = (OAuthGrant.all_tenants.select_related("client", "tenant", "api_key")
              .filter(user=request.user, revoked_at__isnull=True).order_by("-created_at"))
    return render(request, "console/oauth_connections.html", {"grants": grants})


@never_cache
@login_required
@require_POST
def connection_revoke(request, grant_id: int):
    grant = (OAuthGrant.all_tenants.select_related("client", "tenant", "user")
             .filter(pk=grant_id, user=request.user, revoked_at__isnull=True).first())
    if grant is None:
        raise Http404("No such connection.")
    try:
        requests_admit(tenant=grant.tenant, user=request.user)
    except RateLimited as exc:
        return rate_limited_page(request, exc)
    services.grant_revoke(grant=grant, actor=request.user, reason="disconnected")
    messages.success(request, f"{grant.client.name} is disconnected: its tokens stopped working.")
    return HttpResponseRedirect(reverse("oauth_connections"))
