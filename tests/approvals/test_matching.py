"""Glob semantics of rules (docs/governance.md): tool patterns and whole-word argument globs, never substrings.

Pure functions: no database. Property-based where a property says more than examples.
"""
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from approvals.matching import arg_matches, compile_glob, lookup, value_text

# Words: no white space and no `*` (a `*` in a pattern is the wildcard).
WORD_CHARS = st.characters(blacklist_categories=("Zs", "Zl", "Zp", "Cc", "Cs"), blacklist_characters="*")
words = st.text(WORD_CHARS, min_size=1, max_size=12)
# Any text, white space included.
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


def matches(pattern: str, text: str) -> bool:
    return bool(compile_glob(pattern)(text))


# --- tool patterns -----------------------------------------------------------------------------

@pytest.mark.parametrize(("pattern", "name", "expected"), [
    ("calculate", "calculate", True),
    ("calculate", "calculate2", False),
    ("calculate", "calc", False),
    ("calculate", "xcalculate", False),
    ("*", "anything_at_all", True),
    ("*", "mcp__github__create_issue", True),
    ("mcp__github__*", "mcp__github__create_issue", True),
    ("mcp__github__*", "mcp__github__", True),
    ("mcp__github__*", "mcp__githubx__create_issue", False),
    ("mcp__github__*", "mcp__git__create_issue", False),
    ("mcp__github__*", "xmcp__github__create_issue", False),
    ("mcp__github__*", "mcp__gitlab__create_issue", False),
    ("mcp__*__delete_*", "mcp__github__delete_repo", True),
    ("mcp__*__delete_*", "mcp__github__create_repo", False),
    ("*_search", "knowledge_search", True),
    ("*_search", "knowledge_search_v2", False),
])
def test_tool_patterns(pattern, name, expected):
    assert matches(pattern, name) is expected


@settings(deadline=None)
@given(name=st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True), server=st.from_regex(r"[a-z]{1,8}", fullmatch=True))
def test_server_glob_matches_exactly_that_servers_tools(name, server):
    assert matches(f"mcp__{server}__*", f"mcp__{server}__{name}")
    assert not matches(f"mcp__{server}__*", f"mcp__{server}x__{name}")
    assert not matches(f"mcp__{server}x__*", f"mcp__{server}__{name}")


# --- whole-word argument globs -----------------------------------------------------------------

@pytest.mark.parametrize(("pattern", "text", "expected"), [
    ("git *", "git", True),
    ("git *", "git push", True),
    ("git *", "git push --force origin main", True),
    ("git *", "gitx", False),
    ("git *", "gitx push", False),
    ("git *", "legit push", False),
    ("git *", "sudo git push", False),
    ("git push *", "git push", True),
    ("git push *", "git pushy", False),
    ("* --force", "--force", True),
    ("* --force", "git push --force", True),
    ("* --force", "git push --forced", False),
    ("* --force", "git push x--force", False),
    ("rm * /", "rm -rf /", True),
    ("rm * /", "rm /", True),
    ("rm * /", "rm -rf /home", False),
    ("*.py", "setup.py", True),
    ("*.py", "setup.pyc", False),
    ("/etc/*", "/etc/passwd", True),
    ("/etc/*", "/etcx/passwd", False),
    ("git", "git", True),
    ("git", "git push", False),
    ("git", "legit", False),
    ("push", "git push", False),
])
def test_argument_globs(pattern, text, expected):
    assert matches(pattern, text) is expected


@settings(deadline=None)
@given(word=words, suffix=st.text(min_size=1, max_size=20))
@example(word="git", suffix="x")
@example(word="git", suffix="x push")
def test_trailing_star_never_extends_a_word(word, suffix):
    """`w *` never matches w+s when s is non-empty and starts with a non-space."""
    if suffix[0].isspace():
        suffix = "x" + suffix
    assert not matches(f"{word} *", word + suffix)


