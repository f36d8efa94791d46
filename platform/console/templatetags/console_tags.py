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


@register.filter
def input_diff(after, before) -> list[tuple[str, str, str]]:
    """How `after` (a reviewer's input) differs from `before` (the model's), argument by argument:
    ("-", name, old JSON) and ("+", name, new JSON) lines, in the arguments' order."""
    before = before if isinstance(before, dict) else {}
    after = after if isinstance(after, dict) else {}
    lines = []
    for name in [*before, *(name for name in after if name not in before)]:
        if before.get(name, _ABSENT) == after.get(name, _ABSENT):
            continue
        if name in before:
            lines.append(("-", name, compact_json(before[name])))
        if name in after:
            lines.append(("+", name, compact_json(after[name])))
    return lines


_ABSENT = object()
