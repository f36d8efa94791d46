"""Node.js for the MCP interop tests that run independently written clients: the official conformance suite
(tests/mcp/test_conformance.py) and the TypeScript SDK client (tests/mcp/test_interop_ts.py), both from the
node packages of this folder (package.json, package-lock.json), which `make test` installs with `npm ci`.

Without Node.js 20+, npx or those packages the tests skip, unless TOOLKEEPER_REQUIRE_SERVICES=1, where they
fail.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PACKAGES = ("@modelcontextprotocol/conformance", "@modelcontextprotocol/sdk")
MIN_NODE_MAJOR = 20  # the conformance CLI 0.1.12 (undici 7) needs it


def node_problem(folder: Path = HERE, packages: tuple[str, ...] = PACKAGES) -> str | None:
    """What is missing to run the node side of these tests (the `packages` installed in `folder`), or None."""
    node, npx = shutil.which("node"), shutil.which("npx")
    if node is None or npx is None:
        return "Node.js and npm (node, npx) are not installed"
    try:
        version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30,
                                 stdin=subprocess.DEVNULL).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"node does not run ({exc})"
    found = re.match(r"v(\d+)\.", version)
    if found is None or int(found.group(1)) < MIN_NODE_MAJOR:
        return f"Node.js {MIN_NODE_MAJOR} or later is needed, {node} is {version or 'of an unknown version'}"
    missing = [name for name in packages if not (folder / "node_modules" / name / "package.json").is_file()]
    if missing:
        return (f"the node packages of {folder.name} are not installed ({', '.join(missing)}): "
                "`make test` installs them, or `npm ci` in that folder")
    return None


def require_node(folder: Path = HERE, packages: tuple[str, ...] = PACKAGES) -> str:
    """The node executable; or skip the test (fail it with TOOLKEEPER_REQUIRE_SERVICES=1) saying what is missing."""
    problem = node_problem(folder, packages)
    if problem is not None:
        if os.environ.get("TOOLKEEPER_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{problem}; it is required (TOOLKEEPER_REQUIRE_SERVICES=1)")
        pytest.skip(problem)
    return shutil.which("node")
