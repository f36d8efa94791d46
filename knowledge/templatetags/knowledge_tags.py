from django import template
from django.utils.html import escape
from django.utils.safestring import mark_safe

from knowledge.selectors import HL_START, HL_STOP

register = template.Library()


@register.filter
def highlight(snippet: str) -> str:
    """A search snippet as HTML: escaped, matched words in <mark>."""
    return mark_safe(escape(snippet or "").replace(HL_START, "<mark>").replace(HL_STOP, "</mark>"))  # noqa: S308
