"""@tool: JSON Schema from type hints and the docstring; ToolContext injected, never in the schema."""
from typing import Literal

import pytest

from tests.tools.support import registered_tool, unique_name
from tools.python import decorators
from tools.python.decorators import ToolContext, ToolError, build_python_tool


def _build(fn, **options):
    defaults = {"name": fn.__name__, "read_only": False, "destructive": False, "idempotent": False,
                "concurrency_safe": True, "timeout": 30, "groups": (), "kind": "python"}
    return build_python_tool(fn, **{**defaults, **options})


def search(query: str, ctx: ToolContext, limit: int = 10, tags: list[str] | None = None,
           mode: Literal["fast", "deep"] = "fast") -> list:
    """Search the knowledge base.

    Use it before answering factual questions.

    Args:
        query: What to look for,
            in plain words.
        limit: How many hits to return.
        tags: Only documents with these tags.
        mode: How hard to look.

    Returns:
        The hits.
    """
    return [query, limit, tags, mode, ctx]


def test_schema_from_hints_and_docstring():
    spec = _build(search)
    schema = spec.input_schema
    assert spec.description == "Search the knowledge base.\n\nUse it before answering factual questions."
    assert "Returns" not in spec.description and "Args" not in spec.description
    assert set(schema["properties"]) == {"query", "limit", "tags", "mode"}
    assert "ctx" not in schema["properties"]
    assert schema["required"] == ["query"]
    assert schema["properties"]["query"]["type"] == "string"
    assert schema["properties"]["query"]["description"] == "What to look for, in plain words."
    assert schema["properties"]["limit"] == {"type": "integer", "default": 10,
                                             "description": "How many hits to return."}
    assert schema["properties"]["mode"]["enum"] == ["fast", "deep"]
    assert schema.get("additionalProperties") is False
    assert "title" not in str(schema.keys()) and "title" not in schema["properties"]["query"]
    assert spec.context_param == "ctx"


def test_context_is_injected_and_arguments_are_validated():
    spec = _build(search)
    marker = object()
    assert spec({"query": "q"}, marker) == ["q", 10, None, "fast", marker]
    assert spec({"query": "q", "limit": 2, "mode": "deep"}, marker)[1:4] == [2, None, "deep"]
    for bad in ({}, {"query": "q", "limit": "many"}, {"query": "q", "extra": 1}, {"query": "q", "mode": "slow"},
                {"query": "q", "ctx": "forged"}):
        with pytest.raises(ToolError) as raised:
            spec(bad, marker)
        assert raised.value.error_type == "InvalidInput"


def test_flags_reach_the_definition():
    spec = _build(search, name="kb_search", read_only=True, idempotent=True, concurrency_safe=False, timeout=2.5,
                  groups=("research",))
    definition = spec.definition()
    assert definition.name == "kb_search"
    assert (definition.read_only, definition.destructive, definition.idempotent) == (True, False, True)
    assert definition.concurrency_safe is False
    assert definition.timeout_s == 2.5
    assert definition.default_groups == ("research",)
    assert definition.input_schema == spec.input_schema
    assert definition.source_ref.endswith("search")


def test_bad_names_and_signatures_are_refused():
    with pytest.raises(ValueError):
        _build(search, name="has space")
    with pytest.raises(ValueError):
        _build(search, name="x" * 65)

    def variadic(*args: str) -> None:
        """Nope."""

    with pytest.raises(TypeError):
        _build(variadic)


def test_decorator_registers_and_syncs(world):
    def greet(name: str) -> str:
        """Say hello.

        Args:
            name: Who to greet.
        """
        return f"hello {name}"

    tool_name = unique_name("greet")
    with registered_tool(greet, name=tool_name, read_only=True):
        assert decorators.python_tool(tool_name) is not None
        from tools.catalog.services import catalog_sync
        from tools.models import Tool

        catalog_sync(tenant=world.a.tenant)
        row = Tool.objects.for_tenant(world.a.tenant).get(name=tool_name)
        assert row.description == "Say hello."
        assert row.read_only is True
        assert row.input_schema["required"] == ["name"]
        assert row.input_schema["properties"]["name"]["description"] == "Who to greet."
        assert not Tool.objects.for_tenant(world.b.tenant).filter(name=tool_name).exists()
    assert decorators.python_tool(tool_name) is None


