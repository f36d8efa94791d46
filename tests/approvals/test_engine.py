"""The decision engine (docs/governance.md): precedence, priorities, scoping, explanations, the effective input,
and the rule index against a brute-force evaluation."""
import random
import re
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from approvals import selectors
from approvals.engine import RuleIndex, compile_rule, decide
from approvals.models import PermissionRule
from approvals.services import policy_bump, rule_delete, rule_update
from tools.calls.submit import calls_submit
from tools.catalog.services import binding_set
from tools.models import CallStatus, Tool, ToolGroup, ToolSource

# --- in-memory rules ---------------------------------------------------------------------------

_ids = iter(range(1, 10**9))


def rule(behavior: str, tool_pattern: str, *, priority: int = 0, arg_match=None, agents=(), users=(), queue=None,
         note: str = "", rule_id: int | None = None, user_verified: bool | None = None):
    return SimpleNamespace(id=rule_id or next(_ids), behavior=behavior, tool_pattern=tool_pattern, priority=priority,
                           arg_match=arg_match or {}, agents=list(agents), users=list(users), queue_id=queue,
                           note=note, enabled=True, user_verified=user_verified)


def run(rules, tool: str = "shell", effective_input=None, *, agent: str = "bot", user: str = "",
        read_only_trusted: bool = False, auto_allow_read_only: bool = True, default: str = "ask"):
    return decide(RuleIndex(rules), tool_name=tool, effective_input=effective_input or {}, agent=agent, user=user,
                  read_only_trusted=read_only_trusted, auto_allow_read_only=auto_allow_read_only,
                  default_behavior=default)


# --- precedence --------------------------------------------------------------------------------

def test_deny_beats_ask_beats_allow_whatever_the_priorities():
    allow = rule("allow", "shell", priority=100)
    ask = rule("ask", "shell", priority=50)
    deny = rule("deny", "shell", priority=-100)
    assert run([allow, ask, deny]).behavior == "deny"
    assert run([allow, ask, deny]).rule == deny.id
    assert run([allow, ask]).behavior == "ask"
    assert run([allow, ask]).rule == ask.id
    assert run([allow]).behavior == "allow"


def test_ask_beats_read_only_auto_allow():
    ask = rule("ask", "search")
    decision = run([ask], tool="search", read_only_trusted=True)
    assert (decision.behavior, decision.rule) == ("ask", ask.id)


def test_deny_beats_read_only_auto_allow():
    deny = rule("deny", "search")
    assert run([deny], tool="search", read_only_trusted=True).behavior == "deny"


def test_read_only_auto_allow_beats_allow_rules_and_the_default():
    decision = run([rule("allow", "search")], tool="search", read_only_trusted=True, default="deny")
    assert (decision.behavior, decision.rule) == ("allow", None)
    assert "read-only" in decision.reason
    decision = run([], tool="search", read_only_trusted=True, default="deny")
    assert decision.behavior == "allow"


def test_read_only_auto_allow_needs_the_tenant_setting():
    assert run([], tool="search", read_only_trusted=True, auto_allow_read_only=False, default="ask").behavior == "ask"


def test_allow_rule_beats_the_tenant_default():
    allow = rule("allow", "shell")
    for default in ("ask", "deny"):
        decision = run([allow], default=default)
        assert (decision.behavior, decision.rule) == ("allow", allow.id)


# Every pair of the decision's sources, strongest first: a deny rule, an ask rule, read-only auto-allow, an
# allow rule, the tenant's default. In each pair both apply; the weaker one has the higher priority and the
# lower (older) id, and the rules are listed both ways round: the stronger decides all the same.
SOURCES = ("deny", "ask", "auto", "allow", "default")
PAIRS = [(strong, weak) for n, strong in enumerate(SOURCES) for weak in SOURCES[n + 1:]]


def pair_scenario(strong: str, weak: str) -> tuple[list, dict, tuple]:
    """(rules, run options, the expected (behavior, rule id)) for the pair."""
    weak_rule = rule(weak, "search", priority=1000, rule_id=1) if weak in ("deny", "ask", "allow") else None
    strong_rule = rule(strong, "search", priority=-1000, rule_id=2) if strong in ("deny", "ask", "allow") else None
    rules = [r for r in (weak_rule, strong_rule) if r is not None]
    # The default differs from the stronger source, so that the default winning would show.
    options = {"read_only_trusted": "auto" in (strong, weak),
               "default": "allow" if strong in ("deny", "ask") else "deny"}
    expected = {"deny": ("deny", 2), "ask": ("ask", 2), "auto": ("allow", None), "allow": ("allow", 2)}[strong]
    return rules, options, expected


