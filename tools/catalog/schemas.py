"""Tool input schemas: checked when a tool is defined, compiled once per catalog version, never fetched.

A schema is data written by a tenant or offered by a source. Validating a call against it must not
reach the network, recurse without end or cost more than a call should: every `$ref` stays inside
the schema and resolves, and the size, the nesting and the number of subschemas one input can be
checked against are bounded. The same check runs again when a stored schema is compiled, so a row
that bypassed it makes its calls fail as misconfigured instead of doing any of that.
"""
import functools
import json
import unicodedata

import jsonschema
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable
from referencing.jsonschema import DRAFT202012

from tools.catalog.registry import RESERVED_TOOL_NAMES

MAX_SCHEMA_BYTES = 64 * 1024  # serialized as compact UTF-8 JSON
MAX_SCHEMA_DEPTH = 32  # nesting of objects and arrays in the schema document
MAX_SCHEMA_EXPANSION = 20_000  # subschemas one input can be checked against, each reference unrolled

_REFERENCES = ("$ref", "$dynamicRef")
# Keywords that apply their subschemas to the same value (a cycle of these never ends) ...
_IN_PLACE = ("allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas")
# ... and those that apply them to a part of it (a cycle through one ends with the input).
_DESCENDING = ("properties", "patternProperties", "additionalProperties", "items", "prefixItems", "contains",
               "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_SCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas")


class SchemaProblem(ValueError):
    """Why a schema cannot be a tool's input schema, said to the person who wrote it."""


class ToolMisconfigured(Exception):
    """The stored schema of a tool cannot be used to check its calls."""


def _refuse_retrieval(uri: str):
    raise NoSuchResource(ref=uri)


# Resolves what the schema itself contains (and the JSON Schema meta-schemas), retrieves nothing.
NOTHING_REMOTE = Registry(retrieve=_refuse_retrieval)


def name_key(name: str) -> str:
    """A name as a reader sees it: compatibility-normalised (NFKC) and case-folded."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())


_RESERVED_KEYS = frozenset(map(name_key, RESERVED_TOOL_NAMES))


def tool_name_reserved(name: str) -> bool:
    """Whether a tool may not take this name: a platform tool has it (in any case or composition)."""
    return name_key(name) in _RESERVED_KEYS


def bound_overrides(arguments: dict, bound) -> list[str]:
    """The input keys that name a bound argument, however they are cased or composed."""
    if not bound:
        return []
    bound_keys = {name_key(name) for name in bound}
    return sorted(key for key in arguments if name_key(key) in bound_keys)


def with_bound(arguments: dict, bound) -> dict:
    """The input a tool runs with: `arguments` (the model's, or a reviewer's edit) with the server's bound
    values merged last, so a bound value wins whatever was sent, in any case or composition of its name. The
    validate step refuses such input first; this holds without it."""
    if not bound:
        return dict(arguments)
    bound_keys = {name_key(name) for name in bound}
    return {**{key: value for key, value in arguments.items() if name_key(key) not in bound_keys}, **bound}


def declared_object_schema(schema, errors: dict, field: str) -> dict | None:
    """A tool's input schema as a tenant or an app declares it: an object that takes what it declares and nothing
    else (unless it says otherwise), checked. None, with the problem filed under `field` in `errors`, when it
    cannot be one."""
    if not isinstance(schema, dict):
        errors[field] = ['a JSON Schema of type "object"']
        return None
    schema = {"type": "object", **schema}
    if "additionalProperties" not in schema and "unevaluatedProperties" not in schema:
        schema["additionalProperties"] = False
    try:
        schema_check(schema)
    except SchemaProblem as exc:
        errors[field] = [f"the schema {exc}"]
        return None
    return schema


def schema_check(schema) -> None:
    """Raise SchemaProblem unless `schema` can be a tool's input schema.

    It must be a valid Draft 2020-12 schema of type "object" within the size and depth bounds, whose
    references (`$ref`, `$dynamicRef`) all point at subschemas of the schema itself ("#…"), with no
    cycle of references that never descends into the input.
    """
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise SchemaProblem('must be a JSON Schema of type "object"')
    if _nested_deeper_than(schema, MAX_SCHEMA_DEPTH):
        raise SchemaProblem(f"nests objects and arrays deeper than {MAX_SCHEMA_DEPTH} levels")
    text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_SCHEMA_BYTES:
        raise SchemaProblem(f"is {size} bytes; the limit is {MAX_SCHEMA_BYTES}")
    # The same text can stand for another document only where JSON cannot say it (keys that are not strings,
    # tuples): such a schema is checked as it is, every time.
    problem = _problem_of_text(text) if json.loads(text) == schema else _problem_of(schema)
    if problem is not None:
        raise SchemaProblem(problem)


@functools.lru_cache(maxsize=256)
def _problem_of_text(text: str) -> str | None:
    """`_problem_of` the schema written as `text`, kept per text: checking against the metaschema costs
    milliseconds, and a catalog's schemas are checked again with every new version of it."""
    return _problem_of(json.loads(text))


