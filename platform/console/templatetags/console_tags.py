import json

from django import template
from django.utils import timezone
from django.utils.html import format_html

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


@register.filter
def instant(value) -> str:
    """The one way an instant is shown: the minute, in the viewer's time zone and named with it; the exact
    instant, with its offset, on hover and for machines."""
    if not value:
        return ""
    local = timezone.localtime(value)
    return format_html('<time datetime="{}" title="{}">{}</time>', local.isoformat(),
                       local.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + local.strftime(" %Z (UTC%z)"),
                       local.strftime("%Y-%m-%d %H:%M %Z"))
