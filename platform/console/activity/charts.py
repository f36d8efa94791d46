"""Small SVG charts drawn on the server for the activity page: columns (stacked), lines and horizontal bars.

Each chart is an `<svg role="img">` named by its own `<title>` and `<desc>` (a sentence that says what it
shows), with a `<title>` per mark for a pointer's tooltip; the page puts the same numbers in a table beside
it. Every text (a tool's, a queue's or a server's name comes from a tenant or an app) is escaped here, and
colours are presentation attributes, so the console's Content-Security-Policy (no `style` attributes) holds.
"""
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

WIDTH, BAR_WIDTH, HEIGHT = 1100, 540, 220  # the time charts span the page, the bar charts half of it
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 12, 26
X_LABELS = 6  # bucket labels along the time axis
BAR_HEIGHT, BAR_GAP, BAR_LABEL = 12, 10, 170
AXIS, GRID, TEXT = "#5d6678", "#dde1e8", "#1d2330"


@dataclass(frozen=True)
class Series:
    name: str
    colour: str
    values: Sequence[float | None]


def _number(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _ceiling(value: float) -> float:
    """A round top for an axis: 1, 2 or 5 times a power of ten, at least `value`."""
    if value <= 0:
        return 1
    power = 10.0 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= value * (1 - 1e-9))


def _frame(chart_id: str, title: str, desc: str, body: str, *, width: int = WIDTH, height: int = HEIGHT) -> SafeString:
    return format_html(
        '<svg class="chart" id="{id}" role="img" aria-labelledby="{id}-title {id}-desc" viewBox="0 0 {w} {h}" '
        'width="100%" preserveAspectRatio="xMinYMin meet" xmlns="http://www.w3.org/2000/svg">'
        '<title id="{id}-title">{title}</title><desc id="{id}-desc">{desc}</desc>{body}</svg>',
        id=chart_id, w=width, h=height, title=title, desc=desc, body=mark_safe(body))  # noqa: S308 (built below, escaped)


def _value_axis(top: float, fmt: Callable[[float], str]) -> str:
    plot = HEIGHT - TOP - BOTTOM
    lines = []
    for fraction in (0, 0.5, 1):
        y = TOP + plot * (1 - fraction)
        lines.append(format_html(
            '<line x1="{x1}" x2="{x2}" y1="{y}" y2="{y}" stroke="{grid}"/>'
            '<text x="{tx}" y="{ty}" text-anchor="end" font-size="11" fill="{axis}">{label}</text>',
            x1=LEFT, x2=WIDTH - RIGHT, y=_number(y), grid=GRID, tx=LEFT - 6, ty=_number(y + 4), axis=AXIS,
            label=fmt(top * fraction)))
    return "".join(lines)