@pytest.mark.parametrize("strong,weak", PAIRS, ids=[f"{s}-over-{w}" for s, w in PAIRS])
def test_each_pair_of_sources_is_decided_by_the_stronger(strong, weak):
    rules, options, expected = pair_scenario(strong, weak)
    for listed in (rules, rules[::-1]):
        decision = run(listed, tool="search", **options)
        assert (decision.behavior, decision.rule) == expected, (listed, options)


@pytest.mark.parametrize("behavior", ["deny", "ask", "allow"])
def test_within_a_behaviour_priority_then_age_decides(behavior):
    older, newer = rule(behavior, "search", rule_id=10), rule(behavior, "search", rule_id=11)
    higher = rule(behavior, "search", priority=5, rule_id=12)
    for listed in ([older, newer, higher], [higher, newer, older]):
        assert run(listed, tool="search", default="deny" if behavior == "allow" else "allow").rule == higher.id
    for listed in ([older, newer], [newer, older]):
        assert run(listed, tool="search", default="deny" if behavior == "allow" else "allow").rule == older.id


@pytest.mark.parametrize("strong,weak", [p for p in PAIRS if "default" not in p and "auto" not in p])
def test_each_pair_of_stored_rules_is_decided_by_the_stronger(world, strong, weak):
    """The same pairs through the selector: stored, compiled and cached per tenant."""
    tenant = world.a.tenant
    weak_rule = PermissionRule.objects.create(tenant=tenant, behavior=weak, tool_pattern="search", priority=1000)
    strong_rule = PermissionRule.objects.create(tenant=tenant, behavior=strong, tool_pattern="search",
                                                priority=-1000)
    assert weak_rule.pk < strong_rule.pk
    policy_bump(tenant=tenant)
    tenant.default_behavior = "allow" if strong != "allow" else "deny"
    decision = selectors.evaluate(tenant=tenant, tool_name="search", effective_input={})
    assert (decision.behavior, decision.rule) == (strong, strong_rule.pk)


@pytest.mark.parametrize("default", ["ask", "deny", "allow"])
def test_tenant_default_when_no_rule_matches(default):
    decision = run([rule("deny", "other_tool")], default=default)
    assert (decision.behavior, decision.rule) == (default, None)
    assert default in decision.reason and "no rule matched" in decision.reason


def test_priority_orders_rules_of_one_behaviour_then_age():
    low = rule("ask", "shell", priority=1, queue=1)
    high = rule("ask", "shell", priority=9, queue=2)
    assert (run([low, high]).rule, run([low, high]).queue) == (high.id, 2)
    first = rule("ask", "shell", priority=5, queue=3)
    second = rule("ask", "shell", priority=5, queue=4)
    assert run([second, first]).rule == first.id  # same priority: the older (lower id) rule
    allow_low = rule("allow", "shell", priority=0)
    allow_high = rule("allow", "*", priority=3)
    assert run([allow_low, allow_high]).rule == allow_high.id


def test_ask_rule_routes_to_its_queue():
    assert run([rule("ask", "shell", queue=77)]).queue == 77
    assert run([rule("allow", "shell", queue=77)]).queue is None


# --- patterns, arguments, scope ----------------------------------------------------------------

def test_tool_patterns_exact_star_and_server_glob():
    exact = rule("deny", "mcp__github__delete_repo")
    server = rule("ask", "mcp__github__*")
    everything = rule("allow", "*")
    rules = [exact, server, everything]
    assert run(rules, tool="mcp__github__delete_repo").rule == exact.id
    assert run(rules, tool="mcp__github__create_issue").rule == server.id
    assert run(rules, tool="mcp__githubx__create_issue").rule == everything.id
    assert run(rules, tool="mcp__git__create_issue").rule == everything.id
    assert run(rules, tool="calculate").rule == everything.id


def test_argument_globs_whole_words_never_substrings():
    git = rule("allow", "shell", arg_match={"command": "git *"})
    exact = rule("deny", "shell", arg_match={"command": "rm"})
    rules = [git, exact]
    assert run(rules, effective_input={"command": "git"}, default="ask").rule == git.id
    assert run(rules, effective_input={"command": "git push"}, default="ask").rule == git.id
    assert run(rules, effective_input={"command": "gitx"}, default="ask").rule is None
    assert run(rules, effective_input={"command": "rm"}, default="ask").rule == exact.id
    assert run(rules, effective_input={"command": "rm -rf /"}, default="ask").rule is None
    assert run(rules, effective_input={"command": "sudo rm"}, default="ask").rule is None


