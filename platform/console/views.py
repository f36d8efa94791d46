"""The console's own pages (the top layer): the dashboard, tools, groups, bindings, API keys, settings,
sessions and calls. Thin views over the selectors (reads) and services (writes).

Every tenant page goes through `tenancy.web.tenant_view`, which resolves the tenant and every object the URL
names (404 when missing or another tenant's) and checks the member's role. The pages that change one thing
are the generic views of `tenancy.editing`, declared here.
"""
import uuid
from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Prefetch
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache

from approvals import grants
from approvals.exposure import agents_eye_view
from approvals.selectors import pending_request_of, request_of_call
from audit.selectors import audit_check_recent, audit_events
from console.forms import (
    ApiKeyForm,
    BindingForm,
    CallFilterForm,
    FindForm,
    GovernanceForm,
    GroupForm,
    LimitsForm,
    McpTrustForm,
    SessionFilterForm,
    SurfacePreviewForm,
    ToolStateForm,
    ToolTryForm,
)
from console.search import SEARCH_MAX, find
from tenancy import services as tenancy_services
from tenancy.editing import ObjectDeleteView, ObjectFormView
from tenancy.models import ApiKey, is_system_agent
from tenancy.selectors import memberships_of
from tenancy.web import (
    ADMIN,
    INVALID_STATUS,
    MEMBER,
    OPERATE,
    SERVICE_REFUSALS,
    acting_user,
    add_service_errors,
    issued_secret_keep,
    issued_secret_take,
    page_of,
    service_messages,
    shows_issued_secret,
    tenant_redirect,
    tenant_view,
)
from tools.calls.questions import (
    answer_permitted,
    call_answer,
    form_content,
    is_persons_question,
    public_question,
    questions_of_person,
)
from tools.calls.submit import OPERATOR_TEST, call_cancel, operator_test_call
from tools.catalog import services as tool_services
from tools.catalog.pages import GroupAddForm, tools_to_group
from tools.catalog.registry import call_outcomes
from tools.catalog.selectors import (
    SESSION_PAYLOADS,
    TOOL_PAYLOADS,
    active_group_names,
    bindings_for,
    call_events,
    call_rows,
    exposed_schema,
    groups_of,
    key_impact,
    new_session_of,
    session_calls,
    surface_preview,
    tool_impact,
)
from tools.gateway.pages import AGENT_PLACEHOLDER, mcp_client_setup, mcp_url, session_mcp_presence
from tools.gateway.protocol import AGENT_HEADER, SESSION_HEADER
from tools.models import AgentSession, BoundArgument, CallStatus, Tool, ToolCall, ToolGroup
from tools.redaction.pages import ToolResultStepsForm
from tools.upstream.servers import mcp_servers_trust_set

LIVE_ROWS_MAX = 50  # call rows one live-list fragment request may ask for
OUTPUT_LINES_MAX = 500  # streamed output lines a call page shows (the newest)


@login_required
def home(request):
    memberships = memberships_of(request.user)
    if len(memberships) == 1:
        return redirect("console:dashboard", tenant=memberships[0].tenant.slug)
    return render(request, "console/home.html", {"memberships": memberships})


# --- dashboard ---------------------------------------------------------------------------------

@tenant_view()
def dashboard(request):
    tenant = request.tenant
    since = timezone.now() - timedelta(hours=24)
    calls = ToolCall.objects.for_tenant(tenant)
    by_status = dict(
        calls.filter(created_at__gte=since).order_by().values_list("status").annotate(n=Count("pk"))
    )
    audit_check, audit_checked_at = audit_check_recent(tenant=tenant)
    return render(request, "console/dashboard.html", {
        "counts": {
            "tools": Tool.objects.for_tenant(tenant).count(),
            "enabled_tools": Tool.objects.for_tenant(tenant).filter(enabled=True).count(),
            "groups": ToolGroup.objects.for_tenant(tenant).count(),
            "sessions": AgentSession.objects.for_tenant(tenant).count(),
            "calls_24h": sum(by_status.values()),
        },
        "by_status": [(status, label, by_status[status]) for status, label in CallStatus.choices
                      if status in by_status],
        "recent_calls": call_rows(calls)[:10],
        "audit_check": audit_check,
        "audit_checked_at": audit_checked_at,
    })


# --- tools -------------------------------------------------------------------------------------

