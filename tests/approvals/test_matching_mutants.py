"""Argument matching, compared exactly: defaults, oversized values, word pre-checks."""
import pytest

from approvals.matching import (
    MAX_MATCHED_CHARS,
    AbsentMatch,
    Arguments,
    ArgumentText,
    EqualsMatch,
    GlobMatch,
    arg_matches,
    compile_arg_glob,
    compile_arg_spec,
    is_arg_spec,
    pattern_prefix,
    value_text,
)


def test_an_oversized_argument_matches_unless_told_otherwise():
    oversized = {"command": "x" * (MAX_MATCHED_CHARS + 1)}
    assert arg_matches(oversized, "command", ("git *",)) is True
    assert arg_matches(oversized, "command", ("git *",), oversized=False) is False


def test_a_value_exactly_at_the_cap_is_still_matched():
    at_cap = {"command": "git " + "x" * (MAX_MATCHED_CHARS - 4)}
    assert arg_matches(at_cap, "command", ("git *",), oversized=False) is True
    assert arg_matches(at_cap, "command", ("ls *",)) is False


@pytest.mark.parametrize("value,text", [
    ({"b": 1, "a": "é"}, '{"a": "é", "b": 1}'),
    (["git", "push"], "git push"),
    (["git", 1], '["git", 1]'),
    (7, "7"),
])
def test_a_value_is_matched_as_the_text_a_glob_sees(value, text):
    assert value_text(value) == text
    assert arg_matches({"v": value}, "v", (text,)) is True


def test_words_between_stars_must_be_whole_words_of_the_text():
    glob = compile_arg_glob("* --force *")
    assert glob.words == ("--force",)
    assert glob.match(ArgumentText("git push --force now")) is True
    assert glob.match(ArgumentText("git push --forced now")) is False
    assert compile_arg_glob("*").match(ArgumentText("")) is True


def test_a_literal_between_stars_inside_words_needs_no_whole_word():
    glob = compile_arg_glob("*foo bar*")
    assert glob.words == ()
    assert glob.match(ArgumentText("xfoo barx")) is True
    assert glob.match(ArgumentText("xfoo bazx")) is False


def test_an_argument_is_looked_up_once_and_stays_the_same_for_every_rule():
    arguments = Arguments({"command": "git push", "nested": {"path": " a  b "}})
    text = arguments.text("command")
    assert arguments.text("command") is text
    assert text.padded == " git push "
    assert arguments.text("nested.path").padded == " a b "
    assert arguments.text("missing") is None
    assert arguments.text("missing") is None
    assert GlobMatch(path="command", globs=("rm *",)).matches(arguments, oversized=True) is False
    assert GlobMatch(path="command", globs=("rm *", "git *")).matches(arguments, oversized=False) is True
    assert GlobMatch(path="missing", globs=("*",)).matches(arguments, oversized=True) is False


@pytest.mark.parametrize("spec,valid", [
    ("git *", True),
    (["a", "b"], True),
    ([], False),
    (["a", 1], False),
    ({"equals": None}, True),
    ({"equals": 1, "absent": True}, False),
    ({"absent": True}, True),
    ({"absent": False}, False),
    ({"absent": 1}, True),
    ({}, False),
    (5, False),
])
def test_what_counts_as_an_argument_spec(spec, valid):
    assert is_arg_spec(spec) is valid


def test_an_argument_spec_compiles_to_its_kind_of_match():
    assert compile_arg_spec("p", "absent") == GlobMatch(path="p", globs=("absent",))
    assert compile_arg_spec("p", ["absent", "x*"]) == GlobMatch(path="p", globs=("absent", "x*"))
    assert compile_arg_spec("p", {"absent": True}) == AbsentMatch(path="p")
    assert compile_arg_spec("p", {"equals": [1, "a"]}) == EqualsMatch(path="p", value='[1,"a"]')
    assert compile_arg_spec("p", ["a", "b"]).describe() == "p matches 'a' or 'b'"


@pytest.mark.parametrize("pattern,prefix", [("mcp__*__read*", "mcp__"), ("*", ""), ("shell", "shell"), ("a*b", "a")])
def test_a_pattern_is_filed_under_the_text_before_its_first_star(pattern, prefix):
    assert pattern_prefix(pattern) == prefix


@pytest.mark.parametrize("pattern,text,matches", [
    # a star that starts the pattern with white space on its right may stand for nothing (`* a` matches `a`);
    # a star with white space on both sides stands for a word or more between word boundaries, never nothing
    ("* a", "a", True),
    ("* * a", "a", False),
    ("* * a", "x a", True),
    ("* * a", "xa", False),
])
def test_only_a_star_at_an_end_of_the_pattern_may_stand_for_nothing(pattern, text, matches):
    assert compile_arg_glob(pattern).match(ArgumentText(text)) is matches
