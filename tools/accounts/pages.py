"""The console's "Your accounts" page (docs/accounts.md): the tenant's MCP servers and HTTP tools' OAuth providers
that act as each person's own account, with connect and disconnect; the callback the authorization servers send
the person back to; and Toolkeeper's client id metadata document."""
from urllib.parse import urlsplit

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from common.errors import ServiceError
from tenancy.web import MEMBER, OPERATE, allowed, tenant_view
from tools.accounts import oauth, vault
from tools.models import McpServer, UpstreamAccount


@never_cache
@tenant_view(methods=("GET",), read=MEMBER)
def upstream_accounts(request):
    mine = {(account.mcp_server_id, account.oauth_provider_id): account for account in
            UpstreamAccount.objects.for_tenant(request.tenant).filter(user=request.user)}
    asked = request.GET.get("connect", "")
    rows = []
    for upstream in vault.person_upstreams(request.tenant):
        server = isinstance(upstream, McpServer)
        account = mine.get((upstream.pk, None) if server else (None, upstream.pk))
        rows.append({
            "upstream": upstream, "server": server, "account": account,
            "key": upstream.name if server else f"http:{upstream.name}",
            "address": upstream.url if server else upstream.authorization_endpoint,
            "enabled": upstream.enabled if server else True,
            "lists_tools": server and account is not None and upstream.listing_account_id == account.pk})
    for row in rows:
        row["asked"] = row["key"] == asked
    return render(request, "console/upstream_accounts.html", {
        "rows": rows, "operates": allowed(request.membership, OPERATE)})


def _connect(request, upstream):
    try:
        url = vault.connect_start(upstream=upstream, user=request.user, session_store=request.session)
    except ServiceError as exc:
        messages.error(request, exc.message)
        return HttpResponseRedirect(reverse("console:upstream_accounts", kwargs={"tenant": request.tenant.slug}))
    # A page that goes on to the authorization server, rather than a redirect: the console's CSP lets its forms
    # lead to the console alone, and this server's address was only learnt now.
    return render(request, "console/upstream_account_continue.html",
                  {"upstream": upstream, "url": url, "host": urlsplit(url).netloc})


def _disconnect(request, upstream, accounts):
    account = accounts.filter(user=request.user).first()
    if account is None:
        messages.info(request, f"You have no account connected at {upstream.name}.")
    else:
        revoked = vault.account_disconnect(account=account, actor=request.user)
        messages.success(request, f"Your account at {upstream.name} is disconnected"
                                  f"{' and its grant revoked there' if revoked else ''}.")
    return HttpResponseRedirect(reverse("console:upstream_accounts", kwargs={"tenant": request.tenant.slug}))


@never_cache
@tenant_view(methods=("POST",), read=MEMBER, write=MEMBER)
def upstream_account_connect(request, server):
    return _connect(request, server)


@never_cache
@tenant_view(methods=("POST",), read=MEMBER, write=MEMBER)
def upstream_account_disconnect(request, server):
    return _disconnect(request, server, UpstreamAccount.objects.for_tenant(request.tenant).filter(mcp_server=server))


@never_cache
@tenant_view(methods=("POST",), read=MEMBER, write=MEMBER)
def provider_account_connect(request, provider):
    return _connect(request, provider)


@never_cache
@tenant_view(methods=("POST",), read=MEMBER, write=MEMBER)
def provider_account_disconnect(request, provider):
    return _disconnect(request, provider,
                       UpstreamAccount.objects.for_tenant(request.tenant).filter(oauth_provider=provider))


@never_cache
@tenant_view(methods=("POST",), read=MEMBER, write=OPERATE)
def upstream_account_list_tools(request, server):
    try:
        vault.listing_account_take(server=server, user=request.user)
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"{server.name}'s tools are listed with your connection from now on.")
    return HttpResponseRedirect(reverse("console:upstream_accounts", kwargs={"tenant": request.tenant.slug}))


@never_cache
@login_required
@require_GET
def accounts_callback(request):
    """Where an authorization server sends the person back: completed only for the person who started it."""
    try:
        connected = vault.connect_finish(
            user=request.user, session_store=request.session, state=request.GET.get("state", ""),
            code=request.GET.get("code"), error=request.GET.get("error"), issuer=request.GET.get("iss"))
    except ServiceError as exc:
        return render(request, "console/upstream_account_failed.html", {"error": exc.message}, status=400)
    messages.success(request, f"Your account at {connected.account.upstream.name} is connected.")
    return HttpResponseRedirect(reverse("console:upstream_accounts", kwargs={"tenant": connected.tenant_slug}))


@require_GET
def accounts_client_document(request):
    """Toolkeeper's client id metadata document: an authorization server that supports them knows the client by
    this URL, without a registration."""
    return JsonResponse({"client_id": oauth.client_document_url(), **oauth.client_metadata()})
