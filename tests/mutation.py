"""`make mutate`: the mutation score of the guard modules ([tool.mutmut] in pyproject.toml).

`prepare` lays out the directory mutmut works in, `var/mutation`. mutmut names a module after its file's
path, but the platform's apps are imported without their `platform/` folder (`tenancy.scoping`), and a
mutant whose name is not its module's is never switched on. So `platform` appears there as `src`, the one
prefix mutmut drops (and under its own name as an unmutated copy, for the tests that read the source tree);
everything else is linked as it is. mutmut keeps a verdict until the mutated function changes: after adding
tests, `make mutate MUTANTS='<names or globs>'` tries those mutants again.

A full run takes hours on two cores, longer than one sitting: `record` keeps mutmut's verdicts and its map of
tests to functions in `tests/mutation_record/` (committed), and `prepare` puts them back in a new checkout, so
the next `make mutate` goes on where the last stopped. mutmut keeps a recorded verdict only while the mutated
function's code is unchanged, and maps only new tests again.

`report` reads mutmut's results (`mutants/<module>.meta`). A surviving mutant is either killed by a test or
named in `tests/mutation_equivalents.toml` with the reason no test can tell it from the original; the
report shows each survivor's change and exits non-zero while the score is under the target or a survivor
is unexplained.
"""
import argparse
import fnmatch
import gzip
import json
import os
import shutil
import sys
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "var" / "mutation"
MUTANTS = WORK / "mutants"
LINKED = ("platform", "tools", "approvals", "knowledge", "skills", "tests", "templates", "examples", "manage.py")
EQUIVALENTS = ROOT / "tests" / "mutation_equivalents.toml"
RECORD = ROOT / "tests" / "mutation_record"
STATS = "mutmut-stats.json"  # mutmut's map of tests to the functions they reach, and the tests' durations
TARGET = 0.90
CAUGHT = {"killed", "timeout", "segfault"}  # a mutant that hangs or crashes the tests is caught too


def _status(exit_code) -> str:
    from mutmut.stats import status_by_exit_code

    return status_by_exit_code[exit_code]


def _meta_files() -> list[Path]:
    # not the record's copies that mutmut copies into mutants/ along with the tests
    return sorted(m for m in MUTANTS.rglob("*.py.meta") if m.relative_to(MUTANTS).parts[0] != "tests")


def _source_path(meta: Path) -> str:
    return str(meta.relative_to(MUTANTS))[: -len(".meta")]


def prepare() -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    for name, target in [("src", "platform"), *((n, n) for n in LINKED)]:
        link = WORK / name
        if not link.is_symlink():
            link.symlink_to(Path("..", "..", target))
    config = (ROOT / "pyproject.toml").read_text()
    for before, after in [('source_paths = ["platform"', 'source_paths = ["src"'), ('"platform/', '"src/'),
                          ('pythonpath = [".", "platform"]', 'pythonpath = [".", "src"]'),
                          # an unmutated copy under its own name too, for the tests that read the source tree
                          ("also_copy = [", 'also_copy = ["platform", ')]:
        assert before in config, before
        config = config.replace(before, after)
    (WORK / "pyproject.toml").write_text(config)
    (MUTANTS / "var" / "mutation-template.ready").unlink(missing_ok=True)  # migrate the template afresh
    restore()


def restore() -> None:
    """Put the recorded verdicts and stats where mutmut looks, unless this checkout has its own already."""
    if not RECORD.is_dir():
        return
    for recorded in RECORD.rglob("*.meta"):
        target = MUTANTS / recorded.relative_to(RECORD)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(recorded, target)
    stats = RECORD / f"{STATS}.gz"
    if stats.exists() and not (MUTANTS / STATS).exists():
        (MUTANTS / STATS).write_bytes(gzip.decompress(stats.read_bytes()))


