"""The plugins page: the packages and modules that contributed Python tools to this server (tools.python.plugins),
with the tools each brought into this tenant's catalog and the problems found while loading them."""
from django.shortcuts import render

from tenancy.web import MEMBER, tenant_view
from tools.models import Tool
from tools.python.plugins import plugins


@tenant_view(read=MEMBER)
def plugin_list(request):
    contributed = {name for plugin in plugins() for name in plugin.tools}
    catalog = dict(
        Tool.objects.for_tenant(request.tenant).filter(name__in=contributed, source__in=("python", "builtin"))
        .values_list("name", "pk")
    )
    rows = [(plugin, [(name, catalog.get(name)) for name in plugin.tools]) for plugin in plugins()]
    return render(request, "console/plugin_list.html", {"rows": rows})
