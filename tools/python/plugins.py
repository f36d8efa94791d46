"""Plugins: Python packages (or plain modules) installed beside Toolkeeper that contribute `@tool` functions.

Found at start-up (`ToolsConfig.ready`, so in the server, the Celery workers and the tool processes alike):

- every entry point of the group `toolkeeper.tools` of the installed distributions, e.g. in a plugin's
  pyproject.toml: `[project.entry-points."toolkeeper.tools"]` then `text = "toolkeeper_text.tools"`;
- every module named in the setting TOOLKEEPER_TOOL_MODULES (comma-separated in the environment).

A target is `module` (importing it registers its `@tool` functions) or `module:function`, a function called
once without arguments after the import, for a plugin that decides at start-up which tools to register.

What a plugin contributed is what the registry of Python tools gained around its loading. A plugin that
fails (its import or function raises anything) keeps none of its tools. A tool whose name another tool has
already taken, that the platform's namespaces reserve, or whose input schema the catalog refuses is left out
alone; the plugin's other tools stay. Each problem is logged at ERROR and kept in the plugin's report; the
server starts anyway. The catalog sync (`tools.catalog.services.catalog_sync`, after every `migrate`) then brings the
plugins' tools into each tenant's catalog, where they are governed like any tool.
"""
from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from importlib import metadata

from tools.catalog.schemas import SchemaProblem, schema_check
from tools.python import decorators

logger = logging.getLogger("toolkeeper.plugins")

ENTRY_POINT_GROUP = "toolkeeper.tools"
FROM_SETTING = "module"  # the origin of a module named in TOOLKEEPER_TOOL_MODULES
# Names that other sources own in every tenant's catalog (an MCP server's tools).
FOREIGN_PREFIXES = ("mcp__",)


@dataclass(frozen=True)
class PluginTarget:
    """Where one plugin is to be loaded from."""

    name: str  # the entry point's name, or the module named in the setting
    target: str  # `module` or `module:function`
    origin: str  # "entry point" or FROM_SETTING
    package: str = ""  # the distribution that declares the entry point
    version: str = ""


@dataclass
class Plugin:
    name: str
    target: str
    origin: str
    package: str = ""
    version: str = ""
    tools: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """Nothing of it was kept (its loading raised)."""
        return bool(self.problems) and not self.tools

    @property
    def label(self) -> str:
        return f"{self.package} {self.version}".strip() if self.package else self.name


_plugins: list[Plugin] = []
_tool_plugins: dict[str, Plugin] = {}


def plugin_targets(modules=()) -> list[PluginTarget]:
    """The entry points of the group (one per distribution and name) and then the modules of the setting."""
    found = []
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = entry_point.dist
        found.append(PluginTarget(
            name=entry_point.name, target=entry_point.value, origin="entry point",
            package=dist.name if dist is not None else "", version=dist.version if dist is not None else "",
        ))
    found.sort(key=lambda target: (target.package.lower(), target.name))
    return found + [PluginTarget(name=module, target=module, origin=FROM_SETTING) for module in modules]


def plugin_load(target: PluginTarget, *, report_errors: bool = True) -> Plugin:
    """Import one plugin and keep what it registered that may stay (see the module's docstring)."""
    plugin = Plugin(name=target.name, target=target.target, origin=target.origin, package=target.package,
                    version=target.version)
    registry = decorators._registry  # the live registry: a failed plugin's tools are taken out of it again
    before = dict(registry)
    try:
        _import(target.target)
    except BaseException as exc:  # a plugin's sys.exit() does not end the server either
        _restore(registry, before)
        if isinstance(exc, KeyboardInterrupt):
            raise
        _problem(plugin, f"failed to load: {type(exc).__name__}: {_shorten(str(exc))}", report_errors, exc)
        return plugin
    for name, spec in list(registry.items()):
        if before.get(name) is spec:
            continue
        refusal = _refusal(name, spec, taken=name in before)
        if refusal:
            if name in before:
                registry[name] = before[name]  # the first comer keeps the name
            else:
                del registry[name]
            _problem(plugin, f"tool {name}: {refusal}", report_errors)
        else:
            plugin.tools.append(name)
    if not plugin.tools and not plugin.problems:
        _problem(plugin, "registered no tools (was its module imported before, by another plugin?)", report_errors)
    plugin.tools.sort()
    return plugin


def plugins_load(modules=(), *, report_errors: bool = True) -> list[Plugin]:
    """Load every plugin once per process; the report is kept for `plugins()`."""
    loaded = []
    for target in plugin_targets(modules):
        plugin = plugin_load(target, report_errors=report_errors)
        loaded.append(plugin)
        for name in plugin.tools:
            _tool_plugins[name] = plugin
    _plugins.extend(loaded)
    return loaded


def plugins() -> list[Plugin]:
    return list(_plugins)


def plugin_problems() -> list[tuple[Plugin, str]]:
    return [(plugin, problem) for plugin in _plugins for problem in plugin.problems]


def plugin_of_tool(name: str) -> Plugin | None:
    """The plugin that contributed the Python tool of this name (None for the platform's own tools)."""
    return _tool_plugins.get(name)


def _import(target: str) -> None:
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name.strip())
    if attribute:
        function = module
        for part in attribute.strip().split("."):
            function = getattr(function, part)
        if not callable(function):
            raise TypeError(f"{attribute.strip()} is not a function")
        function()


def _restore(registry: dict, before: dict) -> None:
    registry.clear()
    registry.update(before)


def _refusal(name: str, spec, *, taken: bool) -> str:
    if taken:
        return "the name is taken by another tool; the plugin's tool is left out"
    if name.startswith(FOREIGN_PREFIXES):
        return f"names starting with {' or '.join(FOREIGN_PREFIXES)} belong to another source of tools"
    try:
        schema_check(spec.input_schema)
    except SchemaProblem as exc:
        return f"its input schema {exc}"
    except Exception as exc:  # pydantic cannot describe a parameter's type
        return f"its input schema cannot be made: {_shorten(str(exc))}"
    return ""


def _problem(plugin: Plugin, text: str, report: bool, exc: BaseException | None = None) -> None:
    plugin.problems.append(text)
    if report:
        # The exception's trace goes to the server's log only; the report keeps one line.
        logger.error("plugin %s (%s): %s", plugin.name, plugin.label if plugin.package else plugin.origin, text,
                     exc_info=exc)


def _shorten(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
