"""Plugins in this process: discovery (entry points, the setting's modules), what each contributed, and what a
broken one leaves behind (nothing of a failed import; the first comer keeps a name). The same on a real server,
with a package installed in a virtualenv, is tests/live/test_plugins_live.py."""
import importlib
import logging
import sys
import textwrap
import uuid

import pytest

from tools.catalog.services import catalog_sync_all
from tools.models import Tool, ToolGroup
from tools.python import decorators, plugins
from tools.python.decorators import ToolError
from tools.python.plugins import PluginTarget, plugin_load, plugin_of_tool, plugins_load
from tools.python.source import PythonSource


@pytest.fixture
def plugin_home(tmp_path, monkeypatch):
    """A directory on the import path for the test's plugin modules (and distributions); the Python tool
    registry, the plugin report and the imported modules are as before after the test."""
    monkeypatch.syspath_prepend(str(tmp_path))
    registry, loaded, by_tool = dict(decorators._registry), list(plugins._plugins), dict(plugins._tool_plugins)
    modules = set(sys.modules)

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        return name

    write.path = tmp_path
    yield write
    decorators._registry.clear()
    decorators._registry.update(registry)
    plugins._plugins[:] = loaded
    plugins._tool_plugins.clear()
    plugins._tool_plugins.update(by_tool)
    for name in set(sys.modules) - modules:
        del sys.modules[name]


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def module_target(name: str) -> PluginTarget:
    return PluginTarget(name=name, target=name, origin=plugins.FROM_SETTING)


def test_entry_points_and_the_settings_modules_are_found_and_credited(plugin_home, db, world):
    tool_a, tool_b, plain_tool = unique("pkg_tool"), unique("pkg_tool"), unique("plain_tool")
    package_module = plugin_home(unique("tkp_pkg"), f"""
        from tools.python.decorators import tool

        @tool(name="{tool_a}", read_only=True, groups=("plugin-tools",))
        def first(text: str) -> str:
            return text.upper()

        @tool(name="{tool_b}")
        def second(n: int) -> int:
            return n + 1
    """)
    plain_module = plugin_home(unique("tkp_plain"), f"""
        from tools.python.decorators import tool

        @tool(name="{plain_tool}")
        def plain() -> str:
            return "plain"
    """)
    dist = plugin_home.path / "tkp_unit_dist-1.2.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tkp-unit-dist\nVersion: 1.2.3\n")
    (dist / "entry_points.txt").write_text(f"[toolkeeper.tools]\nunit = {package_module}\n")

    loaded = plugins_load([plain_module])

    by_name = {plugin.name: plugin for plugin in loaded}
    packaged, plain = by_name["unit"], by_name[plain_module]
    assert (packaged.origin, packaged.package, packaged.version, packaged.target) == (
        "entry point", "tkp-unit-dist", "1.2.3", package_module)
    assert packaged.tools == sorted([tool_a, tool_b]) and not packaged.problems
    assert (plain.origin, plain.package, plain.tools, plain.problems) == ("module", "", [plain_tool], [])
    assert plugin_of_tool(tool_a) is packaged and plugin_of_tool(plain_tool) is plain
    assert plugin_of_tool("calculate") is None  # the platform's own
    assert decorators.python_tool(tool_a)({"text": "hi"}) == "HI"

    # The sync that runs after `migrate` brings them into an existing tenant's catalog, in their group.
    catalog_sync_all()
    tool = Tool.objects.for_tenant(world.a.tenant).get(name=tool_a)
    assert tool.read_only and tool.source == "python"
    assert ToolGroup.objects.for_tenant(world.a.tenant).get(name="plugin-tools").tools.filter(pk=tool.pk).exists()


def test_a_plugin_that_raises_midway_keeps_none_of_its_tools(plugin_home, caplog):
    registered_first = unique("half_tool")
    module = plugin_home(unique("tkp_half"), f"""
        from tools.python.decorators import tool

        @tool(name="{registered_first}")
        def first() -> str:
            return "registered before the failure"

        raise RuntimeError("the plugin's configuration file is missing")
    """)
    with caplog.at_level(logging.ERROR, logger="toolkeeper.plugins"):
        plugin = plugin_load(module_target(module))

    assert plugin.failed and plugin.tools == []
    assert plugin.problems == ["failed to load: RuntimeError: the plugin's configuration file is missing"]
    assert decorators.python_tool(registered_first) is None
    record = next(r for r in caplog.records if module in r.getMessage())
    assert record.levelno == logging.ERROR and record.exc_info is not None  # the trace is for the log only
    assert "Traceback" not in plugin.problems[0]


def test_a_name_taken_by_a_shipped_tool_stays_with_it(plugin_home):
    original = decorators.python_tool("calculate")
    kept = unique("kept_tool")
    module = plugin_home(unique("tkp_clash"), f"""
        from tools.python.decorators import tool

        @tool
        def calculate(expression: str) -> str:
            return "not the calculator"

        @tool(name="{kept}")
        def fine() -> str:
            return "fine"
    """)
    plugin = plugin_load(module_target(module))

    assert decorators.python_tool("calculate") is original
    assert plugin.tools == [kept] and not plugin.failed
    assert plugin.problems == ["tool calculate: the name is taken by another tool; the plugin's tool is left out"]