def record() -> None:
    """Keep this checkout's verdicts and stats in the repository, for the next run to go on from."""
    if not MUTANTS.is_dir():
        raise SystemExit("nothing to record: run `make mutate`")
    shutil.rmtree(RECORD, ignore_errors=True)
    for meta in _meta_files():
        target = RECORD / meta.relative_to(MUTANTS)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(meta, target)
    if (MUTANTS / STATS).exists():
        # mtime=0: the same stats make the same bytes, so an unchanged map is no change to commit
        (RECORD / f"{STATS}.gz").write_bytes(gzip.compress((MUTANTS / STATS).read_bytes(), mtime=0))


def _change(name: str, path: str) -> list[str]:
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    diff = get_diff_for_mutant(name, path=path)
    return [line for line in diff.splitlines()
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def report() -> int:
    equivalents = tomllib.loads(EQUIVALENTS.read_text()).get("equivalent", {}) if EQUIVALENTS.exists() else {}
    totals: Counter = Counter()
    survivors: list[tuple[str, str]] = []  # survived, or no test reaches the function
    print(f"{'module':40} {'mutants':>7} {'caught':>7} {'survived':>9} {'untested':>9} {'unchecked':>10}   score")
    for meta in _meta_files():
        path = _source_path(meta)
        statuses = {name: _status(code) for name, code in json.loads(meta.read_text())["exit_code_by_key"].items()}
        counts = Counter("caught" if s in CAUGHT else s for s in statuses.values())
        checked = len(statuses) - counts["not checked"]
        totals.update(counts)
        totals["checked"] += checked
        survivors += [(name, path) for name, s in statuses.items() if s in {"survived", "no tests"}]
        shown = "platform/" + path.removeprefix("src/") if path.startswith("src/") else path
        score = f"{counts['caught'] / checked:.1%}" if checked else "-"
        print(f"{shown:40} {len(statuses):7} {counts['caught']:7} {counts['survived']:9} {counts['no tests']:9} "
              f"{counts['not checked']:10}   {score}")
    if not totals["checked"]:
        print("no results: run `make mutate`")
        return 2
    score = totals["caught"] / totals["checked"]
    reasons = {name: reason for name, _ in survivors
               for pattern, reason in equivalents.items() if fnmatch.fnmatchcase(name, pattern)}
    unexplained = [(name, path) for name, path in survivors if name not in reasons]
    explained = len(survivors) - len(unexplained)
    print(f"\n{totals['checked']} mutants checked: {totals['caught']} caught, {len(survivors)} not "
          f"({explained} explained, {len(unexplained)} unexplained)")
    print(f"mutation score: {score:.1%} (target {TARGET:.0%}); "
          f"without the explained ones: {totals['caught'] / (totals['checked'] - explained):.1%}")
    if totals["not checked"]:
        print(f"INCOMPLETE: {totals['not checked']} mutants not checked yet (`make mutate` goes on where it stopped)")
    for title, group in (("Unexplained survivors", unexplained),
                         ("Explained survivors", [s for s in survivors if s[0] in reasons])):
        if not group:
            continue
        print(f"\n{title}:")
        for name, path in group:
            print(f"  {name}" + (f": {reasons[name]}" if name in reasons else ""))
            for line in _change(name, path):
                print(f"      {line.strip()[:150]}")
    stale = sorted(pattern for pattern in equivalents
                   if not any(fnmatch.fnmatchcase(name, pattern) for name, _ in survivors))
    if stale:
        print(f"\n{len(stale)} entries of {EQUIVALENTS.name} name no surviving mutant (killed now, or renamed):")
        for name in stale:
            print(f"  {name}")
    complete = not totals["not checked"]
    return 0 if complete and score >= TARGET and not unexplained else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["prepare", "record", "report"])
    step = parser.parse_args().step
    if step in ("prepare", "record"):
        {"prepare": prepare, "record": record}[step]()
        return 0
    os.chdir(WORK)  # mutmut reads its files relative to the directory it ran in
    return report()


if __name__ == "__main__":
    sys.exit(main())
