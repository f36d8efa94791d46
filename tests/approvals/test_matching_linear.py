"""The glob matcher against a slow reference, white space normalisation, the length cap, exact matches.

The reference is the backtracking regular expression the rules were once compiled to: right by
construction, slow on purpose. Pure functions, no database, except where a test goes through the API.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from approvals.engine import RuleIndex, compile_rule, decide
from approvals.matching import (
    MAX_MATCHED_CHARS,
    WHITE_SPACE,
    Arguments,
    ArgumentText,
    compile_arg_glob,
    compile_glob,
    normalize_space,
)
from tests.approvals.test_engine import rule as make_rule

ROOT = Path(__file__).resolve().parents[2]
_STAR = re.compile(r"(\s*)\*(\s*)")


def reference_regex(pattern: str) -> re.Pattern:
    """Whole-word globs as a regular expression: the documented semantics, with backtracking."""
    out, position = [], 0
    for match in _STAR.finditer(pattern):
        out.append(re.escape(pattern[position:match.start()]))
        left, right = bool(match.group(1)), bool(match.group(2))
        at_start, at_end = match.start() == 0, match.end() == len(pattern)
        if left and right:
            out.append(r"\s+(?:.*\s+)?")
        elif left:
            out.append(r"(?:\s+.*)?" if at_end else r"\s+.*")
        elif right:
            out.append(r"(?:.*\s+)?" if at_start else r".*\s+")
        else:
            out.append(".*")
        position = match.end()
    out.append(re.escape(pattern[position:]))
    return re.compile("".join(out), re.DOTALL)


def reference(pattern: str, text: str) -> bool:
    return text == pattern if "*" not in pattern else bool(reference_regex(pattern).fullmatch(text))


def arg_match(pattern: str, value: str) -> bool:
    return compile_arg_glob(pattern).match(ArgumentText(normalize_space(value)))


# Few distinct characters, so that patterns and texts overlap often enough to match.
PIECES = ["a", "b", "ab", "-", "/", ".", " ", "  ", "\t", "\n", "\u3000", "a b", " * "]
pattern_strategy = st.lists(st.sampled_from([*PIECES, "*", "*"]), max_size=9).map("".join)
text_strategy = st.lists(st.sampled_from(PIECES[:-1]), max_size=12).map("".join)


@settings(max_examples=1000, deadline=None)
@given(pattern=pattern_strategy, text=text_strategy)
@example(pattern="git * --force", text="git push --force")
@example(pattern="* x *", text="x")
@example(pattern="a* *", text="a b")
@example(pattern="a * * b", text="a x b")
@example(pattern="a\tb*", text="a b")
@example(pattern=" *", text="")
@example(pattern="* ", text=" ")
@example(pattern="a **", text="a")  # a run of stars: only the last may stand for nothing
@example(pattern="a **b", text="a b")
@example(pattern="** ", text="")  # a star that may stand for nothing ends or starts the pattern: these do neither
@example(pattern="* * ", text="")
@example(pattern=" **", text="")
@example(pattern="*a\tb*", text="xa bx")  # a literal's own white space is matched exactly, inside a pattern
@example(pattern="*a\tb*", text="a b a\tb")  # and a misfit is passed over for a later place that fits
@example(pattern="*a\tb", text="xa b")  # at its end
@example(pattern="*ab*ba", text="aba")  # literals never overlap
def test_matches_like_the_reference(pattern, text):
    assert compile_glob(pattern)(text) is reference(pattern, text)


@settings(max_examples=1000, deadline=None)
@given(pattern=pattern_strategy, text=text_strategy)
@example(pattern="rm *", text=" rm -rf /")
@example(pattern=" rm  * ", text="rm\t-rf\n/")
def test_argument_globs_match_like_the_reference_on_normalised_text(pattern, text):
    assert arg_match(pattern, text) is reference(normalize_space(pattern), normalize_space(text))


@settings(max_examples=300, deadline=None)
@given(words=st.lists(st.sampled_from(["git", "push", "--force", "x", "origin"]), max_size=8),
       pattern=st.lists(st.sampled_from(["git", "push", "--force", "*", "*x", "origin"]), min_size=1, max_size=5))
def test_word_globs_like_the_reference(words, pattern):
    """Word-shaped patterns and texts, where a word-set shortcut could go wrong."""
    pattern, text = " ".join(pattern), " ".join(words)
    assert arg_match(pattern, text) is reference(pattern, text)


def test_white_space_is_what_split_calls_white_space():
    everything = {chr(code) for code in range(sys.maxunicode + 1) if chr(code).isspace()}
    assert set(WHITE_SPACE) == everything
    assert everything == {char for char in everything if re.fullmatch(r"\s", char)}


# --- linear time -------------------------------------------------------------------------------

def test_white_space_runs_take_no_time():
    """`git * --force` against kilobytes of white space: a backtracking matcher takes minutes (cubic), this one
    a few milliseconds. Run in a child process with a generous limit, so a regression fails instead of hanging."""
    script = (
        "from approvals.matching import arg_matches, compile_glob\n"
        "spaces = 'git' + ' ' * 20_000\n"
        "assert not compile_glob('git * --force')(spaces)\n"
        "assert not compile_glob('* x *')(' ' * 20_000)\n"
        "assert not arg_matches({'command': spaces + 'x'}, 'command', ('git * --force', '* --force *', 'git * x y'))\n"
        "print('done')\n"
    )
    finished = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert finished.stdout.strip() == "done", finished.stderr


def test_a_match_looks_for_each_literal_once():
    """No backtracking: however long the text, a glob calls `str.find` once per literal between stars."""
    calls = []

    class Counting(str):
        def find(self, *args):
            calls.append(args)
            return str.find(self, *args)

    glob = compile_arg_glob("git * push * --force *")
    text = Counting(" git " + "push " * 5000 + "x ")
    assert not glob.match_padded(text)
    assert len(calls) == 2


# --- white space -------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [" rm -rf /", "rm  -rf /", "\trm\n-rf /", "rm -rf / ", "\u3000rm -rf /"])
def test_white_space_never_escapes_a_glob(value):
    assert arg_match("rm *", value)
    assert arg_match("rm -rf /", value)  # exact, on normalised text
    assert arg_match("rm  -rf  *", value)  # patterns are normalised alike
    assert not arg_match("rm -rf /x", value)


def test_deny_rule_holds_against_leading_white_space():
    deny = make_rule("deny", "shell", arg_match={"command": "rm *"})
    index = RuleIndex([deny])
    for command in (" rm -rf /data", "\n\nrm -rf /data", "rm\t-rf /data"):
        decision = decide(index, tool_name="shell", effective_input={"command": command}, agent="a", user="",
                          read_only_trusted=False, auto_allow_read_only=True, default_behavior="allow")
        assert (decision.behavior, decision.rule) == ("deny", deny.id), command


def test_tool_names_are_matched_as_they_are():
    assert not compile_glob("shell")(" shell")
    assert compile_glob("mcp__*")("mcp__a b")


# --- the length cap ----------------------------------------------------------------------------

def decide_one(rules, value, default="ask"):
    return decide(RuleIndex(rules), tool_name="shell", effective_input={"command": value}, agent="a", user="",
                  read_only_trusted=False, auto_allow_read_only=True, default_behavior=default)


def test_a_value_at_the_cap_is_matched():
    value = "git " + "x" * (MAX_MATCHED_CHARS - 4)
    assert len(value) == MAX_MATCHED_CHARS
    deny = make_rule("deny", "shell", arg_match={"command": "rm *"})
    allow = make_rule("allow", "shell", arg_match={"command": "git *"})
    assert (decide_one([deny, allow], value).behavior, decide_one([deny, allow], value).rule) == ("allow", allow.id)


@pytest.mark.parametrize("behavior", ["deny", "ask"])
def test_past_the_cap_deny_and_ask_globs_match(behavior):
    value = "git " + "x" * MAX_MATCHED_CHARS
    asking = make_rule(behavior, "shell", arg_match={"command": "rm *"})
    decision = decide_one([asking], value, default="allow")
    assert (decision.behavior, decision.rule) == (behavior, asking.id)
    assert "longer than 65,536 characters" in decision.reason


def test_past_the_cap_allow_globs_do_not_match():
    value = "git " + "x" * MAX_MATCHED_CHARS
    allow = make_rule("allow", "shell", arg_match={"command": "git *"})
    decision = decide_one([allow], value, default="ask")
    assert (decision.behavior, decision.rule) == ("ask", None)
    # White space does not count towards the cap: it is normalised first.
    assert decide_one([allow], "git " + " " * MAX_MATCHED_CHARS + "push").rule == allow.id


# --- exact matches -----------------------------------------------------------------------------

@pytest.mark.parametrize(("expected", "value", "matches"), [
    ("rm *", "rm *", True),
    ("rm *", "rm -rf /", False),
    ("a  b", "a b", False),  # no normalisation either
    (1, 1, True),
    (1, True, False),
    (1, 1.5, False),
    (True, True, True),
    ([1, "x"], [1, "x"], True),
    ([1, "x"], ["1", "x"], False),
    ({"b": 1, "a": [None]}, {"a": [None], "b": 1}, True),
    (None, None, True),
])
def test_equals_is_exact(expected, value, matches):
    exact = compile_rule(make_rule("allow", "shell", arg_match={"command": {"equals": expected}}))
    assert exact.matches(tool_name="shell", effective_input={"command": value}, agent="a", user="") is matches
    assert not exact.matches(tool_name="shell", effective_input={}, agent="a", user="")


def test_absent_matches_a_missing_argument_only():
    absent = compile_rule(make_rule("allow", "shell", arg_match={"cwd": {"absent": True}}))
    assert absent.matches(tool_name="shell", effective_input={"command": "ls"}, agent="a", user="")
    assert not absent.matches(tool_name="shell", effective_input={"cwd": None}, agent="a", user="")
    assert "cwd is absent" in absent.describe()


def test_equals_describes_itself():
    exact = compile_rule(make_rule("allow", "shell", arg_match={"command": {"equals": "rm *"}, "n": {"equals": 2}}))
    assert 'command equals "rm *"' in exact.describe() and "n equals 2" in exact.describe()


def test_arguments_work_out_each_text_once():
    arguments = Arguments({"command": "a  b"})
    assert arguments.text("command") is arguments.text("command")
    assert arguments.text("command").padded == " a b "
    assert arguments.text("missing") is None


def test_rules_api_takes_the_exact_form(world):
    admin = world.a.client("admin")
    created = admin.post("/api/v1/rules", {"behavior": "deny", "tool_pattern": "calculate",
                                           "arg_match": {"expression": {"equals": "2*3"}}}, format="json")
    assert created.status_code == 201, created.content
    evaluate = admin.post("/api/v1/rules/evaluate", {"tool": "calculate", "input": {"expression": "2*3"}},
                          format="json").json()
    assert (evaluate["behavior"], evaluate["rule"]) == ("deny", created.json()["id"])
    other = admin.post("/api/v1/rules/evaluate", {"tool": "calculate", "input": {"expression": "2*33"}},
                       format="json").json()
    assert other["rule"] != created.json()["id"]
    for bad in ({"equals": 1, "also": 2}, {"glob": "x"}, {}, {"absent": False}, {"absent": True, "equals": 1}):
        refused = admin.post("/api/v1/rules", {"behavior": "deny", "tool_pattern": "calculate",
                                               "arg_match": {"expression": bad}}, format="json")
        assert refused.status_code == 400, (bad, refused.content)
        assert "arg_match" in refused.json()["error"]["fields"]


def test_evaluate_normalises_white_space_end_to_end(world):
    admin = world.a.client("admin")
    rule = admin.post("/api/v1/rules", {"behavior": "deny", "tool_pattern": "calculate",
                                        "arg_match": {"expression": "1 *"}}, format="json").json()
    decision = admin.post("/api/v1/rules/evaluate", {"tool": "calculate", "input": {"expression": "\n 1 + 1"}},
                          format="json").json()
    assert (decision["behavior"], decision["rule"]) == ("deny", rule["id"])
