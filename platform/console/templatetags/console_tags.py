import json

from django import template

register = template.Library()


@register.filter
def pretty_json(value) -> str:
    """JSON for a <pre>: indented, as stored (the template autoescapes it)."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


@register.filter
def compact_json(value) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