def test_every_argument_entry_must_match_and_missing_arguments_do_not():
    both = rule("deny", "shell", arg_match={"command": "git *", "cwd": "/prod/*"})
    assert run([both], effective_input={"command": "git push", "cwd": "/prod/api"}).behavior == "deny"
    assert run([both], effective_input={"command": "git push", "cwd": "/dev/api"}).behavior == "ask"
    assert run([both], effective_input={"command": "git push"}).behavior == "ask"


def test_nested_argument_paths():
    owner = rule("deny", "mcp__github__*", arg_match={"repo.owner": "acme"})
    assert run([owner], tool="mcp__github__x", effective_input={"repo": {"owner": "acme"}}).behavior == "deny"
    assert run([owner], tool="mcp__github__x", effective_input={"repo": {"owner": "acmex"}}).behavior == "ask"


def test_agent_and_user_scoping():
    for_bot = rule("deny", "shell", agents=["deploy-bot"])
    for_alice = rule("ask", "shell", users=["alice@example.com"])
    both = rule("allow", "shell", agents=["deploy-bot"], users=["bob@example.com"])
    rules = [for_bot, for_alice, both]
    assert run(rules, agent="deploy-bot").rule == for_bot.id
    assert run(rules, agent="support-bot", user="alice@example.com").rule == for_alice.id
    assert run(rules, agent="support-bot", user="bob@example.com", default="deny").rule is None
    assert run([both], agent="deploy-bot", user="bob@example.com", default="deny").rule == both.id
    assert run([both], agent="deploy-bot", user="alice@example.com", default="deny").rule is None
    assert run([for_bot], agent="deploy-bot-2").rule is None


# --- explanations ------------------------------------------------------------------------------

def test_every_decision_names_its_rule_and_what_matched():
    deny = rule("deny", "shell", arg_match={"command": "rm *"}, agents=["ops-bot"], note="no deletions")
    decision = run([deny], effective_input={"command": "rm -rf /"}, agent="ops-bot")
    assert decision.as_dict() == {"behavior": "deny", "rule": deny.id, "reason": decision.reason}
    assert f"#{deny.id}" in decision.reason
    assert "'shell'" in decision.reason
    assert "command matches 'rm *'" in decision.reason
    assert "ops-bot" in decision.reason
    assert "no deletions" in decision.reason
    ask = rule("ask", "mcp__github__*", users=["alice@example.com"])
    decision = run([ask], tool="mcp__github__x", user="alice@example.com")
    assert "needs approval" in decision.reason and "mcp__github__*" in decision.reason
    assert "alice@example.com" in decision.reason
    allow = rule("allow", "shell")
    assert f"allowed by rule #{allow.id}" in run([allow]).reason


# --- the index against brute force -------------------------------------------------------------

TOOLS = ["shell", "calculate", "search", "s", "sh", "mcp__github__create_issue", "mcp__github__delete_repo",
         "mcp__gitlab__merge", "mcp__git__x", "mcp__", "knowledge_search", "knowledge_search_v2", "a*b"]
PATTERNS = TOOLS + ["*", "mcp__*", "mcp__github__*", "mcp__git*", "mcp__gitlab__*", "*_search", "s*", "sh*",
                    "mcp__*__delete_*", "knowledge_*", "*search*", "k*h", "zzz", "mcp__github__*e"]
ARG_GLOBS = ["git *", "git", "rm *", "* --force", "*", "/prod/*", "ls", "100", "1*"]
VALUES = ["git", "git push", "gitx", "rm -rf /", "ls", "git push --force", "/prod/api", "", "100", 1000, None]
AGENTS = ["a1", "a2", "a3"]
USERS = ["u1", "u2"]


def glob_reference(pattern: str, text: str) -> bool:
    """An independent reference for tool names (no white space): `*` is any run of characters."""
    return re.fullmatch(".*".join(re.escape(part) for part in pattern.split("*")), text, re.DOTALL) is not None