def test_a_second_plugin_cannot_take_the_first_ones_name(plugin_home):
    name = unique("shared_name")
    source = f"""
        from tools.python.decorators import tool

        @tool(name="{name}")
        def mine() -> str:
            return "{{}}"
    """
    first = plugin_load(module_target(plugin_home(unique("tkp_first"), source.replace("{}", "first"))))
    second = plugin_load(module_target(plugin_home(unique("tkp_second"), source.replace("{}", "second"))))
    assert first.tools == [name] and second.failed
    assert decorators.python_tool(name)({}) == "first"


def test_reserved_and_foreign_names_and_refused_schemas_are_left_out(plugin_home):
    reserved = plugin_load(module_target(plugin_home(unique("tkp_reserved"), """
        from tools.python.decorators import tool

        @tool(name="reset_tools")
        def reset() -> str:
            return "mine"
    """)))
    assert reserved.failed and "reserved" in reserved.problems[0]

    deep = "int"
    for _ in range(40):
        deep = f"list[{deep}]"
    foreign, too_deep = unique("mcp__github__fake"), unique("deep_tool")
    mixed = plugin_load(module_target(plugin_home(unique("tkp_mixed"), f"""
        from tools.python.decorators import tool

        @tool(name="{foreign}")
        def pretends() -> str:
            return "an MCP server's tool"

        @tool(name="{too_deep}")
        def nested(value: {deep}) -> int:
            return 0
    """)))
    assert mixed.tools == [] and len(mixed.problems) == 2
    assert decorators.python_tool(foreign) is None and decorators.python_tool(too_deep) is None
    problems = " ".join(mixed.problems)
    assert "another source of tools" in problems and "nests objects and arrays deeper" in problems


def test_module_function_form_and_exits_and_missing_modules(plugin_home):
    name = unique("late_tool")
    module = plugin_home(unique("tkp_function"), f"""
        from tools.python.decorators import tool

        def late() -> str:
            return "registered by a function"

        def register():
            tool(late, name="{name}")
    """)
    plugin = plugin_load(PluginTarget(name="late", target=f"{module}:register", origin="entry point"))
    assert plugin.tools == [name] and decorators.python_tool(name)({}) == "registered by a function"

    exits = plugin_load(module_target(plugin_home(unique("tkp_exit"), "import sys\nsys.exit(3)\n")))
    assert exits.problems == ["failed to load: SystemExit: 3"]
    missing = plugin_load(module_target(unique("tkp_not_installed")))
    assert missing.failed and "ModuleNotFoundError" in missing.problems[0]


def test_the_plugins_page_lists_plugins_tools_and_problems(plugin_home, world):
    good = unique("page_tool")
    plugins_load([
        plugin_home(unique("tkp_page"), f"""
            from tools.python.decorators import tool

            @tool(name="{good}", groups=("basic",))
            def shown() -> str:
                return "shown"
        """),
        plugin_home(unique("tkp_page_broken"), "raise ImportError('needs the secret service')\n"),
    ])
    catalog_sync_all()
    tool = Tool.objects.for_tenant(world.a.tenant).get(name=good)

    page = world.a.console("operator").get(f"/t/{world.a.tenant.slug}/tools/plugins/").content.decode()
    assert f'href="/t/{world.a.tenant.slug}/tools/{tool.pk}/"' in page
    assert "failed to load: ImportError: needs the secret service" in page
    viewer_page = world.a.console("viewer").get(f"/t/{world.a.tenant.slug}/tools/plugins/").content.decode()
    assert "needs the secret service" not in viewer_page and "1 problem" in viewer_page

    detail = world.a.console("viewer").get(f"/t/{world.a.tenant.slug}/tools/{tool.pk}/").content.decode()
    assert "<dt>Plugin</dt>" in detail and "tools/plugins/" in detail
    listing = world.a.console("viewer").get(f"/t/{world.a.tenant.slug}/tools/").content.decode()
    assert f'href="/t/{world.a.tenant.slug}/tools/plugins/"' in listing


def test_a_python_tool_whose_code_is_gone_is_unavailable_not_an_error_of_the_server(world):
    """A catalog row outlives its plugin (uninstalled since the last sync): calling it says so to the model."""
    orphan = Tool.objects.create(tenant=world.a.tenant, name=f"gone_{uuid.uuid4().hex[:8]}", source="python",
                                 input_schema={"type": "object"})
    with pytest.raises(ToolError) as refused:
        PythonSource().invoke(orphan, {}, None)
    assert refused.value.error_type == "ToolUnavailable"
    assert str(refused.value) == f"the code of {orphan.name} is not installed on this server"
