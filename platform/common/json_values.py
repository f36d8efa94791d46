"""JSON from outside that the platform stores: only values every later reader can take.

Python's json module accepts what makes a stored row unreadable: a lone surrogate ("\\ud800", in a
string or a key), which no UTF-8 encoder takes, so every page and API answer that shows the row fails;
nesting so deep that loading or rendering the row overflows the stack; NaN and Infinity, which are not
JSON. PostgreSQL's jsonb refuses NUL (U+0000), so it is refused on every backend alike. The API's JSON
parser and every console form that reads JSON refuse such values with a message naming the problem.
"""
import json
import math

from django import forms
from django.forms.fields import InvalidJSONInput, JSONString

MAX_JSON_DEPTH = 64
NON_FINITE = "JSON numbers must be finite (NaN and Infinity are not JSON)"


def _character_problem(text: str) -> str | None:
    if "\x00" in text:
        return "JSON strings may not contain the NUL character (\\u0000)"
    if not text.isascii():  # O(1); an ASCII string holds no surrogate
        try:
            text.encode("utf-8")  # C speed, where scanning for surrogates in Python would not be
        except UnicodeEncodeError as exc:
            return (f"JSON strings may not contain a lone surrogate (\\u{ord(text[exc.start]):04x}); a character "
                    "outside the Basic Multilingual Plane is written as a pair of them")
    return None


def json_problem(value, *, max_depth: int = MAX_JSON_DEPTH, max_nodes: int | None = None) -> str | None:
    """Why a parsed JSON value cannot be stored and read back, or None when it can. With `max_nodes`, a value
    of more nodes (scalars, keys, lists and objects) is refused too, before its members are looked at."""
    containers = [(value, 1)]
    nodes = 1
    while containers:
        item, depth = containers.pop()
        if isinstance(item, dict):
            members = item.values()
            nodes += 2 * len(item)
            for key in item:
                if isinstance(key, str) and (problem := _character_problem(key)):
                    return problem
        elif isinstance(item, list):
            members = item
            nodes += len(item)
        else:  # the top-level value is a scalar
            members = (item,)
            depth = 0
        if depth > max_depth:
            return f"JSON may be nested at most {max_depth} levels deep"
        if max_nodes is not None and nodes > max_nodes:
            return f"JSON may hold at most {max_nodes} values (scalars, keys, arrays and objects)"
        for member in members:
            if isinstance(member, str):
                if problem := _character_problem(member):
                    return problem
            elif isinstance(member, dict | list):
                containers.append((member, depth + 1))
            elif isinstance(member, float) and not math.isfinite(member):
                return NON_FINITE
    return None


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def json_parse(text: str, *, max_depth: int = MAX_JSON_DEPTH, max_nodes: int | None = None):
    """The value of a JSON text the platform may store; ValueError saying what is wrong otherwise. Parsing is
    C speed and its depth bounded by the interpreter's recursion limit; the check of the value stops at the
    first problem, a count of nodes over `max_nodes` included."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from exc
    except RecursionError as exc:
        raise ValueError(f"JSON may be nested at most {max_depth} levels deep") from exc
    except ValueError as exc:  # NaN, or an integer with more digits than Python converts
        raise ValueError(f"not valid JSON: {exc}") from exc
    problem = json_problem(value, max_depth=max_depth, max_nodes=max_nodes)
    if problem is not None:
        raise ValueError(problem)
    return value


class JSONValueField(forms.JSONField):
    """Django's JSON form field, parsing with `json_parse`: a value it takes can be stored and shown."""

    def to_python(self, value):
        if self.disabled or value in self.empty_values:
            return super().to_python(value)
        if isinstance(value, list | dict | int | float | JSONString):
            return value
        try:
            converted = json_parse(value)
        except ValueError as exc:
            raise forms.ValidationError(str(exc), code="invalid") from exc
        return JSONString(converted) if isinstance(converted, str) else converted

    def bound_data(self, data, initial):
        if self.disabled:
            return initial
        if data is None:
            return None
        try:
            return json_parse(data)
        except ValueError:
            return InvalidJSONInput(data)


def flags_check(values: dict, names, errors: dict) -> None:
    """Each of `names` in `values` must be a JSON boolean; a problem is filed under its name in `errors`."""
    for name in names:
        if not isinstance(values[name], bool):
            errors[name] = ["true or false"]


def seconds_check(values: dict, name: str, bounds: tuple[float, float], errors: dict) -> None:
    """`values[name]` must be a number of seconds within `bounds` (a JSON boolean is not one); stored as a float."""
    low, high = bounds
    seconds = values[name]
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not low <= seconds <= high:
        errors[name] = [f"between {low} and {high:g} seconds"]
    else:
        values[name] = float(seconds)


_ABSENT = object()


def input_changes(before, after) -> list[tuple[str, str, str]]:
    """How the object `after` differs from `before`, argument by argument, as a diff reads:
    ("-", name, old JSON) and ("+", name, new JSON), in the arguments' order."""
    before = before if isinstance(before, dict) else {}
    after = after if isinstance(after, dict) else {}
    lines = []
    for name in [*before, *(name for name in after if name not in before)]:
        if before.get(name, _ABSENT) == after.get(name, _ABSENT):
            continue
        if name in before:
            lines.append(("-", name, json.dumps(before[name], ensure_ascii=False)))
        if name in after:
            lines.append(("+", name, json.dumps(after[name], ensure_ascii=False)))
    return lines