def brute_force(rules, *, tool, effective_input, agent, user, read_only_trusted, auto_allow_read_only, default,
                user_verified=False):
    """The semantics of docs/governance.md as a naive loop over every rule."""
    def applies(r):
        if not r.enabled:
            return False
        if r.agents and agent not in r.agents:
            return False
        if r.users and user not in r.users:
            return False
        if r.user_verified is not None and r.user_verified != user_verified:
            return False
        if not glob_reference(r.tool_pattern, tool):
            return False
        compiled = getattr(r, "compiled", None)
        if compiled is None:
            compiled = r.compiled = compile_rule(r)
        # argument globs: the same matcher (tested on its own in test_matching)
        return compiled.matches(tool_name=tool, effective_input=effective_input, agent=agent, user=user,
                                user_verified=user_verified)

    matching = [r for r in rules if applies(r)]

    def best(behavior):
        ranked = sorted((r for r in matching if r.behavior == behavior), key=lambda r: (-r.priority, r.id))
        return ranked[0] if ranked else None

    for behavior in ("deny", "ask"):
        hit = best(behavior)
        if hit is not None:
            return behavior, hit.id
    if read_only_trusted and auto_allow_read_only:
        return "allow", None
    hit = best("allow")
    if hit is not None:
        return "allow", hit.id
    return default, None


def random_rule(rng: random.Random, rule_id: int):
    arg_match = {}
    if rng.random() < 0.4:
        for path in rng.sample(["command", "cwd", "amount"], rng.randint(1, 2)):
            globs = rng.sample(ARG_GLOBS, rng.randint(1, 2))
            arg_match[path] = globs if len(globs) > 1 or rng.random() < 0.5 else globs[0]
    return SimpleNamespace(
        id=rule_id, behavior=rng.choice(["allow", "allow", "ask", "deny"]), tool_pattern=rng.choice(PATTERNS),
        priority=rng.choice([0, 0, 0, 1, 5, -3]), arg_match=arg_match,
        agents=rng.sample(AGENTS, rng.randint(1, 2)) if rng.random() < 0.3 else [],
        users=rng.sample(USERS, 1) if rng.random() < 0.2 else [],
        queue_id=None, note="", enabled=rng.random() > 0.1, user_verified=rng.choice([None, None, None, True, False]),
    )


def random_query(rng: random.Random) -> dict:
    effective_input = {name: rng.choice(VALUES) for name in ("command", "cwd", "amount") if rng.random() < 0.7}
    return {"tool": rng.choice(TOOLS + ["unknown", "mcp__github__", "knowledge_searchx"]),
            "effective_input": effective_input, "agent": rng.choice(AGENTS + ["other"]),
            "user": rng.choice(USERS + [""]), "read_only_trusted": rng.random() < 0.2,
            "auto_allow_read_only": rng.random() < 0.8, "default": rng.choice(["ask", "deny", "allow"]),
            "user_verified": rng.random() < 0.5}


@pytest.mark.parametrize("seed", [1, 2])
def test_index_decides_like_brute_force_over_thousands_of_rules(seed):
    rng = random.Random(seed)
    rules = [random_rule(rng, rule_id) for rule_id in rng.sample(range(1, 100_000), 3000)]
    index = RuleIndex([r for r in rules if r.enabled])  # the selector loads enabled rules only
    for _ in range(300):
        query = random_query(rng)
        decision = decide(index, tool_name=query["tool"], effective_input=query["effective_input"],
                          agent=query["agent"], user=query["user"], read_only_trusted=query["read_only_trusted"],
                          auto_allow_read_only=query["auto_allow_read_only"], default_behavior=query["default"],
                          user_verified=query["user_verified"])
        assert (decision.behavior, decision.rule) == brute_force(rules, **query), query


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_index_decides_like_brute_force_property(data):
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    rules = [random_rule(rng, rule_id) for rule_id in range(1, data.draw(st.integers(1, 60)) + 1)]
    index = RuleIndex([r for r in rules if r.enabled])
    query = random_query(rng)
    query["tool"] = data.draw(st.sampled_from(TOOLS + ["unknown", "mcp__github__", "x"]))
    decision = decide(index, tool_name=query["tool"], effective_input=query["effective_input"],
                      agent=query["agent"], user=query["user"], read_only_trusted=query["read_only_trusted"],
                      auto_allow_read_only=query["auto_allow_read_only"], default_behavior=query["default"],
                      user_verified=query["user_verified"])
    assert (decision.behavior, decision.rule) == brute_force(rules, **query)


