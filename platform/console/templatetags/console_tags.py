import json

from django import template

from common.json_values import input_changes

register = template.Library()


@register.filter
def pretty_json(value) -> str:
    """JSON for a <pre>: indented, as stored (the template autoescapes it)."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


@register.filter
def compact_json(value) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


@register.filter
def input_diff(after, before) -> list[tuple[str, str, str]]:
    """A reviewer's input (`after`) against the model's (`before`), argument by argument."""
    return input_changes(before, after)