def _problem_of(schema: dict) -> str | None:
    """Why `schema` is not a valid Draft 2020-12 schema or expands too far; None when it is neither."""
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(part) for part in exc.path)
        return (f"is not a valid JSON Schema (Draft 2020-12): {_shorten(exc.message)}"
                + (f" at {where}" if where else ""))
    try:
        _check_expansion(schema, _reference_targets(schema))
    except SchemaProblem as exc:
        return str(exc)
    return None


class InputValidator:
    """A tool's input schema compiled for checking calls; `problem` says why a stored schema is unusable."""

    __slots__ = ("_validator", "problem")

    def __init__(self, schema):
        try:
            schema_check(schema)
        except SchemaProblem as exc:
            self.problem, self._validator = f"the tool's input schema {exc}", None
        else:
            self.problem = None
            self._validator = jsonschema.Draft202012Validator(schema, registry=NOTHING_REMOTE)

    def errors(self, instance) -> list[str]:
        """Where and why `instance` does not match the schema; [] when it does."""
        if self._validator is None:
            raise ToolMisconfigured(self.problem)
        try:
            found = sorted(self._validator.iter_errors(instance), key=lambda error: list(error.path))
        except Unresolvable as exc:  # a stored schema the check did not see: never fetched, never a 500
            raise ToolMisconfigured("the tool's input schema has a reference that does not resolve") from exc
        except RecursionError:
            return ["input: nested too deeply to be checked against the tool's schema"]
        return [f"{'/'.join(str(part) for part in error.path) or 'input'}: {error.message}" for error in found]