def test_database_rules_decide_like_brute_force(world):
    """The same comparison through the selector: rules stored, compiled, cached per tenant."""
    tenant = world.a.tenant
    rng = random.Random(7)
    specs = [random_rule(rng, 0) for _ in range(2500)]
    PermissionRule.objects.bulk_create([
        PermissionRule(tenant=tenant, behavior=s.behavior, tool_pattern=s.tool_pattern, arg_match=s.arg_match,
                       agents=s.agents, users=s.users, priority=s.priority, enabled=s.enabled,
                       user_verified=s.user_verified)
        for s in specs
    ])
    policy_bump(tenant=tenant)
    stored = list(PermissionRule.objects.for_tenant(tenant))
    tenant.default_behavior = "deny"
    for _ in range(300):
        query = random_query(rng)
        query.update(read_only_trusted=False, auto_allow_read_only=tenant.auto_allow_read_only, default="deny")
        decision = selectors.evaluate(tenant=tenant, tool_name=query["tool"], effective_input=query["effective_input"],
                                      agent=query["agent"], user=query["user"], user_verified=query["user_verified"])
        assert (decision.behavior, decision.rule) == brute_force(stored, **query), query


def test_rule_changes_reach_the_cached_index(world, gov_rule):
    tenant = world.a.tenant
    assert selectors.evaluate(tenant=tenant, tool_name="calculate", effective_input={}).behavior == "allow"
    ask = gov_rule("ask", "calculate")
    assert selectors.evaluate(tenant=tenant, tool_name="calculate", effective_input={}).rule == ask.id
    rule_update(rule=ask, behavior="deny")
    assert selectors.evaluate(tenant=tenant, tool_name="calculate", effective_input={}).behavior == "deny"
    rule_update(rule=ask, enabled=False)
    assert selectors.evaluate(tenant=tenant, tool_name="calculate", effective_input={}).rule is None
    rule_update(rule=ask, enabled=True)
    rule_delete(rule=ask)
    assert selectors.evaluate(tenant=tenant, tool_name="calculate", effective_input={}).rule is None


def test_rules_of_one_tenant_never_decide_for_another(world, gov_rule):
    gov_rule("deny", "*")
    assert selectors.evaluate(tenant=world.a.tenant, tool_name="calculate", effective_input={}).behavior == "deny"
    assert selectors.evaluate(tenant=world.b.tenant, tool_name="calculate", effective_input={}).behavior == "allow"


# --- read-only and trust, through the catalog ---------------------------------------------------

@pytest.fixture
def mcp_read_only(world):
    """An untrusted MCP server's tool that claims to be read-only, visible in tenant A."""
    tool = Tool.objects.create(tenant=world.a.tenant, name="mcp__shady__list_files", source=ToolSource.MCP,
                               description="Lists files (says the server).", read_only=True, trusted=False,
                               input_schema={"type": "object", "properties": {"path": {"type": "string"}}})
    ToolGroup.objects.for_tenant(world.a.tenant).get(name="basic").tools.add(tool)
    return tool


def test_read_only_of_an_untrusted_source_is_not_auto_allowed(world, mcp_read_only):
    tenant = world.a.tenant
    tenant.default_behavior = "ask"
    tenant.save()
    assert tenant.auto_allow_read_only
    decision = selectors.evaluate(tenant=tenant, tool_name=mcp_read_only.name, effective_input={"path": "/"})
    assert (decision.behavior, decision.rule) == ("ask", None)
    # a trusted read-only tool (calculate) of the same tenant is auto-allowed
    decision = selectors.evaluate(tenant=tenant, tool_name="calculate", effective_input={"expression": "1"})
    assert decision.behavior == "allow" and "read-only" in decision.reason
    # and a real call of the untrusted tool waits for a reviewer
    [call] = calls_submit(session=world.a.session, calls=[{"name": mcp_read_only.name, "input": {"path": "/"}}])
    assert call.status == CallStatus.AWAITING_APPROVAL


def test_read_only_auto_allow_off_for_the_tenant(world):
    tenant = world.a.tenant
    tenant.default_behavior = "deny"
    tenant.auto_allow_read_only = False
    tenant.save()
    assert selectors.evaluate(tenant=tenant, tool_name="calculate", effective_input={}).behavior == "deny"


# --- the effective input: a bound argument cannot be dodged --------------------------------------

@pytest.fixture
def bound_cwd(world, gov_shell, gov_rule):
    """shell.cwd is bound to /prod/payments by the server; a rule denies shell in /prod/*."""
    binding_set(tenant=world.a.tenant, tool=gov_shell.tool, name="cwd", value="/prod/payments")
    deny = gov_rule("deny", gov_shell.name, arg_match={"cwd": "/prod/*"}, note="no commands in production")
    return deny


