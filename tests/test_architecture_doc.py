"""docs/architecture.md stays true: every dotted name in backticks of its "Where to add…" table and of its
package table names a module, or an attribute of one, that exists."""
import importlib
import re
from pathlib import Path

import pytest

DOC = (Path(__file__).resolve().parent.parent / "docs" / "architecture.md").read_text()
PACKAGES = ("tools", "approvals", "knowledge", "skills", "tenancy", "realtime", "console", "toolkeeper", "audit")


def section(title: str) -> str:
    start = DOC.index(title)
    end = DOC.find("\n## ", start + len(title))
    return DOC[start:end if end != -1 else None]


def dotted_names(text: str) -> list[str]:
    names = re.findall(r"`([a-z_]+(?:\.[A-Za-z_]+)+)`", text)
    return sorted({name for name in names if name.split(".")[0] in PACKAGES})


def resolves(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


WHERE_TO_ADD = dotted_names(section("## Where to add…"))


def test_the_table_names_a_place_for_each_extension_point():
    rows = [line.split("|")[1].strip() for line in section("## Where to add…").splitlines()
            if line.startswith("| ") and not line.startswith("| To add")]
    assert {"a tool source", "a rule condition", "a console page", "a notification channel",
            "an after-execution step", "an API endpoint"} <= set(rows)
    assert len(WHERE_TO_ADD) > 20


@pytest.mark.parametrize("name", WHERE_TO_ADD)
def test_every_name_in_the_where_to_add_table_exists(name):
    assert resolves(name), f"docs/architecture.md names {name}, which does not exist"


@pytest.mark.parametrize("name", dotted_names(section("## Layers")))
def test_every_name_in_the_layers_section_exists(name):
    assert resolves(name), f"docs/architecture.md names {name}, which does not exist"


def test_a_name_that_does_not_exist_is_caught():
    assert not resolves("tools.calls.pipeline.NoSuchStep")
    assert not resolves("tools.no_such_package.thing")