@tenant_view()
def tool_list(request):
    groups = Prefetch("groups", queryset=ToolGroup.objects.for_tenant(request.tenant).order_by("name"))
    tools = list(Tool.objects.for_tenant(request.tenant).defer(*TOOL_PAYLOADS).prefetch_related(groups))
    outcomes = call_outcomes(tenant=request.tenant, tools=tools)
    for tool in tools:
        tool.outcome = outcomes.get(tool.pk)  # what happens to its calls, when the platform does not trust its flags
    preview_form = SurfacePreviewForm(request.GET if "agent" in request.GET else None)
    preview = seen = None
    if preview_form.is_bound and preview_form.is_valid():
        agent, user = preview_form.cleaned_data["agent"], preview_form.cleaned_data["user"]
        preview = surface_preview(request.tenant, agent, user)
        seen = agents_eye_view(new_session_of(request.tenant, agent, user))
    return render(request, "console/tool_list.html", {"tools": tools, "preview_form": preview_form,
                                                      "preview": preview, "seen": seen})


def _schema_views(tool: Tool) -> tuple[dict, list[tuple[str, dict]], list[BoundArgument]]:
    """The schema the model sees (tenant-wide bindings removed) and one variant per agent with its own bindings."""
    bindings = list(BoundArgument.objects.for_tenant(tool.tenant_id).filter(tool=tool).order_by("agent", "name"))
    tenant_wide = [b.name for b in bindings if not b.agent]
    variants = []
    for agent in sorted({b.agent for b in bindings if b.agent}):
        bound = bindings_for(tool.tenant_id, agent, [tool.pk]).get(tool.pk, {})
        variants.append((agent, exposed_schema(tool.input_schema, bound.keys())))
    return exposed_schema(tool.input_schema, tenant_wide), variants, bindings


class ToolDetail(ObjectFormView):
    """The tool's page, whose one form enables or disables it."""

    def context(self) -> dict:
        tool = self.object
        schema, variants, bindings = _schema_views(tool)
        return {
            "schema": schema,
            "variants": variants,
            "bindings": bindings,
            "groups": ToolGroup.objects.for_tenant(self.request.tenant).filter(tools=tool).order_by("name"),
            "recent_calls": call_rows(ToolCall.objects.for_tenant(self.request.tenant).filter(tool=tool))[:10],
            "result_steps_form": ToolResultStepsForm(tenant=self.request.tenant, instance=tool),
            "group_add_form": GroupAddForm(tenant=self.request.tenant),
            "outcome": call_outcomes(tenant=self.request.tenant, tools=[tool]).get(tool.pk),
        }

    def message(self, tool) -> str:
        return f"{tool.name} is now {'enabled' if tool.enabled else 'disabled'}."


class ToolDisable(ObjectFormView):
    """Disabling a tool, after a confirmation that says what it takes away (enabling needs none)."""

    def context(self) -> dict:
        return {"impact": tool_impact(self.object)}

    def initial(self) -> dict:
        return {"enabled": False}

    def message(self, tool) -> str:
        return f"{tool.name} is now disabled."


tool_disable = ToolDisable.as_view(
    form_class=ToolStateForm, service=tool_services.tool_update, template_name="console/tool_disable.html",
    success_url="console:tool_detail", success_params=(("tool_id", "pk"),))
tool_detail = ToolDetail.as_view(
    form_class=ToolStateForm, service=tool_services.tool_update, template_name="console/tool_detail.html",
    success_url="console:tool_detail", success_params=(("tool_id", "pk"),), read=MEMBER)


@tenant_view(methods=("POST",))
def tool_group_add(request, tool):
    tools_to_group(request, [tool])
    return tenant_redirect(request, "console:tool_detail", tool_id=tool.pk)


AGENT_SUGGESTIONS = 50


@tenant_view(methods=("GET", "POST"), read=OPERATE)
def tool_try(request, tool):
    """Try a tool with an input, as an agent's session would call it; the call's page then follows it live."""
    form = ToolTryForm(request.POST or None, initial={"input": {}})
    if form.is_bound and form.is_valid():
        values = form.cleaned_data
        try:
            call = operator_test_call(tenant=request.tenant, tool=tool, arguments=values["input"],
                                      agent=values["agent"], user=values["user"], actor=acting_user(request))
        except SERVICE_REFUSALS as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Your test call of {tool.name} as {values['agent']}: it is marked as yours.")
            return tenant_redirect(request, "console:call_detail", call_id=call.pk)
    agents = (AgentSession.objects.for_tenant(request.tenant).exclude(context__has_key=OPERATOR_TEST)
              .order_by("agent").values_list("agent", flat=True).distinct()[:AGENT_SUGGESTIONS])
    schema, _variants, _bindings = _schema_views(tool)
    return render(request, "console/tool_try.html", {
        "tool": tool, "form": form, "agents": [agent for agent in agents if not is_system_agent(agent)],
        "schema": schema,
    }, status=INVALID_STATUS if form.is_bound else 200)