@settings(deadline=None)
@given(word=words, rest=texts)
def test_trailing_star_matches_the_word_alone_and_followed_by_words(word, rest):
    assert matches(f"{word} *", word)
    assert matches(f"{word} *", f"{word} {rest}")


@settings(deadline=None)
@given(word=words, prefix=st.text(min_size=1, max_size=20))
@example(word="--force", prefix="x")
def test_leading_star_never_extends_a_word_backwards(word, prefix):
    """`* w` never matches s+w when s is non-empty and ends with a non-space."""
    if prefix[-1].isspace():
        prefix = prefix + "x"
    assert not matches(f"* {word}", prefix + word)
    assert matches(f"* {word}", word)
    assert matches(f"* {word}", f"{prefix} {word}")


@settings(deadline=None)
@given(pattern=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="*"), max_size=20),
       text=texts)
@example(pattern="push", text="git push")
@example(pattern="git", text="git push")
@example(pattern="a.b", text="axb")
@example(pattern="a+", text="aa")
def test_pattern_without_star_is_exact_never_a_substring(pattern, text):
    assert matches(pattern, text) is (pattern == text)
    assert matches(pattern, pattern)
    if text:
        assert not matches(pattern, pattern + text)
        assert not matches(pattern, text + pattern)


@settings(deadline=None)
@given(text=texts)
def test_star_alone_matches_everything(text):
    assert matches("*", text)


@settings(deadline=None)
@given(left=words, right=words, middle=st.lists(words, max_size=4))
def test_inner_star_spans_whole_words(left, right, middle):
    text = " ".join([left, *middle, right])
    assert matches(f"{left} * {right}", text)
    assert not matches(f"{left} * {right}", f"{left}x {right}")


@settings(deadline=None, max_examples=200)
@given(literal=st.text(WORD_CHARS, max_size=15), text=texts)
@example(literal="a.b(", text="x")
@example(literal="a+", text="")
def test_regex_metacharacters_are_literal(literal, text):
    """Patterns are globs, not regular expressions: `.`, `+`, `(` … match themselves only (a word then `*`)."""
    assert matches(literal + "*", literal + text) is True
    if not text.startswith(literal):
        assert matches(literal + "*", text) is (text.startswith(literal))


# --- values and paths --------------------------------------------------------------------------

def test_value_text_of_non_strings():
    assert value_text("git push") == "git push"
    assert value_text(["git", "push", "--force"]) == "git push --force"
    assert value_text(42) == "42"
    assert value_text(True) == "true"
    assert value_text({"b": 1, "a": 2}) == '{"a": 2, "b": 1}'


def test_lookup_nested_and_missing():
    data = {"repo": {"owner": "acme", "name": "api"}, "n": 0}
    assert lookup(data, "repo.owner") == "acme"
    assert lookup(data, "n") == 0
    assert lookup(data, "repo.missing") is not None and lookup(data, "repo.missing") == lookup(data, "nope")
    assert lookup(data, "n.deeper") == lookup(data, "nope")


def test_missing_argument_never_matches_even_star():
    assert not arg_matches({}, "command", ("*",))
    assert arg_matches({"command": ""}, "command", ("*",))


def test_list_of_globs_is_any_of():
    assert arg_matches({"command": "rm -rf /"}, "command", ("git *", "rm *"))
    assert not arg_matches({"command": "ls"}, "command", ("git *", "rm *"))


def test_list_argument_matches_as_words():
    assert arg_matches({"argv": ["git", "push", "--force"]}, "argv", ("* --force",))
    assert not arg_matches({"argv": ["gitx", "push"]}, "argv", ("git *",))


def test_numbers_match_their_json_text_exactly():
    assert arg_matches({"amount": 100}, "amount", ("100",))
    assert not arg_matches({"amount": 1000}, "amount", ("100",))
    assert arg_matches({"amount": 1000}, "amount", ("1*",))


def test_glob_is_anchored_at_both_ends():
    assert re.fullmatch(".*", "x")  # sanity of the reference
    assert not matches("git *", "x git push")
    assert not matches("* push", "git push x")
