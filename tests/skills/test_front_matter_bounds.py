"""SKILL.md's front matter is read by common.documents (skills.packages): size, nesting and the count of
values are bounds checked as the parser's events arrive, with libyaml's parser and the pure-Python one alike;
anchors, aliases, merge keys and repeated keys are refused. The parser's work is counted, not timed."""
import pytest

from common import documents
from skills.packages import (
    MAX_FRONT_MATTER_BYTES,
    MAX_FRONT_MATTER_NESTING,
    MAX_FRONT_MATTER_VALUES,
    PackageProblems,
    package_from_files,
)
from tests.document_events import counted_events

PARSERS = ["libyaml", "python"] if documents.CParser is not None else ["python"]
VALID = "name: demo-skill\ndescription: d\n"


@pytest.fixture(params=PARSERS)
def events(request, monkeypatch):
    """The parser (each in turn) and how many events it handed out."""
    if request.param == "python":
        monkeypatch.setattr(documents, "CParser", None)
    return counted_events(monkeypatch)


def problems(front_matter: str) -> list[str]:
    with pytest.raises(PackageProblems) as caught:
        package_from_files({"SKILL.md": f"---\n{front_matter}\n---\nBody.\n".encode()}, folder="demo-skill")
    return caught.value.problems


def test_many_values_are_refused_at_the_bound(events):
    room = MAX_FRONT_MATTER_BYTES - len(VALID) - 40
    assert problems(VALID + "metadata: [" + "1," * (room // 2) + "1]") == [
        f"front matter has more than {MAX_FRONT_MATTER_VALUES} values (scalars, keys, lists and mappings)"]
    assert events["events"] <= MAX_FRONT_MATTER_VALUES + 10


def test_nesting_is_refused_at_the_bound(events):
    room = MAX_FRONT_MATTER_BYTES - len(VALID) - 40
    assert problems(VALID + "metadata: " + "[" * (room // 2) + "]" * (room // 2)) == [
        f"front matter is nested more than {MAX_FRONT_MATTER_NESTING} levels deep"]
    assert events["events"] <= 2 * MAX_FRONT_MATTER_NESTING + 10


def test_anchors_are_refused_at_the_first(events):
    anchors = "".join(f"a{i}: &a{i} x\n" for i in range(500))
    assert problems(anchors + VALID) == [
        "front matter uses YAML anchors or aliases (&name, *name); write the values out"]
    assert events["events"] <= 10


def test_a_merge_key_is_refused(events):
    assert problems("<<: {name: demo-skill}\ndescription: d") == [
        "front matter cannot be read: YAML merge keys (<<) are not accepted; write the values out"]


def test_a_repeated_key_is_refused_at_any_depth(events):
    assert problems(VALID + "metadata: {a: '1', b: '2', a: '3'}") == ['front matter field "a" appears more than once']


def test_an_explicit_tag_beyond_yamls_own_is_refused_with_where(events):
    [problem] = problems("name: !!python/object/apply:os.system ['true']\ndescription: d")
    assert problem.startswith("front matter is not valid YAML (line 2, column 7 of SKILL.md)")
    assert "could not determine a constructor" in problem


def test_a_good_front_matter_reads_the_same_with_either_parser(events):
    package = package_from_files({"SKILL.md": (
        b"---\nname: demo-skill\ndescription: >\n  Does a demo\n  thing.\nmetadata: {version: '1.0', owner: team}\n"
        b"allowed-tools: [a_tool, b_tool]\nlicense: MIT\n---\nBody.\n")}, folder="demo-skill")
    assert (package.name, package.description) == ("demo-skill", "Does a demo thing.")
    assert package.front_matter["metadata"] == {"version": "1.0", "owner": "team"}
    assert package.allowed_tools == ["a_tool", "b_tool"]