# --- groups ------------------------------------------------------------------------------------

@tenant_view()
def group_list(request):
    tools = Prefetch("tools", queryset=Tool.objects.for_tenant(request.tenant).defer(*TOOL_PAYLOADS).order_by("name"))
    groups = ToolGroup.objects.for_tenant(request.tenant).prefetch_related(tools)
    return render(request, "console/group_list.html", {"groups": groups})


group_create = ObjectFormView.as_view(
    form_class=GroupForm, service=tool_services.group_create, template_name="console/group_form.html",
    success_url="console:group_list", success_message="Group {object.name} created.")
group_edit = ObjectFormView.as_view(
    form_class=GroupForm, service=tool_services.group_update, template_name="console/group_form.html",
    success_url="console:group_list", success_message="Group {object.name} saved.")
group_delete = ObjectDeleteView.as_view(
    service=tool_services.group_delete, template_name="console/group_delete.html",
    success_url="console:group_list", success_message="Group {object.name} deleted.")


# --- bindings ----------------------------------------------------------------------------------

@tenant_view()
def binding_list(request):
    bindings = BoundArgument.objects.for_tenant(request.tenant).select_related("tool")
    return render(request, "console/binding_list.html", {"bindings": bindings})


class BindingCreate(ObjectFormView):
    """Bind an argument; `?tool=<id>` (a link from a tool's page) chooses the tool."""

    def initial(self) -> dict:
        tool = self.request.GET.get("tool", "")
        if not tool.isdigit():
            return {}
        return {"tool": Tool.objects.for_tenant(self.request.tenant).filter(pk=tool).first()}

    def render(self, context: dict, status: int = 200):
        tool = context["form"].chosen_tool
        if tool is not None:  # what the model is shown of the tool now, for the operator to compare
            context["model_schema"] = _schema_views(tool)[0]
        return super().render(context, status)

    def message(self, binding) -> str:
        return (f"{binding.tool.name}.{binding.name} is now bound"
                f"{' for ' + binding.agent if binding.agent else ''}.")


binding_create = BindingCreate.as_view(
    form_class=BindingForm, service=tool_services.binding_set, template_name="console/binding_form.html",
    success_url="console:binding_list")
binding_delete = ObjectDeleteView.as_view(
    service=tool_services.binding_delete, success_url="console:binding_list",
    template_name="console/binding_delete.html", success_message="Binding {object} removed.")


# --- API keys ----------------------------------------------------------------------------------

@tenant_view()
def apikey_list(request):
    # a connected MCP client's key is its grant's: the members page lists those (tenancy.oauth)
    keys = ApiKey.objects.for_tenant(request.tenant).filter(oauth_grant__isnull=True).select_related("created_by")
    url = mcp_url(request)
    setups = [mcp_client_setup(url=url, api_key=key) for key in keys]
    usable = [setup.key for setup in setups if setup.config]
    return render(request, "console/apikey_list.html", {
        "keys": [(setup.key, setup) for setup in setups],
        "mcp_keys": usable,
        **_mcp_help(url, usable),
    })


def _mcp_help(url: str, keys: list[ApiKey]) -> dict:
    """What the API-key pages say about connecting an MCP client with `keys`, besides their configurations."""
    return {"mcp_url": url, "mcp_agent_header": AGENT_HEADER, "mcp_agent_placeholder": AGENT_PLACEHOLDER,
            "mcp_session_header": SESSION_HEADER, "mcp_unlocked": any(not key.agent for key in keys),
            "mcp_locked": any(key.agent for key in keys)}


class ApiKeyCreate(ObjectFormView):
    """A new key; its secret waits in the session for the one page that shows it (`apikey_created`)."""

    def save(self, values: dict) -> ApiKey:
        request = self.request
        issued = tenancy_services.apikey_create(tenant=request.tenant, created_by=request.user, **values)
        issued_secret_keep(request, issued.api_key, issued.key)
        return issued.api_key


apikey_create = ApiKeyCreate.as_view(
    form_class=ApiKeyForm, template_name="console/apikey_form.html", success_url="console:apikey_created",
    success_params=(("key_id", "pk"),), read=ADMIN, write=ADMIN)


