"""The plugin's tools. Toolkeeper imports this module at start-up (the entry point in pyproject.toml);
each `@tool` function becomes a tool of every tenant's catalog, in the group `text-and-units`."""
from typing import Literal

from tools.python.decorators import ToolContext, ToolError, tool

GROUPS = ("text-and-units",)

# Each unit's size in its dimension's base unit (metre, kilogram, second).
UNITS = {
    "length": {"mm": 0.001, "cm": 0.01, "m": 1.0, "km": 1000.0, "in": 0.0254, "ft": 0.3048, "mi": 1609.344},
    "mass": {"g": 0.001, "kg": 1.0, "t": 1000.0, "oz": 0.028349523125, "lb": 0.45359237},
    "time": {"s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0},
}
TEMPERATURES = ("C", "F", "K")


@tool(read_only=True, idempotent=True, timeout=10, groups=GROUPS)
def word_count(text: str, ctx: ToolContext = None) -> dict:
    """Count the words, lines and characters of a text, and its most frequent words.

    Args:
        text: The text to count.
    """
    lines = text.splitlines() or [""]
    frequencies: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        for word in line.split():
            word = word.strip(".,;:!?\"'()[]{}").lower()
            if word:
                frequencies[word] = frequencies.get(word, 0) + 1
        if ctx is not None and (number % 1000 == 0 or number == len(lines)):
            ctx.emit(f"{number} of {len(lines)} lines counted", progress=number / len(lines))
    top = sorted(frequencies.items(), key=lambda item: (-item[1], item[0]))[:5]
    return {
        "words": sum(frequencies.values()),
        "lines": len(text.splitlines()),
        "characters": len(text),
        "most_frequent": [{"word": word, "count": count} for word, count in top],
    }


@tool(read_only=True, idempotent=True, timeout=5, groups=GROUPS)
def unit_convert(value: float, from_unit: str, to_unit: str) -> dict:
    """Convert a quantity between units of length, mass, time or temperature.

    Args:
        value: The quantity in `from_unit`.
        from_unit: mm, cm, m, km, in, ft, mi; g, kg, t, oz, lb; s, min, h, d; C, F, K.
        to_unit: A unit of the same dimension as `from_unit`.
    """
    if from_unit in TEMPERATURES and to_unit in TEMPERATURES:
        return {"value": round(_from_kelvin(_to_kelvin(value, from_unit), to_unit), 10), "unit": to_unit}
    for dimension, sizes in UNITS.items():
        if from_unit in sizes and to_unit in sizes:
            return {"value": round(value * sizes[from_unit] / sizes[to_unit], 10), "unit": to_unit,
                    "dimension": dimension}
    raise ToolError(f"cannot convert {from_unit!r} to {to_unit!r}", error_type="InvalidInput")


def _to_kelvin(value: float, unit: Literal["C", "F", "K"]) -> float:
    return {"C": value + 273.15, "F": (value - 32) * 5 / 9 + 273.15, "K": value}[unit]


def _from_kelvin(value: float, unit: Literal["C", "F", "K"]) -> float:
    return {"C": value - 273.15, "F": (value - 273.15) * 9 / 5 + 32, "K": value}[unit]
