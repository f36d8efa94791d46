from django import template

from tools.python.plugins import plugin_of_tool

register = template.Library()


@register.simple_tag
def tool_plugin(tool):
    """The plugin that contributed this Python tool, or None (the platform's own tools, other sources)."""
    if tool.source not in ("python", "builtin"):
        return None
    return plugin_of_tool(tool.name)