@never_cache
@tenant_view(read=ADMIN)
@shows_issued_secret
def apikey_created(request, api_key):
    secret = issued_secret_take(request, api_key)
    url = mcp_url(request)
    setup = mcp_client_setup(url=url, api_key=api_key, secret=secret or "")
    return render(request, "console/apikey_created.html", {
        "api_key": api_key, "secret": secret, "mcp": setup,
        **_mcp_help(url, [api_key] if setup.config else []),
    })


class ApiKeyRevoke(ObjectDeleteView):
    """Revoke after a confirmation that says what stops with the key."""

    def context(self) -> dict:
        return {"impact": key_impact(self.object)}

    def message(self, api_key) -> str:
        return super().message(api_key) if api_key.is_active else ""  # revoking a revoked key changes nothing


apikey_revoke = ApiKeyRevoke.as_view(
    service=tenancy_services.apikey_revoke, success_url="console:apikey_list",
    template_name="console/apikey_revoke.html",
    success_message="API key {object.name} revoked: it no longer authenticates.", read=ADMIN, write=ADMIN)


# --- tenant settings ---------------------------------------------------------------------------

def _trust_set(*, tenant, actor, trusted):
    mcp_servers_trust_set(tenant=tenant, actor=actor, trusted=trusted)


# The settings page's sections: each a form of its own, saved by its own service, on one page.
SETTINGS_SECTIONS = {
    "governance": (GovernanceForm, tenancy_services.tenant_governance_set,
                   "Decisions, parallel calls and tool surface saved."),
    "limits": (LimitsForm, tenancy_services.tenant_limits_set, "Limits saved."),
    "trust": (McpTrustForm, _trust_set, "Trust of MCP servers saved."),
}


def _settings_page(request, section: str = "", bound=None):
    forms = {name: form_class(tenant=request.tenant, instance=request.tenant)
             for name, (form_class, _, _) in SETTINGS_SECTIONS.items()}
    if bound is not None:
        forms[section] = bound
    return render(request, "console/tenant_settings.html", {"forms": forms, "has_mcp_servers": bool(
        forms["trust"].fields["trusted"].queryset.exists())}, status=INVALID_STATUS if bound is not None else 200)


def _settings_save(request, section: str):
    form_class, service, message = SETTINGS_SECTIONS[section]
    form = form_class(request.POST, tenant=request.tenant, instance=request.tenant)
    if form.is_valid():
        try:
            service(tenant=request.tenant, actor=acting_user(request), **form.service_values())
        except SERVICE_REFUSALS as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, message)
            return tenant_redirect(request, "console:tenant_settings")
    return _settings_page(request, section, form)


@tenant_view(methods=("GET", "POST"), read=OPERATE)
def tenant_settings(request):
    """Every setting of the tenant that operators change, in sections, each form saved on its own (a POST
    names its section; the fields of the sections differ, so they need no prefixes)."""
    if request.method == "POST":
        section = request.POST.get("section", "")
        if section not in SETTINGS_SECTIONS:
            messages.error(request, "Nothing was saved: the form did not say which settings it changes.")
            return tenant_redirect(request, "console:tenant_settings")
        return _settings_save(request, section)
    return _settings_page(request)


# --- sessions and calls ------------------------------------------------------------------------

@tenant_view()
def session_list(request):
    form = SessionFilterForm(request.GET or None)
    sessions = AgentSession.objects.for_tenant(request.tenant).select_related("api_key").defer(*SESSION_PAYLOADS)
    return render(request, "console/session_list.html", {
        "form": form, "page": page_of(request, form.filtered(sessions)), "filters": form.filters(),
    }, status=200 if form.is_valid() or not form.is_bound else 400)


@tenant_view()
def session_detail(request, session):
    groups = groups_of(request.tenant)
    return render(request, "console/session_detail.html", {
        "session": session,
        "seen": agents_eye_view(session),
        "active_groups": active_group_names(session, groups),
        "mcp": session_mcp_presence(session),
        "page": page_of(request, session_calls(session)),
        "grant_rows": [(grant, True) for grant in grants.grants_list(tenant=request.tenant, session=session,
                                                                      active=True)[:50]],
        "may_revoke": request.membership.can_review,
    })


