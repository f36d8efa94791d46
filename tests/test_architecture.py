"""The platform's layers hold (docs/architecture.md): the import contracts in pyproject.toml pass, every
module has its place in them, and no import hides inside a function."""
import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
PACKAGES = CONFIG["root_packages"]
# Imports that must run late: AppConfig.ready's, where Django has loaded every app (Celery beat's schedule is read
# by its scheduler, tools.tasks.RuntimeScheduler, once Django is set up), and the OpenTelemetry SDK's, which loads
# only in a process that traces: with tracing off (a tool process above all, which must start fast) no process pays
# its 0.2 s of imports (common/tracing.py, `_sdk`).
LATE_IMPORTS: set = {("common/tracing.py", "_sdk")}


def layered_modules() -> set[str]:
    (contract,) = [c for c in CONFIG["contracts"] if c["id"] == "platform-layers"]
    return {name.strip() for layer in contract["layers"] for name in layer.replace("|", ":").split(":")}


def test_the_import_contracts_hold():
    linter = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(linter), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_every_module_has_its_place_in_the_layers():
    """A new module must be placed in the contract; otherwise it could import anything unchecked."""
    layered = layered_modules()
    graph = grimp.build_graph(*PACKAGES)
    split = {name.rsplit(".", depth)[0] for name in layered for depth in range(1, name.count(".") + 1)}

    def placed(module: str) -> bool:
        parts = module.split(".")
        return any(".".join(parts[:n]) in layered for n in range(1, len(parts) + 1))

    unplaced = sorted(m for m in graph.modules
                      if not placed(m) and m not in split and ".migrations" not in m)
    assert unplaced == []


def package_sources():
    for package in PACKAGES:
        folder = ROOT / package if (ROOT / package).is_dir() else ROOT / "platform" / package
        for path in sorted(folder.rglob("*.py")):
            if "migrations" not in path.parts:
                yield path.relative_to(folder.parent).as_posix(), ast.parse(path.read_text(), filename=str(path))


def test_no_import_hides_inside_a_function():
    hidden = []
    for path, tree in package_sources():
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
            if path.endswith("/apps.py") and function.name == "ready" or (path, function.name) in LATE_IMPORTS:
                continue
            hidden += [f"{path}:{node.lineno} in {function.name}" for node in ast.walk(function)
                       if isinstance(node, ast.Import | ast.ImportFrom)]
    assert hidden == []
