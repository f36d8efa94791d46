"""The decision engine on in-memory rules, each decision compared whole: behaviour, rule, reason, queue."""
from types import SimpleNamespace

from approvals.engine import Decision, RuleIndex, compile_rule, decide
from approvals.matching import MAX_MATCHED_CHARS


def rule(rule_id: int, behavior: str, tool_pattern: str, *, priority: int = 0, arg_match=None, agents=(), users=(),
         queue=None, note: str = "", user_verified: bool | None = None):
    return SimpleNamespace(id=rule_id, behavior=behavior, tool_pattern=tool_pattern, priority=priority,
                           arg_match=arg_match, agents=None if agents is None else list(agents),
                           users=None if users is None else list(users), queue_id=queue, note=note,
                           user_verified=user_verified)


def run(rules, tool: str = "shell", effective_input=None, *, agent: str = "bot", user: str = "",
        read_only_trusted: bool = False, auto_allow_read_only: bool = False, default: str = "ask") -> Decision:
    return decide(RuleIndex(rules), tool_name=tool, effective_input=effective_input or {}, agent=agent, user=user,
                  read_only_trusted=read_only_trusted, auto_allow_read_only=auto_allow_read_only,
                  default_behavior=default)


def test_a_deny_decision_names_the_rule_with_every_condition_and_its_note():
    deny = rule(7, "deny", "shell*", arg_match={"command": "rm *", "cwd": ["/", "/etc/*"]}, agents=["zed", "amy"],
                users=["bob@x", "al@x"], queue=3, note="never")
    decision = run([deny], "shell", {"command": "rm -rf", "cwd": "/"}, agent="amy", user="al@x")
    assert decision == Decision("deny", 7, "denied by rule #7 (tool matches 'shell*', command matches 'rm *', cwd "
                                "matches '/' or '/etc/*', agent is amy or zed, user is al@x or bob@x): never", 3)


def test_an_ask_decision_without_a_note_ends_with_its_conditions():
    ask = rule(8, "ask", "shell", arg_match={"command": {"equals": "ls"}, "force": {"absent": True}}, queue=5)
    assert run([ask], "shell", {"command": "ls"}) == Decision(
        "ask", 8, "needs approval by rule #8 (tool matches 'shell', command equals \"ls\", force is absent)", 5)


def test_an_allow_decision_names_its_rule():
    allow = rule(9, "allow", "shell", queue=4)
    assert run([allow], "shell") == Decision("allow", 9, "allowed by rule #9 (tool matches 'shell')")
    assert run([allow], "shell").as_dict() == {"behavior": "allow", "rule": 9,
                                                "reason": "allowed by rule #9 (tool matches 'shell')"}


def test_read_only_auto_allow_needs_both_a_trusted_read_only_tool_and_the_tenant_setting():
    allow = rule(10, "allow", "search")
    read_only = Decision("allow", None, "allowed: the tool is read-only and its source is trusted")
    assert run([allow], "search", read_only_trusted=True, auto_allow_read_only=True) == read_only
    assert run([allow], "search", read_only_trusted=True) == Decision(
        "allow", 10, "allowed by rule #10 (tool matches 'search')")
    assert run([allow], "search", auto_allow_read_only=True) == Decision(
        "allow", 10, "allowed by rule #10 (tool matches 'search')")
    assert run([], "search", read_only_trusted=True, default="deny") == Decision(
        "deny", None, "no rule matched: the tenant's default is deny")


def test_no_matching_rule_falls_back_to_the_tenant_default():
    other = rule(11, "deny", "shell", agents=["someone-else"])
    assert run([other], "shell", default="allow") == Decision("allow", None,
                                                              "no rule matched: the tenant's default is allow")


def test_an_oversized_argument_that_counts_as_matching_is_named_in_the_reason():
    deny = rule(12, "deny", "shell", arg_match={"command": "git *", "cwd": "/*", "mode": {"equals": "x"}})
    big = "y" * (MAX_MATCHED_CHARS + 1)
    decision = run([deny], "shell", {"command": big, "cwd": big, "mode": "x"})
    assert decision == Decision("deny", 12, (
        "denied by rule #12 (tool matches 'shell', command matches 'git *', cwd matches '/*', mode equals \"x\") "
        "(command, cwd is longer than 65,536 characters, which no glob checks: it counts as matching)"))


