import json

from django import template
from django.utils import timezone
from django.utils.html import format_html

from common.json_values import input_changes
from tenancy.web import duration_text

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
    """The one way an instant is shown: to the second, in the viewer's time zone and named with it; the exact
    instant, with its offset from UTC, on hover and for machines."""
    if not value:
        return ""
    local = timezone.localtime(value)
    return format_html('<time datetime="{}" title="{}">{}</time>', local.isoformat(), _exact(local),
                       local.strftime("%Y-%m-%d %H:%M:%S %Z"))


def _exact(local) -> str:
    return local.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + local.strftime(" %Z (UTC%z)")


@register.filter
def duration(value) -> str:
    """The one way a duration is shown (`tenancy.web.duration_text`); nothing for none."""
    return "" if value is None or value == "" else duration_text(value)


@register.filter
def relative(value) -> str:
    """An instant as how long ago or how soon ("5 min ago", "in 59 min"), the exact instant on hover."""
    if not value:
        return ""
    local = timezone.localtime(value)
    seconds = (value - timezone.now()).total_seconds()
    text = "now" if abs(seconds) < 1 else (f"in {duration_text(int(seconds))}" if seconds > 0
                                            else f"{duration_text(int(-seconds))} ago")
    return format_html('<time datetime="{}" title="{}">{}</time>', local.isoformat(), _exact(local), text)


@register.filter
def since_start(value, start) -> str:
    """How long after `start` an instant came: "+0.35 s" (a call's events, after the call was made)."""
    if not value or not start:
        return ""
    return "+" + duration_text(value - start)
