"""Forms of the console's own pages. Querysets are always the tenant's (`for_tenant`): a choice from another
tenant is invalid. Page forms are `TenantForm`s, built by the generic views of `tenancy.editing`."""
from django import forms
from django.db.models import Q
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator

from common.json_values import JSONValueField
from console.search import SEARCH_MAX, uuid_or_none
from tenancy.editing import text_lines
from tenancy.models import SYSTEM_AGENT_RESERVED, Behavior, Scope, Tenant, ToolSurface, is_system_agent
from tenancy.services import LIMIT_FIELDS, LIMIT_MAX, PARALLEL_MAX
from tenancy.web import ListFilterForm, TenantForm, search_field
from tools.catalog.schemas import argument_choices
from tools.models import CallStatus, McpServer, Tool


def _tools_of(tenant):
    return Tool.objects.for_tenant(tenant).order_by("name")


class ToolStateForm(TenantForm):
    enabled = forms.BooleanField(required=False)

    def initial_for(self, tool) -> dict:
        return {"enabled": tool.enabled}


SOURCE_LABELS = {"python": "Python plugin", "http": "HTTP tool", "external": "the app's (external)",
                 "builtin": "built-in"}


def _source_of(tool) -> tuple[str, str]:
    """(filter value, words) of where a tool comes from: its MCP server by name, else its kind of source."""
    if tool.mcp_server_id:
        return f"mcp:{tool.mcp_server.name}", f"MCP server {tool.mcp_server.name}"
    return tool.source, SOURCE_LABELS.get(tool.source, tool.source)


class ToolPicker(forms.CheckboxSelectMultiple):
    """The group editor's tools: a row per tool with where it comes from, which the page filters by source and
    by name and selects by what is shown (templates/console/group_form.html). Without scripts: the whole list."""

    def render(self, name, value, attrs=None, renderer=None):
        chosen = {str(item) for item in (value or [])}
        rows, sources = [], {}
        for index, (option, _label) in enumerate(self.choices):
            tool = option.instance
            source, words = _source_of(tool)
            sources[source] = words
            rows.append((tool.name.lower(), source, name, tool.pk, f"id_{name}_{index}",
                         format_html(" checked") if str(tool.pk) in chosen else "", f"id_{name}_{index}", tool.name,
                         "" if tool.enabled else format_html(' <span class="tag">disabled</span>'), words,
                         Truncator(tool.description).chars(90)))
        rows_html = format_html_join(
            "", '<tr data-tool-row data-name="{}" data-source="{}"><td><input type="checkbox" name="{}" value="{}" '
                'id="{}"{}></td><td><label for="{}"><code>{}</code></label>{}</td><td class="small">{}</td>'
                '<td class="small muted">{}</td></tr>', rows)
        options = format_html_join("", '<option value="{}">{}</option>', sorted(sources.items(), key=lambda s: s[1]))
        return format_html(
            '<div class="tool-picker" data-tool-picker><div class="picker-controls" data-picker-controls hidden>'
            '<input type="search" data-picker-name aria-label="Filter the tools by name" placeholder="Filter by name">'
            '<select data-picker-source aria-label="Filter the tools by source"><option value="">every source'
            '</option>{}</select><label class="plain"><input type="checkbox" data-picker-selected> only the selected'
            '</label><button type="button" class="secondary" data-picker-all>Select the shown</button>'
            '<button type="button" class="secondary" data-picker-none>Clear the shown</button>'
            '<output data-picker-count aria-live="polite"></output></div>'
            '<div class="picker-rows"><table><thead><tr><th><span class="visually-hidden">In the group</span></th>'
            '<th>Tool</th><th>Source</th><th>Description</th></tr></thead><tbody>{}</tbody></table></div></div>',
            options, rows_html)


class GroupForm(TenantForm):
    name = forms.SlugField(max_length=64, help_text="Letters, digits, - and _. The model sees this name.")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                                  help_text="Shown next to the group in reset_tools.")
    notes = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 4}),
                            help_text="Instructions given to the model while the group is active.")
    default_active = forms.BooleanField(required=False, help_text="Active in new sessions.")
    switchable = forms.BooleanField(required=False, initial=True,
                                    help_text="The model may switch it with reset_tools. Off: operators decide.")
    tools = forms.ModelMultipleChoiceField(queryset=Tool.objects.none(), required=False, widget=ToolPicker)
    agents = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}), label="Limited to agents",
                             help_text="Agent names, one a line: only their sessions see it. Empty: every agent.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["tools"].queryset = _tools_of(self.tenant).select_related("mcp_server").defer(
            "input_schema", "output_schema")
        if self.instance is not None and self.instance.is_reserved:
            del self.fields["agents"]  # basic is open to every agent

    def clean_agents(self):
        return text_lines(self.cleaned_data["agents"])

    def initial_for(self, group) -> dict:
        return {
            "name": group.name, "description": group.description, "notes": group.notes,
            "default_active": group.default_active, "switchable": group.switchable, "tools": list(group.tools.all()),
            "agents": "\n".join(str(agent) for agent in group.agents or []),
        }