class Thermometer:
    """Tools made from methods: an instance's bound method is a tool; a method decorated in the class body is
    refused (nothing could give it `self`)."""

    def __init__(self, unit: str):
        self.unit = unit

    def read(self, room: str, precise: bool = False) -> str:
        """Read a room's temperature.

        Args:
            room: The room.
            precise: Whether to give decimals.
        """
        return f"{room}: 21{'.5' if precise else ''} {self.unit}"

    @classmethod
    def units(cls, system: str = "metric") -> list:
        """The units of a system."""
        return [cls.__name__, system]


def _refused(make, error=TypeError, match=None):
    before = decorators.python_tools()
    with pytest.raises(error, match=match):
        make()
    assert decorators.python_tools() == before  # a refusal registers nothing


def test_an_instances_method_is_a_tool_without_self(world):
    thermometer = Thermometer("°C")
    tool_name = unique_name("read")
    assert decorators.tool(thermometer.read, name=tool_name) == thermometer.read  # a bound method, as it was
    try:
        spec = decorators.python_tool(tool_name)
        assert spec is not None
        assert set(spec.input_schema["properties"]) == {"room", "precise"}  # no `self`
        assert spec.input_schema["required"] == ["room"]
        assert spec.description == "Read a room's temperature."
        assert spec({"room": "kitchen", "precise": True}) == "kitchen: 21.5 °C"  # the instance's own state
        with pytest.raises(ToolError) as raised:
            spec({"room": "kitchen", "self": "forged"})
        assert raised.value.error_type == "InvalidInput"
        assert spec.definition().source_ref.endswith("Thermometer.read")

        from tools.catalog.services import catalog_sync
        from tools.models import Tool

        catalog_sync(tenant=world.a.tenant)
        row = Tool.objects.for_tenant(world.a.tenant).get(name=tool_name)
        assert set(row.input_schema["properties"]) == {"room", "precise"}
    finally:
        decorators._registry.pop(tool_name, None)


def test_a_classmethod_of_the_class_is_a_tool_without_cls():
    tool_name = unique_name("units")
    with registered_tool(Thermometer.units, name=tool_name) as spec:
        assert set(spec.input_schema["properties"]) == {"system"}
        assert spec({"system": "imperial"}) == ["Thermometer", "imperial"]


def test_a_method_decorated_in_its_class_body_is_refused_and_registers_nothing():
    tool_name = unique_name("measure")

    def decorate_in_class_body():
        class Probe:
            @decorators.tool(name=tool_name)
            def measure(self, depth: int) -> int:
                """Measure."""
                return depth

    _refused(decorate_in_class_body, match=r"Probe\.measure is a method, whose 'self'.*tool\(instance\.measure\)")

    def bare_in_class_body():
        class Probe:
            @decorators.tool
            def measure_again(self, depth: int) -> int:
                """Measure."""
                return depth

    _refused(bare_in_class_body, match="is a method")
    assert decorators.python_tool(tool_name) is None

    class Holder:  # a function that takes no instance may be a tool wherever it is defined
        @staticmethod
        def plain(depth: int) -> int:
            """Plain."""
            return depth

    with registered_tool(Holder.plain, name=unique_name("plain")) as spec:
        assert set(spec.input_schema["properties"]) == {"depth"} and spec({"depth": 3}) == 3


def test_every_refusal_leaves_the_registry_unchanged():
    thermometer = Thermometer("K")
    _refused(lambda: decorators.tool(thermometer.read, name="has space"), ValueError)
    _refused(lambda: decorators.tool(thermometer.read, name="reset_tools"), ValueError)
    _refused(lambda: decorators.tool(thermometer.read, name=unique_name("read"), isolation="process"), ValueError,
             match="a function defined at module level")
    _refused(lambda: decorators.tool(thermometer.read, name=unique_name("read"), isolation="fibre"), ValueError)

    def variadic(*args: str) -> None:
        """Nope."""

    _refused(lambda: decorators.tool(variadic, name=unique_name("variadic")))
