"""The activity page's SVG (console.activity.charts): marks in proportion on a round scale, breaks where a
bucket has no value, every text escaped, and a name and description for assistive technology."""
import re

import pytest

from console.activity.charts import HEIGHT, Series, bar_chart, column_chart, legend, line_chart


def _heights(svg: str) -> list[float]:
    return [float(h) for h in re.findall(r'<rect x="[^"]+" y="[^"]+" width="[^"]+" height="([^"]+)"', svg)]


def test_columns_stack_their_series_on_a_round_scale():
    svg = column_chart(chart_id="c", title="Calls", desc="Three buckets.", labels=["10:00", "10:01", "10:02"],
                       series=[Series("succeeded", "#2e8540", [3, 0, 1]), Series("failed", "#c62828", [1, 0, 0])])
    assert svg.startswith('<svg class="chart" id="c" role="img" aria-labelledby="c-title c-desc"')
    assert '<title id="c-title">Calls</title><desc id="c-desc">Three buckets.</desc>' in svg
    plot = HEIGHT - 12 - 26
    heights = _heights(svg)
    assert len(heights) == 3  # no mark for a zero
    # the scale's top: 5 for a total of 4
    assert [h / plot for h in heights] == pytest.approx([3 / 5, 1 / 5, 1 / 5], abs=1e-3)
    assert "<title>10:00: failed 1</title>" in svg
    assert ">10:00<" in svg


def test_lines_break_where_a_bucket_has_no_value():
    svg = line_chart(chart_id="l", title="Latency", desc="p50.", labels=["a", "b", "c", "d", "e"],
                     series=[Series("p50", "#000", [1.0, 2.0, None, 0.5, 0.25])])
    assert svg.count("<polyline") == 2  # a–b, then d–e
    assert svg.count("<circle") == 4


def test_bars_clip_and_escape_names_from_tenants_and_apps():
    name = '<img src=x onerror="alert(1)">' + "x" * 40
    svg = bar_chart(chart_id="b", title='Top "tools"', desc="<b>one</b>", rows=[(name, [7, 2])],
                    series=[("calls", "#111"), ("failed", "#c00")])
    assert "<img" not in svg and "<b>" not in svg
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in svg  # in full in the mark's tooltip
    assert "…</text>" in svg  # clipped beside the bar
    assert "<title id=\"b-title\">Top &quot;tools&quot;</title>" in svg
    assert 'style=' not in svg  # the console's policy refuses style attributes
    assert '<li><svg width="10" height="10" aria-hidden="true" focusable="false">' in legend([("calls", "#111")])