class SurfacePreviewForm(forms.Form):
    """Whose surface the tools page shows: a new session of this agent (and user)."""
    agent = forms.CharField(max_length=100)
    user = forms.CharField(max_length=200, required=False)

    def clean_agent(self):
        agent = self.cleaned_data["agent"]
        if is_system_agent(agent):
            raise forms.ValidationError(SYSTEM_AGENT_RESERVED)
        return agent


class ToolTryForm(forms.Form):
    """An operator's test of a tool: the arguments, and whose session it runs in."""
    agent = forms.CharField(max_length=100,
                            widget=forms.TextInput(attrs={"list": "agent-names", "spellcheck": "false"}),
                            help_text="The call runs in a new session of this agent: it must see the tool (through a "
                                      "group), the rules decide and the agent's bound arguments apply.")
    user = forms.CharField(max_length=200, required=False,
                           help_text="The end user the session is for, as the rules see it. Empty: none.")
    input = JSONValueField(required=False, widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}),
                           help_text="The arguments as the model would send them: a JSON object. The server sets "
                                     "the bound ones.")

    def clean_agent(self):
        agent = self.cleaned_data["agent"].strip()
        if is_system_agent(agent):
            raise forms.ValidationError(SYSTEM_AGENT_RESERVED)
        return agent

    def clean_input(self):
        value = self.cleaned_data["input"]
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise forms.ValidationError("a JSON object, such as {\"city\": \"Oslo\"}")
        return value


class BindingForm(TenantForm):
    tool = forms.ModelChoiceField(queryset=Tool.objects.none())
    agent = forms.CharField(max_length=100, required=False,
                            help_text="Empty: every agent. An agent's own binding beats the tenant-wide one.")
    name = forms.CharField(max_length=128, label="Argument name")
    value = JSONValueField(widget=forms.Textarea(attrs={"rows": 3}),
                            help_text='JSON, e.g. "Europe/Berlin" (with quotes), 42, ["a", "b"] or {"k": 1}.')

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["tool"].queryset = _tools_of(self.tenant)
        self.chosen_tool = self._chosen_tool()
        arguments = argument_choices(self.chosen_tool.input_schema) if self.chosen_tool else []
        if arguments:  # the argument is picked from the tool's schema, not typed
            self.fields["name"] = forms.ChoiceField(choices=[("", "— choose an argument —"), *arguments],
                                                    label="Argument", help_text="From the tool's input schema.")

    def _chosen_tool(self):
        """The tool the form is about: the one posted, else the one the page was opened for (`?tool=`)."""
        chosen = self.data.get("tool") if self.is_bound else self.initial.get("tool")
        if isinstance(chosen, Tool):
            return chosen
        if isinstance(chosen, str) and chosen.isdigit():
            return self.fields["tool"].queryset.filter(pk=chosen).first()
        return None

    def clean_agent(self):
        return self.cleaned_data["agent"].strip()

    def clean_name(self):
        return self.cleaned_data["name"].strip()


class ApiKeyForm(TenantForm):
    name = forms.CharField(max_length=100)
    scopes = forms.MultipleChoiceField(
        choices=Scope.choices, widget=forms.CheckboxSelectMultiple,
        help_text=("agent: sessions and calls, also over the MCP endpoint · external: post results of external tools "
                   "· admin: governance API."),
    )
    agent = forms.CharField(max_length=100, required=False,
                            help_text="Optional: lock the key to one agent name.")

    def clean_agent(self):
        return self.cleaned_data["agent"].strip()