def test_an_oversized_argument_never_matches_an_allow_rule():
    allow = rule(13, "allow", "shell", arg_match={"command": "git *"})
    decision = run([allow], "shell", {"command": "git " + "y" * MAX_MATCHED_CHARS})
    assert decision == Decision("ask", None, "no rule matched: the tenant's default is ask")


def test_a_rule_matches_on_its_own_without_precomputed_arguments():
    compiled = compile_rule(rule(14, "ask", "shell", arg_match={"command": "git *"}, agents=["bot"], users=["u"]))
    assert compiled.matches(tool_name="shell", effective_input={"command": "git push"}, agent="bot", user="u") is True
    assert compiled.matches(tool_name="shell", effective_input={"command": "ls"}, agent="bot", user="u") is False
    assert compiled.matches(tool_name="shell", effective_input={"command": "git push"}, agent="eve", user="u") is False
    assert compiled.matches(tool_name="shell", effective_input={"command": "git push"}, agent="bot", user="v") is False
    assert compiled.matches(tool_name="shellx", effective_input={"command": "git push"}, agent="bot",
                            user="u") is False


def test_a_rule_without_scopes_or_argument_specs_matches_every_call_of_its_tool():
    compiled = compile_rule(rule(15, "allow", "mcp__*", arg_match=None, agents=None, users=None))
    assert (compiled.agents, compiled.users, compiled.arg_match) == (frozenset(), frozenset(), ())
    assert compiled.matches(tool_name="mcp__x", effective_input={}, agent="any", user="") is True
    assert compiled.matches(tool_name="mcp_x", effective_input={}, agent="any", user="") is False


def test_a_compiled_rule_keeps_every_field():
    compiled = compile_rule(rule(16, "ask", "shell", priority=3, arg_match={"b": "x", "a": "y"}, agents=["bot"],
                                 users=["u"], queue=2, note="why"))
    assert (compiled.id, compiled.behavior, compiled.priority, compiled.tool_pattern, compiled.agents, compiled.users,
            compiled.queue_id, compiled.note) == (16, "ask", 3, "shell", frozenset({"bot"}), frozenset({"u"}), 2, "why")
    assert [spec.describe() for spec in compiled.arg_match] == ["a matches 'y'", "b matches 'x'"]


def test_the_index_takes_compiled_rules_as_they_are():
    compiled = compile_rule(rule(17, "deny", "shell", arg_match={"command": "rm *"}))
    assert run([compiled], "shell", {"command": "rm x"}) == Decision(
        "deny", 17, "denied by rule #17 (tool matches 'shell', command matches 'rm *')")


def test_the_index_offers_exact_and_prefix_rules_in_decision_order():
    rules = [rule(20, "allow", "shell", priority=5), rule(21, "allow", "sh*", priority=9), rule(22, "ask", "s*"),
             rule(23, "deny", "shell*", priority=-1), rule(24, "allow", "*"), rule(25, "deny", "shellfish"),
             rule(26, "allow", "shell", priority=5), rule(27, "allow", "sh*", priority=1), rule(28, "ask", "x*")]
    index = RuleIndex(rules)
    assert [r.id for r in index.candidates("shell")] == [23, 22, 21, 20, 26, 27, 24]
    assert [r.id for r in index.candidates("sh")] == [22, 21, 27, 24]
    assert [r.id for r in index.candidates("s")] == [22, 24]
    assert [r.id for r in index.candidates("sx")] == [22, 24]  # no pattern starts "sx"
    assert [r.id for r in index.candidates("")] == [24]


def test_a_pattern_whose_prefix_is_the_whole_tool_name_is_a_candidate():
    index = RuleIndex([rule(30, "deny", "git*")])
    assert [r.id for r in index.candidates("git")] == [30]
    assert run([rule(30, "deny", "git*")], "git") == Decision("deny", 30, "denied by rule #30 (tool matches 'git*')")


def test_the_index_works_out_a_tool_names_candidates_once():
    index = RuleIndex([rule(31, "allow", "shell"), rule(32, "ask", "sh*")])
    first = index.candidates("shell")
    assert index.candidates("shell") is first
    assert [r.id for r in first] == [32, 31]


def test_the_index_remembers_the_candidates_of_ten_thousand_tool_names_at_most():
    index = RuleIndex([rule(33, "allow", "t*")])
    for n in range(10_000):
        index.candidates(f"t{n}")
    assert index.candidates("t9999") is index.candidates("t9999")
    beyond = index.candidates("t-beyond")
    assert [r.id for r in beyond] == [33]
    assert index.candidates("t-beyond") is not beyond
