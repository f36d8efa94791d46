"""The catalog's part of the console's pages: adding tools to a group from the page of a tool, an HTTP tool or
an MCP server (the group editor itself is the console's)."""
from django import forms
from django.contrib import messages

from tenancy.web import SERVICE_REFUSALS, acting_user, service_messages
from tools.catalog.services import group_tools_add
from tools.models import ToolGroup


class GroupAddForm(forms.Form):
    group = forms.ModelChoiceField(queryset=ToolGroup.objects.none(), label="Add to group",
                                   help_text="Sessions that see the group see the tool.")

    def __init__(self, *args, tenant, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["group"].queryset = ToolGroup.objects.for_tenant(tenant).order_by("name")


def tools_to_group(request, tools) -> None:
    """The POST of a `GroupAddForm`: the tools join the group chosen; the next page's message says how many."""
    form = GroupAddForm(request.POST, tenant=request.tenant)
    if not form.is_valid():
        messages.error(request, "Nothing was added: choose one of this tenant's groups.")
        return
    group = form.cleaned_data["group"]
    try:
        added = group_tools_add(group=group, tools=tools, actor=acting_user(request))
    except SERVICE_REFUSALS as exc:
        messages.error(request, "Nothing was added: " + "; ".join(service_messages(exc)))
        return
    if not tools:
        messages.info(request, "There is no tool to add yet.")
    elif added:
        messages.success(request, f"{len(added)} tool{'s' if len(added) != 1 else ''} added to the group "
                                  f"{group.name}.")
    else:
        messages.info(request, f"The group {group.name} has {'it' if len(tools) == 1 else 'them'} already.")
