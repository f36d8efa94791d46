"""The console's pages for a tenant's MCP servers (tools.upstream.servers): the list, a server with its tools,
add, edit, delete, sync now and test the connection. Credentials are write-only on every form."""
from django import forms
from django.contrib import messages
from django.http import HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse

from common.secrets import secret_names
from tenancy.editing import (
    ObjectActionView,
    ObjectDeleteView,
    ObjectFormView,
    SecretTextarea,
    credentials_from_text,
    credentials_stored,
    text_lines,
)
from tenancy.web import SERVICE_REFUSALS, TenantForm, acting_user, service_messages, tenant_view
from tools.catalog.pages import GroupAddForm, tools_to_group
from tools.catalog.registry import call_outcomes
from tools.catalog.selectors import exposed_schema
from tools.models import AccountMode, BoundArgument, McpServer, McpTransport, Tool, ToolGroup, UpstreamPrompt
from tools.upstream import definitions
from tools.upstream import servers as mcp_servers
from tools.upstream.servers import SERVER_ACCOUNT_MODES, SERVER_NAME_RULE, TIMEOUT_RANGE, stdio_servers


class McpServerForm(TenantForm):
    """An MCP server. Credentials are write-only: left empty, the stored ones stay; "remove" clears them."""

    name = forms.CharField(max_length=24, help_text=f"{SERVER_NAME_RULE}. Its tools are named mcp__NAME__TOOL.")
    transport = forms.ChoiceField(choices=McpTransport.choices)
    url = forms.CharField(max_length=2000, required=False, label="URL",
                          help_text="HTTP transports. Only public addresses, unless the platform admin allows "
                                    "the host.")
    headers = forms.CharField(required=False, widget=SecretTextarea(attrs={"rows": 3, "autocomplete": "off"}),
                              label="Headers",
                              help_text="One per line, Name: value (or a JSON object), e.g. Authorization: Bearer …")
    clear_headers = forms.BooleanField(required=False, label="Remove the stored headers")
    command = forms.ChoiceField(required=False, label="Stdio server",
                                help_text="stdio: a server the platform admin allows.")
    env = forms.CharField(required=False, widget=SecretTextarea(attrs={"rows": 2, "autocomplete": "off"}),
                          label="Environment", help_text="stdio: one per line, NAME=value (or a JSON object).")
    clear_env = forms.BooleanField(required=False, label="Remove the stored environment")
    accounts = forms.ChoiceField(choices=[(mode, AccountMode(mode).label) for mode in SERVER_ACCOUNT_MODES],
                                 initial=AccountMode.TENANT, label="Calls act as", required=False,
                                 help_text="HTTP servers that follow the MCP authorization specification can act as "
                                           "each person's own account: every member connects theirs on the "
                                           "\"Your accounts\" page, and a call carries its verified person's "
                                           "token (never a reviewer's). Tools are listed with an operator's "
                                           "connection.")
    oauth_client_id = forms.CharField(required=False, max_length=2000, label="OAuth client id",
                                      help_text="Each person's own account: a client registered at the server's "
                                                "authorization server. Empty: Toolkeeper registers itself there.")
    oauth_client_secret = forms.CharField(required=False, max_length=2000, label="OAuth client secret",
                                          widget=forms.PasswordInput(attrs={"autocomplete": "off"}),
                                          help_text="For a confidential client. Write-only.")
    clear_oauth_client = forms.BooleanField(required=False, label="Remove the stored OAuth client")
    oauth_scopes = forms.CharField(required=False, max_length=500, label="OAuth scopes",
                                   help_text="Space-separated; empty: those the server names.")
    timeout_s = forms.FloatField(min_value=TIMEOUT_RANGE[0], max_value=TIMEOUT_RANGE[1], initial=30,
                                 label="Timeout (s)", help_text="The limit of each call of its tools.")
    include = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                              help_text="Upstream tool names to take, one per line; empty: every tool.")
    exclude = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                              help_text="Upstream tool names to leave out, one per line.")
    join_group = forms.ModelChoiceField(
        queryset=ToolGroup.objects.none(), required=False, label="Group its tools join",
        help_text="Each tool a sync adds joins this group, so the sessions that see the group see it. Empty: new "
                  "tools join no group until you add them (from this server's page or the group's).")
    trusted = forms.BooleanField(required=False, help_text="Its tools' annotations (read-only, destructive, "
                                 "idempotent) become their flags. Otherwise they are treated as destructive.")
    accept_changes = forms.BooleanField(
        required=False, label="Accept definition changes without review",
        help_text="Off (recommended): when the server changes a tool's description or schemas, or offers a new "
                  "tool, the tool is withheld from every agent until an operator reads the change here and accepts "
                  "it. On: each sync applies what the server says (each change is still recorded).")
    enabled = forms.BooleanField(required=False, initial=True, help_text="Off: its tools are disabled.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["command"].choices = [("", "—"), *((name, name) for name in sorted(stdio_servers()))]
        self.fields["join_group"].queryset = ToolGroup.objects.for_tenant(self.tenant).order_by("name")
        if self.instance is not None:
            self.fields["name"].disabled = True
            self.fields["name"].help_text = "Part of its tools' names: it cannot change."
            self.fields["headers"].label = "Replace the headers"
            stored = credentials_stored(self.instance.headers, "headers")
            self.fields["headers"].help_text = f"{stored} Leave empty to keep them. " + self.fields["headers"].help_text
            self.fields["env"].label = "Replace the environment"
            stored = credentials_stored(self.instance.env, "variables")
            self.fields["env"].help_text = f"{stored} Leave empty to keep it. " + self.fields["env"].help_text
            if secret_names(self.instance, "oauth_client"):
                self.fields["oauth_client_id"].help_text = ("A client is stored: leave empty to keep it. "
                                                            + self.fields["oauth_client_id"].help_text)
        else:
            del self.fields["clear_headers"], self.fields["clear_env"], self.fields["clear_oauth_client"]

    def initial_for(self, server) -> dict:
        return {"name": server.name, "transport": server.transport, "url": server.url, "command": server.command,
                "timeout_s": server.timeout_s, "include": "\n".join(server.include),
                "exclude": "\n".join(server.exclude), "trusted": server.trusted, "enabled": server.enabled,
                "accept_changes": server.accept_changes, "join_group": server.join_group_id,
                "accounts": server.accounts, "oauth_scopes": server.oauth_scopes}

    def clean_headers(self):
        text = self.cleaned_data["headers"]
        return credentials_from_text(text, "headers") if text.strip() else None

    def clean_env(self):
        text = self.cleaned_data["env"]
        return credentials_from_text(text, "variables") if text.strip() else None

    def clean_accounts(self):
        # a form that leaves it out keeps what is stored
        return self.cleaned_data["accounts"] or (self.instance.accounts if self.instance else AccountMode.TENANT)

    def clean(self):
        data = super().clean()
        if data.get("oauth_client_secret") and not data.get("oauth_client_id"):
            self.add_error("oauth_client_id", "a client secret needs its client id")
        return data

    def _oauth_client(self, data: dict):
        """The OAuth client the form sends: {} to remove it, None to keep what is stored."""
        if data.get("clear_oauth_client"):
            return {}
        if data.get("oauth_client_id"):
            client = {"client_id": data["oauth_client_id"]}
            if data.get("oauth_client_secret"):
                client["client_secret"] = data["oauth_client_secret"]
            return client
        return None

    def service_check(self, values: dict) -> None:
        checked = {name: value for name, value in values.items() if name in mcp_servers.FIELDS}
        for name in ("include", "exclude"):
            if name in checked:
                checked[name] = text_lines(checked[name])
        for name in ("headers", "env"):
            if checked.get(name) is None:
                checked.pop(name, None)
        checked.pop("oauth_client", None)
        if (client := self._oauth_client(values)) is not None:
            checked["oauth_client"] = client or None
        mcp_servers.mcp_server_check(self.tenant, checked, instance=self.instance)

    def service_values(self) -> dict:
        data = dict(self.cleaned_data)
        values = {name: data[name] for name in ("transport", "url", "command", "timeout_s", "trusted", "enabled",
                                                "accept_changes", "join_group", "accounts", "oauth_scopes")}
        if (client := self._oauth_client(data)) is not None:
            values["oauth_client"] = client
        values["include"], values["exclude"] = text_lines(data["include"]), text_lines(data["exclude"])
        if self.instance is None:
            values["name"] = data["name"]
        for name in ("headers", "env"):
            if data.get(f"clear_{name}"):
                values[name] = {}
            elif data[name] is not None:
                values[name] = data[name]
        return values


# --- pages -------------------------------------------------------------------------------

@tenant_view()
def mcp_server_list(request):
    servers = list(McpServer.objects.for_tenant(request.tenant))
    tools = mcp_servers.mcp_tools_by_server(request.tenant, servers)
    rows = [(server, sum(t.enabled for t in tools[server.pk]), len(tools[server.pk])) for server in servers]
    return render(request, "console/mcp_server_list.html", {"rows": rows})


@tenant_view()
def mcp_server_detail(request, server):
    """The server, its tools, each schema as the model sees it (tenant-wide bindings removed), and its prompts."""
    tools = list(mcp_servers.server_tools(server).order_by("name"))
    bound: dict[int, list[str]] = {}
    agents: dict[int, set[str]] = {}
    for tool_id, agent, name in BoundArgument.objects.for_tenant(request.tenant).filter(tool__in=tools).values_list(
            "tool_id", "agent", "name"):
        if agent:
            agents.setdefault(tool_id, set()).add(agent)
        else:
            bound.setdefault(tool_id, []).append(name)
    outcomes = call_outcomes(tenant=request.tenant, tools=tools)
    for tool in tools:
        tool.outcome = outcomes.get(tool.pk)  # what happens to its calls, when the platform does not trust its flags
    rows = [(tool, exposed_schema(tool.input_schema, bound.get(tool.pk, [])), sorted(agents.get(tool.pk, ())))
            for tool in tools]
    waiting = [(tool, definitions.definition_diff(tool)) for tool in tools if tool.proposed_hash and tool.mcp_server_id]
    return render(request, "console/mcp_server_detail.html", {
        "server": server, "rows": rows, "waiting": waiting, "group_add_form": GroupAddForm(tenant=request.tenant),
        "header_names": secret_names(server, "headers"), "env_names": secret_names(server, "env"),
        "connected": server.accounts_connected.count(),
        "prompts": list(UpstreamPrompt.objects.for_tenant(request.tenant).filter(mcp_server=server).order_by("name")),
    })


@tenant_view(methods=("POST",))
def tool_definition_accept(request, tool):
    """An operator accepts the definition whose diff they read (`hash` names it: a newer one is refused)."""
    slug = request.tenant.slug
    target = (reverse("console:mcp_server_detail", kwargs={"tenant": slug, "server_id": tool.mcp_server_id})
              if tool.mcp_server_id else reverse("console:tool_detail", kwargs={"tenant": slug, "tool_id": tool.pk}))
    try:
        definitions.tool_definition_accept(tool=tool, expected_hash=request.POST.get("hash", ""),
                                           actor=acting_user(request))
    except SERVICE_REFUSALS as exc:
        for text in service_messages(exc):
            messages.error(request, text)
    else:
        messages.success(request, f"The new definition of {tool.name} is accepted: agents see it from now on.")
    return HttpResponseRedirect(target + "#waiting")


mcp_server_create = ObjectFormView.as_view(
    form_class=McpServerForm, service=mcp_servers.mcp_server_create, template_name="console/mcp_server_form.html",
    success_url="console:mcp_server_detail", success_params=(("server_id", "pk"),),
    success_message="MCP server {object.name} added. Sync it to list its tools.")
mcp_server_edit = ObjectFormView.as_view(
    form_class=McpServerForm, service=mcp_servers.mcp_server_update, template_name="console/mcp_server_form.html",
    success_url="console:mcp_server_detail", success_params=(("server_id", "pk"),),
    success_message="MCP server {object.name} saved.")
mcp_server_delete = ObjectDeleteView.as_view(
    service=mcp_servers.mcp_server_delete, template_name="console/mcp_server_delete.html",
    success_url="console:mcp_server_list",
    success_message="MCP server {object.name} deleted. Its tools stay in the catalog, disabled.")


@tenant_view(methods=("POST",))
def mcp_server_group_add(request, server):
    """Every tool the server offers now joins the group chosen (those a sync adds later: `join_group`)."""
    tools_to_group(request, list(Tool.objects.for_tenant(request.tenant).filter(mcp_server=server)))
    return HttpResponseRedirect(reverse("console:mcp_server_detail",
                                        kwargs={"tenant": request.tenant.slug, "server_id": server.pk}))


class McpServerSync(ObjectActionView):
    """Sync now: the outcome is the page's message (an unreachable server is no refusal: it is recorded)."""

    def post(self, request, **objects):
        try:
            result = self.service(server=self.object, actor=acting_user(request))
        except SERVICE_REFUSALS as exc:
            return self.refused(exc)
        if result["status"] == "ok":
            skipped = "; ".join(f"{name}: {reason}" for name, reason in result["skipped"][:5])
            held = f", {result['held']} waiting for review" if result["held"] else ""
            messages.success(request, f"Synced: {result['added']} added, {result['updated']} updated, "
                                      f"{result['disabled']} disabled{held}"
                                      + (f". Skipped: {skipped}" if skipped else "."))
        else:
            messages.error(request, f"The sync failed: {result['error']}")
        return HttpResponseRedirect(self.success(self.object))


mcp_server_sync = McpServerSync.as_view(
    service=mcp_servers.mcp_server_sync, success_url="console:mcp_server_detail",
    success_params=(("server_id", "pk"),))
mcp_server_test = ObjectActionView.as_view(
    service=mcp_servers.mcp_server_probe, success_url="console:mcp_server_detail",
    success_params=(("server_id", "pk"),), success_message="{object.name} answers: the connection works.")