@tenant_view()
def call_list(request):
    form = CallFilterForm(request.GET or None)
    calls = form.filtered(call_rows(ToolCall.objects.for_tenant(request.tenant)).order_by("-created_at", "-pk"))
    if request.GET.get("fragment") == "rows":
        return render(request, "console/_call_rows.html", {
            "calls": calls.filter(pk__in=_named_calls(request)),
            "hide_session": request.GET.get("hide_session") == "1",
        })
    return render(request, "console/call_list.html", {
        "form": form, "page": page_of(request, calls), "filters": form.filters(),
        "tool_names": Tool.objects.for_tenant(request.tenant).order_by("name").values_list("name", flat=True),
    }, status=200 if form.is_valid() or not form.is_bound else 400)


@tenant_view()
def search(request):
    """The header's search box: straight to what the text names when it names one thing, else the list."""
    form = FindForm(request.GET or None)
    found = find(request.tenant, form.cleaned_data["q"]) if form.is_valid() else []
    if len(found) == 1 and found[0].kind != "sessions":
        return redirect(found[0].url)
    return render(request, "console/search.html", {
        "form": form, "found": found, "current_search": request.GET.get("q", "")[:SEARCH_MAX],
    }, status=200 if form.is_valid() or not form.is_bound else 400)


def _named_calls(request) -> list[str]:
    """The calls a live list asks rows for (`?call=<id>&call=…`): each must be this tenant's, else 404."""
    try:
        ids = list(dict.fromkeys(str(uuid.UUID(value)) for value in request.GET.getlist("call")[:LIVE_ROWS_MAX + 1]))
    except ValueError as exc:
        raise Http404("no such call") from exc
    if not ids or len(ids) > LIVE_ROWS_MAX:
        raise Http404(f"ask for 1 to {LIVE_ROWS_MAX} calls")
    if ToolCall.objects.for_tenant(request.tenant).filter(pk__in=ids).count() != len(ids):
        raise Http404("no such call")
    return ids


def _live_view(events) -> dict:
    """What the live parts of a call page start from: the last progress, the output lines, the last seq."""
    progress, lines = None, []
    for event in events:
        data = event.data if isinstance(event.data, dict) else {}
        if event.kind == "progress" and isinstance(data.get("progress"), int | float):
            progress = data["progress"]
        if event.kind in ("progress", "output") and data.get("text"):
            lines.append(str(data["text"]))
    return {
        "progress": progress,
        "progress_percent": round(progress * 100) if progress is not None else 0,
        "output_lines": lines[-OUTPUT_LINES_MAX:],
        "output_hidden": max(0, len(lines) - OUTPUT_LINES_MAX),
        "last_seq": events[-1].seq if events else 0,
    }


class CallCancel(ObjectDeleteView):
    """An operator stops a call that waits (for a reviewer, an external party or the executor) or runs: the
    way out of a request nobody can decide. `call_cancel` records it in the audit trail."""

    def context(self) -> dict:
        return {"pending_request": pending_request_of(self.object)}


call_cancel_page = CallCancel.as_view(
    service=call_cancel, template_name="console/call_cancel.html", success_url="console:call_detail",
    success_params=(("call_id", "pk"),), success_message="Call {object.call_id} stopped.")


@tenant_view(read=MEMBER)
def confirmations(request):
    """The questions of calls that wait for the signed-in person's own answer (docs/calls.md, "Questions for the
    user"): only sessions whose verified user they are."""
    calls = questions_of_person(tenant=request.tenant, person=request.user)
    return render(request, "console/confirmations.html", {
        "questions": [(call, public_question(call)) for call in calls]})


@tenant_view(methods=("POST",), write=MEMBER)
def confirmation_answer(request, call):
    """The person answers their own call's question: Accept (with the form's fields) or Decline."""
    if not is_persons_question(call, request.user):  # the tenant's calls are visible to its members: a 403
        raise PermissionDenied("Only the session's own user answers this call's question.")
    action = request.POST.get("action", "")
    try:
        answer_permitted(session=call.session, user=request.user)
        content = form_content(public_question(call) or {}, request.POST) if action == "accept" else None
        call_answer(call=call, action=action, content=content, actor=request.user)
    except SERVICE_REFUSALS as exc:
        messages.error(request, "The answer was not taken: " + " ".join(service_messages(exc)))
    else:
        messages.success(request, f"Call {call.call_id} ({call.tool_name}): {action} sent.")
    return tenant_redirect(request, "console:confirmations")


@tenant_view()
def call_detail(request, call):
    events = list(call_events(call))
    return render(request, "console/call_detail.html", {
        "call": call,
        "approval": request_of_call(call),
        "events": events,
        "live": _live_view(events),
        "audit": audit_events(tenant=request.tenant, target=f"call:{call.pk}").order_by("id"),
    })