def _time_axis(labels: Sequence[str]) -> str:
    count = len(labels)
    step = max(1, count // X_LABELS)
    slot = (WIDTH - LEFT - RIGHT) / max(count, 1)
    return format_html_join("", '<text x="{}" y="{}" text-anchor="middle" font-size="11" fill="{}">{}</text>', (
        (_number(LEFT + slot * (i + 0.5)), HEIGHT - 8, AXIS, labels[i]) for i in range(0, count, step)))


def column_chart(*, chart_id: str, title: str, desc: str, labels: Sequence[str], series: Sequence[Series],
                 fmt: Callable[[float], str] = lambda v: _number(v)) -> SafeString:
    """Stacked columns, one per label (a bucket of time), a segment per series."""
    totals = [sum(s.values[i] or 0 for s in series) for i in range(len(labels))]
    top = _ceiling(max(totals, default=0))
    plot = HEIGHT - TOP - BOTTOM
    slot = (WIDTH - LEFT - RIGHT) / max(len(labels), 1)
    marks = []
    for i, label in enumerate(labels):
        base = 0.0
        for s in series:
            value = s.values[i] or 0
            if not value:
                continue
            y_top = TOP + plot * (1 - (base + value) / top)
            marks.append(format_html(
                '<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{colour}"><title>{label}: {name} {value}</title>'
                '</rect>', x=_number(LEFT + slot * i + slot * 0.1), y=_number(y_top), w=_number(slot * 0.8),
                h=_number(plot * value / top), colour=s.colour, label=label, name=s.name, value=fmt(value)))
            base += value
    body = _value_axis(top, fmt) + "".join(marks) + _time_axis(labels)
    return _frame(chart_id, title, desc, body)


def line_chart(*, chart_id: str, title: str, desc: str, labels: Sequence[str], series: Sequence[Series],
               fmt: Callable[[float], str] = lambda v: _number(v)) -> SafeString:
    """A line per series over the labels; a bucket without a value breaks the line."""
    top = _ceiling(max((v for s in series for v in s.values if v is not None), default=0))
    plot = HEIGHT - TOP - BOTTOM
    slot = (WIDTH - LEFT - RIGHT) / max(len(labels), 1)
    marks = []
    for s in series:
        points = []
        for i, value in enumerate(s.values):
            if value is None:
                if len(points) > 1:
                    marks.append(_polyline(points, s.colour))
                points = []
                continue
            x, y = LEFT + slot * (i + 0.5), TOP + plot * (1 - value / top)
            points.append((x, y))
            marks.append(format_html(
                '<circle cx="{x}" cy="{y}" r="2.5" fill="{colour}"><title>{label}: {name} {value}</title></circle>',
                x=_number(x), y=_number(y), colour=s.colour, label=labels[i], name=s.name, value=fmt(value)))
        if len(points) > 1:
            marks.append(_polyline(points, s.colour))
    body = _value_axis(top, fmt) + "".join(marks) + _time_axis(labels)
    return _frame(chart_id, title, desc, body)


def _polyline(points: list[tuple[float, float]], colour: str) -> str:
    return format_html('<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>',
                       " ".join(f"{_number(x)},{_number(y)}" for x, y in points), colour)


def bar_chart(*, chart_id: str, title: str, desc: str, rows: Sequence[tuple[str, Sequence[float | None]]],
              series: Sequence[tuple[str, str]], fmt: Callable[[float], str] = lambda v: _number(v)) -> SafeString:
    """Horizontal bars: a row per label, a bar per series (name, colour) in it, all on one scale."""
    top = _ceiling(max((v for _, values in rows for v in values if v is not None), default=0))
    group = len(series) * BAR_HEIGHT + BAR_GAP
    height = TOP + group * max(len(rows), 1) + 8
    span = BAR_WIDTH - BAR_LABEL - RIGHT - 60
    marks = []
    for r, (label, values) in enumerate(rows):
        y0 = TOP + group * r
        marks.append(format_html(
            '<text x="{x}" y="{y}" text-anchor="end" font-size="12" fill="{fill}">{label}</text>',
            x=BAR_LABEL - 8, y=_number(y0 + len(series) * BAR_HEIGHT / 2 + 4), fill=TEXT,
            label=_clip(label)))
        for s, ((name, colour), value) in enumerate(zip(series, values, strict=True)):
            if value is None:
                continue
            y = y0 + s * BAR_HEIGHT
            width = span * value / top
            marks.append(format_html(
                '<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{colour}"><title>{label}: {name} {value}</title>'
                '</rect><text x="{tx}" y="{ty}" font-size="11" fill="{axis}">{value}</text>',
                x=BAR_LABEL, y=_number(y), w=_number(width), h=BAR_HEIGHT - 2, colour=colour, label=label, name=name,
                value=fmt(value), tx=_number(BAR_LABEL + width + 4), ty=_number(y + BAR_HEIGHT - 3), axis=AXIS))
    return _frame(chart_id, title, desc, "".join(marks), width=BAR_WIDTH, height=height)


def _clip(label: str, most: int = 24) -> str:
    return label if len(label) <= most else label[:most - 1] + "…"


def legend(series: Sequence[tuple[str, str]]) -> SafeString:
    """The series' names with their colours, as a list (the chart's colours are not its only key: the table
    beside it names every number)."""
    return format_html('<ul class="legend">{}</ul>', format_html_join(
        "", '<li><svg width="10" height="10" aria-hidden="true" focusable="false"><rect width="10" height="10" '
            'fill="{}"/></svg> {}</li>', ((colour, name) for name, colour in series)))