def test_deny_on_a_bound_argument_applies_to_real_calls(world, gov_shell, bound_cwd, gov_session):
    session = gov_session()
    [call] = calls_submit(session=session, calls=[{"name": gov_shell.name, "input": {"command": "ls"}}])
    assert call.status == CallStatus.DENIED
    assert call.decision["rule"] == bound_cwd.id
    assert "cwd matches '/prod/*'" in call.decision["reason"]
    assert call.error["errorType"] == "PermissionDenied"
    assert call.input == {"command": "ls"}  # the model never sent cwd
    assert gov_shell.counter.count == 0


def test_sending_the_bound_argument_is_refused_not_matched_around(world, gov_shell, bound_cwd, gov_session):
    [call] = calls_submit(session=gov_session(), calls=[{"name": gov_shell.name,
                                                         "input": {"command": "ls", "cwd": "/tmp"}}])
    assert call.status == CallStatus.FAILED
    assert call.error["errorType"] == "BoundArgumentOverride"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_deny_on_a_bound_argument_through_the_api(world, gov_shell, bound_cwd, gov_session):
    session = gov_session()
    response = world.a.client().post(f"/api/v1/sessions/{session.pk}/calls",
                                      {"name": gov_shell.name, "input": {"command": "ls"}}, format="json")
    assert response.status_code == 200, response.content
    call = response.json()["calls"][0]
    assert call["status"] == "denied"
    assert call["decision"]["rule"] == bound_cwd.id
    assert "/prod/payments" not in str(call["input"])


def test_rules_evaluate_applies_bound_arguments(world, gov_shell, bound_cwd):
    admin = world.a.client("admin")
    response = admin.post("/api/v1/rules/evaluate", {"tool": gov_shell.name, "input": {"command": "ls"},
                                                     "agent": "ops-bot"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json() == {"behavior": "deny", "rule": bound_cwd.id, "reason": response.json()["reason"]}
    assert "cwd" in response.json()["reason"]


def test_agent_specific_binding_decides_only_for_that_agent(world, gov_shell, gov_rule):
    binding_set(tenant=world.a.tenant, tool=gov_shell.tool, name="cwd", value="/prod/x", agent="deploy-bot")
    deny = gov_rule("deny", gov_shell.name, arg_match={"cwd": "/prod/*"})
    admin = world.a.client("admin")
    url = "/api/v1/rules/evaluate"
    deploy = admin.post(url, {"tool": gov_shell.name, "input": {"command": "ls"}, "agent": "deploy-bot"},
                        format="json").json()
    other = admin.post(url, {"tool": gov_shell.name, "input": {"command": "ls"}, "agent": "other-bot"},
                       format="json").json()
    assert deploy["rule"] == deny.id
    assert other["behavior"] == "allow" and other["rule"] is None


# --- rules/evaluate is the engine of real calls --------------------------------------------------

def test_rules_evaluate_matches_real_calls(world, gov_shell, gov_rule, gov_session):
    tenant = world.a.tenant
    tenant.default_behavior = "deny"
    tenant.save()
    gov_rule("allow", gov_shell.name, arg_match={"command": "git *"})
    gov_rule("ask", gov_shell.name, arg_match={"command": "git push *"}, agents=["ops-bot"])
    gov_rule("deny", gov_shell.name, arg_match={"command": "* --force"})
    session = gov_session(agent="ops-bot", user="carol@example.com")
    admin = world.a.client("admin")
    for command in ("git status", "git push origin", "git push --force", "gitx", "ls"):
        evaluated = admin.post("/api/v1/rules/evaluate", {"tool": gov_shell.name, "input": {"command": command},
                                                          "agent": "ops-bot", "user": "carol@example.com"},
                               format="json").json()
        [call] = calls_submit(session=session, calls=[{"name": gov_shell.name, "input": {"command": command}}])
        assert call.decision == evaluated, command
    expected = {"git status": "allow", "git push origin": "ask", "git push --force": "deny", "gitx": "deny",
                "ls": "deny"}
    for command, behavior in expected.items():
        evaluated = admin.post("/api/v1/rules/evaluate", {"tool": gov_shell.name, "input": {"command": command},
                                                          "agent": "ops-bot"}, format="json").json()
        assert evaluated["behavior"] == behavior, command


def test_rules_evaluate_needs_admin_scope_and_a_tool(world):
    assert world.a.client("agent").post("/api/v1/rules/evaluate", {"tool": "calculate"},
                                        format="json").status_code == 403
    response = world.a.client("admin").post("/api/v1/rules/evaluate", {"input": {}}, format="json")
    assert response.status_code == 400
    assert "tool" in response.json()["error"]["fields"]