class LimitsForm(TenantForm):
    """The tenant's rate limits, labelled and explained by the model's own fields."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in LIMIT_FIELDS:
            field = Tenant._meta.get_field(name)
            self.fields[name] = forms.IntegerField(min_value=0, max_value=LIMIT_MAX, help_text=field.help_text,
                                                   label=field.verbose_name.capitalize())

    def initial_for(self, tenant) -> dict:
        return {name: getattr(tenant, name) for name in LIMIT_FIELDS}


class GovernanceForm(TenantForm):
    """How the tenant decides and runs calls; each field says what it does."""

    default_behavior = forms.ChoiceField(
        label="When no rule matches", choices=[
            (Behavior.ASK, "Ask a reviewer (the default queue)"), (Behavior.DENY, "Deny the call"),
            (Behavior.ALLOW, "Run the call")],
        help_text="Rules are read in this order: deny rules, ask rules, read-only tools (below), allow rules, "
                  "untrusted servers' tools (below); a call none of them decides gets this.")
    auto_allow_read_only = forms.BooleanField(
        required=False, label="Read-only tools run without asking",
        help_text="A tool that its code or a trusted MCP server marks read-only runs unless a deny or ask rule "
                  "matches it. Off: read-only tools go on to the allow rules and the default like any other.")
    review_untrusted = forms.BooleanField(
        required=False, label="A reviewer looks at calls of untrusted servers' tools",
        help_text="A tool of an MCP server that is not trusted (below) may do anything, whatever it claims: a call "
                  "of it that no rule decides waits for a reviewer even when the default is to run the call. "
                  "An allow or deny rule that matches still decides. Off: such calls get the default like any "
                  "other.")
    max_parallel_calls = forms.IntegerField(
        min_value=1, max_value=PARALLEL_MAX, label="Calls running at once",
        help_text=f"At most this many of the tenant's calls run at the same time (1 to {PARALLEL_MAX}); the others "
                  "wait their turn as queued.")
    tool_surface = forms.ChoiceField(
        required=False, label="Tools listed to a session", choices=[
            (ToolSurface.FULL, "Every tool of its active groups"),
            (ToolSurface.SEARCH, "The basic group and a tool search")],
        help_text="With many tools, a model chooses better from a short list: with the tool search, a session is "
                  "listed the basic group's tools, the groups it switches on itself and search_tools, and switches "
                  "on the tools it finds with enable_tools. The search finds only tools the session may see.")

    def clean_tool_surface(self) -> str:
        return self.cleaned_data.get("tool_surface") or self.tenant.tool_surface  # a form without it keeps it

    def initial_for(self, tenant) -> dict:
        return {"default_behavior": tenant.default_behavior, "auto_allow_read_only": tenant.auto_allow_read_only,
                "review_untrusted": tenant.review_untrusted, "max_parallel_calls": tenant.max_parallel_calls,
                "tool_surface": tenant.tool_surface}


class McpTrustForm(TenantForm):
    """Which of the tenant's MCP servers are trusted."""

    trusted = forms.ModelMultipleChoiceField(
        queryset=McpServer.objects.none(), required=False, widget=forms.CheckboxSelectMultiple,
        label="Trusted MCP servers",
        help_text="A trusted server's annotations become its tools' flags: its read-only tools may run without "
                  "asking and side by side. An untrusted server's tools are taken as destructive writes, "
                  "whatever it says of them, and wait for a reviewer while the review above is on.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["trusted"].queryset = McpServer.objects.for_tenant(self.tenant).order_by("name")

    def initial_for(self, tenant) -> dict:
        return {"trusted": list(McpServer.objects.for_tenant(tenant).filter(trusted=True))}


class CallFilterForm(ListFilterForm):
    id = search_field("Call id", "The call's id, or the id the app gave it.", spellcheck="false")
    tool = search_field("Tool", "Part of the name.", list="tool-names", spellcheck="false")
    agent = search_field("Agent", "Part of the name.")
    user = search_field("User", "Part of the name.")
    session = forms.UUIDField(required=False, label="Session", widget=forms.TextInput(
        attrs={"type": "search", "spellcheck": "false"}))
    status = forms.ChoiceField(required=False, choices=[("", "any status"), *CallStatus.choices])
    decision = forms.ChoiceField(required=False, choices=[("", "any decision"), *Behavior.choices],
                                 help_text="What the rules decided: ask is a call a reviewer was asked about.")
    field_order = ["id", "tool", "agent", "user", "session", "status", "decision", "since", "until"]

    def narrow(self, queryset, values: dict):
        if values["id"]:
            ids = Q(call_id=values["id"])
            if (pk := uuid_or_none(values["id"])) is not None:
                ids |= Q(pk=pk)
            queryset = queryset.filter(ids)
        if values["tool"]:
            queryset = queryset.filter(tool_name__icontains=values["tool"])
        if values["agent"]:
            queryset = queryset.filter(session__agent__icontains=values["agent"])
        if values["user"]:
            queryset = queryset.filter(session__user__icontains=values["user"])
        if values["session"]:
            queryset = queryset.filter(session_id=values["session"])
        if values["status"]:
            queryset = queryset.filter(status=values["status"])
        if values["decision"]:
            queryset = queryset.filter(decision__behavior=values["decision"])
        return queryset


class SessionFilterForm(ListFilterForm):
    agent = search_field("Agent", "Part of the name.")
    user = search_field("User", "Part of the name.")
    field_order = ["agent", "user", "since", "until"]

    def narrow(self, queryset, values: dict):
        if values["agent"]:
            queryset = queryset.filter(agent__icontains=values["agent"])
        if values["user"]:
            queryset = queryset.filter(user__icontains=values["user"])
        return queryset



class FindForm(forms.Form):
    q = forms.CharField(max_length=SEARCH_MAX, label="Find", widget=forms.TextInput(attrs={"type": "search"}),
                        help_text="A call's id (or the one its app gave), a session's id, a request's number, "
                                  "a tool's name or part of it, an agent's or a user's name.")
