"""The call machinery keeps one import direction and one home per rule (read from the source, not run).

The import contracts (pyproject.toml) run in `make lint` and in tests/test_architecture.py; these tests keep
the call path's own properties: no cycles, executors picked from settings, the mode decided in settings
alone, and the rules that used to be copied living in one module each.
"""
import ast
from pathlib import Path

import grimp
import pytest

from tools.catalog.selectors import bindings_for
from tools.catalog.snapshot import CatalogSnapshot

ROOT = Path(__file__).resolve().parent.parent.parent
TOOLS = ROOT / "tools"
CALL_APPS = [ROOT / name for name in ("tools", "approvals", "knowledge")]


def sources(*folders: Path) -> dict[str, ast.Module]:
    return {str(path.relative_to(ROOT)): ast.parse(path.read_text(), filename=str(path))
            for folder in folders for path in sorted(folder.rglob("*.py")) if "migrations" not in path.parts}


def calls_of(tree: ast.AST, name: str) -> list[int]:
    """Lines where a function named `name` is called (as `name(...)` or `module.name(...)`)."""
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call) and (
        getattr(node.func, "id", None) == name or getattr(node.func, "attr", None) == name)]


def test_no_two_modules_of_tools_import_each_other_even_through_others():
    graph = grimp.build_graph("tools")
    circles = sorted(
        f"{importer} -> {imported} -> … -> {importer}"
        for importer in graph.modules for imported in graph.find_modules_directly_imported_by(importer)
        if imported.startswith("tools.") and graph.find_shortest_chain(importer=imported, imported=importer)
    )
    assert circles == []


@pytest.mark.parametrize("module", ["tools.calls.executors", "tools.tasks", "tools.calls.worker"])
def test_only_the_runtime_and_the_celery_tasks_import_an_executor_a_worker_or_a_task(module):
    """The runtime builds the executor that settings name (import_string); nothing imports one to pick it."""
    importers = grimp.build_graph("tools").find_modules_that_directly_import(module)
    assert importers <= {"tools.calls.runtime", "tools.tasks"}


def test_the_mode_is_read_from_settings_in_settings_alone():
    readers = []
    for path, tree in sources(*CALL_APPS, ROOT / "platform", ROOT / "skills").items():
        if path == "platform/toolkeeper/settings.py":
            continue
        readers += [f"{path}:{node.lineno}" for node in ast.walk(tree)
                    if isinstance(node, ast.Attribute) and node.attr == "TOOLKEEPER_EXECUTOR"]
    assert readers == []


def test_a_call_is_failed_in_one_place():
    """Every failure (pipeline, executor, timeout, lost worker, meta tool, reviewer, expiry, external error)
    goes through `tools.calls.events.call_fail`: only it builds the structured error."""
    builders = {path: lines for path, tree in sources(*CALL_APPS).items()
                if (lines := calls_of(tree, "call_error") + calls_of(tree, "error_result"))}
    assert set(builders) == {"tools/calls/events.py"}, builders


def test_the_call_paths_own_sql_is_in_one_module():
    """Raw SQL in the tools app is the call path's (tools/calls/statements.py) and the tool search's full-text
    statements (tools/catalog/search.py: tsquery ranking and FTS5 MATCH, which the ORM cannot say), nowhere else."""
    statements = {path: lines for path, tree in sources(TOOLS).items()
                  if (lines := calls_of(tree, "cursor") + calls_of(tree, "insert_row"))}
    assert set(statements) == {"tools/calls/statements.py", "tools/catalog/search.py"}, statements


def names_used(code) -> set[str]:
    """Global and attribute names a function's code uses, its comprehensions included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= names_used(const)
    return names


def test_which_bound_value_wins_is_decided_by_one_function():
    """The catalog snapshot (the call path) and `bindings_for` (approvals, the console, knowledge) both ask
    `tools.catalog.snapshot.bound_values`; neither orders bindings itself."""
    for function in (CatalogSnapshot.bound_values, bindings_for):
        used = names_used(function.__code__)
        assert "bound_values" in used and "sorted" not in used, function