def argument_choices(schema) -> list[tuple[str, str]]:
    """The arguments an input schema names, each with a label saying its type and what it is for."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict):
        return []
    choices = []
    for name, spec in properties.items():
        spec = spec if isinstance(spec, dict) else {}
        kind = spec.get("type")
        label = f"{name} ({'/'.join(map(str, kind)) if isinstance(kind, list) else kind})" if kind else name
        if isinstance(spec.get("description"), str) and spec["description"].strip():
            label += f": {_shorten(spec['description'].strip(), 80)}"
        choices.append((name, label))
    return choices


def argument_problems(schema, name: str, value) -> list[str]:
    """Why `value` cannot be the argument `name` of a tool with this input schema ([] when it can): checked
    against the whole schema with nothing else required, so that references and the other keywords that
    apply to the argument hold, and only what concerns `name` counts."""
    validator = InputValidator({**schema, "required": []} if isinstance(schema, dict) else schema)
    if validator.problem is not None:
        return [validator.problem]
    return [problem for problem in validator.errors({name: value})
            if problem.startswith((f"{name}: ", f"{name}/"))]


def _shorten(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _nested_deeper_than(value, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def _subschemas(schema: dict):
    """Every subschema with the resolver that applies inside it (an embedded `$id` moves the base)."""
    root = DRAFT202012.create_resource(schema)
    stack = [(schema, NOTHING_REMOTE.resolver_with_root(root))]
    while stack:
        contents, resolver = stack.pop()
        yield contents, resolver
        for sub in DRAFT202012.subresources_of(contents):
            stack.append((sub, resolver.in_subresource(DRAFT202012.create_resource(sub))))


def _reference_targets(schema: dict) -> dict[int, list]:
    """The subschemas each referencing subschema (by id) may continue in; SchemaProblem for a bad reference."""
    nodes = list(_subschemas(schema))
    positions = {id(contents) for contents, _ in nodes}
    dynamic_anchors: dict[str, list] = {}
    for contents, _ in nodes:
        if isinstance(contents, dict) and isinstance(contents.get("$dynamicAnchor"), str):
            dynamic_anchors.setdefault(contents["$dynamicAnchor"], []).append(contents)
    targets: dict[int, list] = {}
    for contents, resolver in nodes:
        if not isinstance(contents, dict):
            continue
        for keyword in _REFERENCES:
            ref = contents.get(keyword)
            if ref is None:
                continue
            if not ref.startswith("#"):
                raise SchemaProblem(f"has {keyword} {_shorten(ref, 100)!r}, which leaves the schema (only references "
                                    "within it, '#…', are allowed: nothing is ever fetched)")
            try:
                target = resolver.lookup(ref).contents
            except Unresolvable:
                raise SchemaProblem(f"has {keyword} {_shorten(ref, 100)!r}, which points at nothing in it") from None
            if not isinstance(target, bool) and id(target) not in positions:
                raise SchemaProblem(f"has {keyword} {_shorten(ref, 100)!r}, which does not point at a subschema")
            found = targets.setdefault(id(contents), [])
            found.append(target)
            if keyword == "$dynamicRef":  # may land on any dynamic anchor of that name
                found.extend(dynamic_anchors.get(ref[1:], ()))
    return targets


def _applied(contents, keywords):
    for keyword in keywords:
        value = contents.get(keyword)
        if value is None:
            continue
        if keyword in _SCHEMA_MAPS:
            yield from value.values()
        elif isinstance(value, list):
            yield from value
        else:
            yield value


def _check_expansion(schema: dict, targets: dict[int, list]) -> None:
    """Walk every path an input's check can take, each reference unrolled once per path: refuse a cycle
    that never descends into the input (it would never end) and more than MAX_SCHEMA_EXPANSION steps."""
    path_kinds: list[bool] = []  # per node on the current path: was it entered in place?
    on_path: dict[int, int] = {}  # node id -> its index in path_kinds
    visits = 0
    stack: list[tuple] = [(schema, False, False)]  # (node, entered in place, leaving)
    while stack:
        node, in_place, leaving = stack.pop()
        if leaving:
            del on_path[id(node)]
            path_kinds.pop()
            continue
        seen_at = on_path.get(id(node))
        if seen_at is not None:
            if in_place and all(path_kinds[seen_at + 1:]):
                raise SchemaProblem("has a cycle of references that never descends into the input")
            continue
        visits += 1
        if visits > MAX_SCHEMA_EXPANSION:
            raise SchemaProblem(f"expands, with its references unrolled, to more than {MAX_SCHEMA_EXPANSION} "
                                "subschemas")
        if not isinstance(node, dict):
            continue
        on_path[id(node)] = len(path_kinds)
        path_kinds.append(in_place)
        stack.append((node, in_place, True))
        stack.extend((child, False, False) for child in _applied(node, _DESCENDING))
        stack.extend((child, True, False) for child in _applied(node, _IN_PLACE))
        stack.extend((target, True, False) for target in targets.get(id(node), ()))
