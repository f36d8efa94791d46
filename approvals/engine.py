"""The decision engine: the permission step of the call chain, `rules/evaluate`, the simulator.

Order (docs/governance.md): deny rules → ask rules → confirm rules → read-only auto-allow → allow rules → review
of an untrusted server's tool → tenant default.
Within a behaviour the highest priority, then the oldest rule, decides. Rules are compiled into an
index per tenant: exact tool names in a dict, patterns filed by their literal prefix, so deciding
looks at the few rules that can match rather than at all of them. Each process keeps a tenant's index
as long as the tenant's policy version stays (`index_cache`, a `tenancy.versions.VersionedCache`).
"""
from bisect import insort
from dataclasses import dataclass

from approvals.matching import (
    MAX_MATCHED_CHARS,
    OVERSIZED,
    AbsentMatch,
    Arguments,
    EqualsMatch,
    GlobMatch,
    compile_arg_spec,
    compile_glob,
    pattern_prefix,
)
from approvals.models import PolicyVersion
from tenancy.versions import VersionedCache

BEHAVIOR_RANK = {"deny": 0, "ask": 1, "confirm": 2, "allow": 3}
HOLDING = ("deny", "ask", "confirm")  # the behaviours whose first matching rule decides, before read-only auto-allow
VERBS = {"deny": "denied", "ask": "needs approval", "confirm": "needs the user's confirmation"}


@dataclass(frozen=True)
class CompiledRule:
    id: int
    behavior: str
    priority: int
    tool_pattern: str
    arg_match: tuple[GlobMatch | EqualsMatch | AbsentMatch, ...]
    agents: frozenset
    users: frozenset
    queue_id: int | None
    note: str
    user_verified: bool | None = None  # the rule holds only for calls whose user is (True) or is not verified

    @property
    def sort_key(self):
        return (BEHAVIOR_RANK[self.behavior], -self.priority, self.id)

    def matches(self, *, tool_name: str, effective_input: dict, agent: str, user: str,
                arguments: Arguments | None = None, user_verified: bool = False) -> bool:
        if self.agents and agent not in self.agents:
            return False
        if self.users and user not in self.users:
            return False
        if self.user_verified is not None and self.user_verified != user_verified:
            return False
        if not compile_glob(self.tool_pattern)(tool_name):
            return False
        if not self.arg_match:
            return True
        arguments = arguments or Arguments(effective_input)
        # Past the length cap no glob looks: deny and ask rules match, allow rules do not.
        oversized = self.behavior != "allow"
        return all(spec.matches(arguments, oversized=oversized) for spec in self.arg_match)

    def oversized_paths(self, arguments: Arguments) -> list[str]:
        return [spec.path for spec in self.arg_match
                if isinstance(spec, GlobMatch) and arguments.text(spec.path) is OVERSIZED]

    def describe(self) -> str:
        parts = [f"tool matches {self.tool_pattern!r}"]
        parts += [spec.describe() for spec in self.arg_match]
        if self.agents:
            parts.append(f"agent is {' or '.join(sorted(self.agents))}")
        if self.users:
            parts.append(f"user is {' or '.join(sorted(self.users))}")
        if self.user_verified is not None:
            parts.append("the user is verified" if self.user_verified else "the user is not verified")
        text = f"rule #{self.id} ({', '.join(parts)})"
        return f"{text}: {self.note}" if self.note else text


def compile_rule(rule) -> CompiledRule:
    arg_match = tuple(compile_arg_spec(path, spec) for path, spec in sorted((rule.arg_match or {}).items()))
    return CompiledRule(
        id=rule.id, behavior=rule.behavior, priority=rule.priority, tool_pattern=rule.tool_pattern,
        arg_match=arg_match, agents=frozenset(rule.agents or ()), users=frozenset(rule.users or ()),
        queue_id=rule.queue_id, note=rule.note, user_verified=rule.user_verified,
    )


class RuleIndex:
    def __init__(self, rules=()):
        self._candidates: dict[str, list[CompiledRule]] = {}  # the index never changes once built
        self.exact: dict[str, list[CompiledRule]] = {}
        self.by_prefix: dict[str, list[CompiledRule]] = {}
        self.prefix_lengths: list[int] = []
        for rule in rules:
            self.add(rule if isinstance(rule, CompiledRule) else compile_rule(rule))
        for bucket in (*self.exact.values(), *self.by_prefix.values()):
            bucket.sort(key=lambda r: r.sort_key)

    def add(self, rule: CompiledRule) -> None:
        if "*" not in rule.tool_pattern:
            self.exact.setdefault(rule.tool_pattern, []).append(rule)
            return
        prefix = pattern_prefix(rule.tool_pattern)
        if prefix not in self.by_prefix:
            self.by_prefix[prefix] = []
            if len(prefix) not in self.prefix_lengths:
                insort(self.prefix_lengths, len(prefix))
        self.by_prefix[prefix].append(rule)

    def candidates(self, tool_name: str) -> list[CompiledRule]:
        cached = self._candidates.get(tool_name)
        if cached is not None:
            return cached
        found = list(self.exact.get(tool_name, ()))
        for length in self.prefix_lengths:
            if length > len(tool_name):
                break
            found.extend(self.by_prefix.get(tool_name[:length], ()))
        found.sort(key=lambda r: r.sort_key)
        if len(self._candidates) < 10_000:
            self._candidates[tool_name] = found
        return found


@dataclass(frozen=True)
class Decision:
    behavior: str
    rule: int | None
    reason: str
    queue: int | None = None
    grant: int | None = None  # the grant that allows a call the rules would ask about (approvals.grants)

    def as_dict(self) -> dict:
        decided = {"behavior": self.behavior, "rule": self.rule, "reason": self.reason}
        if self.grant is not None:
            decided["grant"] = self.grant
        return decided


UNTRUSTED_REVIEW = ("needs approval: the tool comes from an untrusted MCP server, and the tenant has a reviewer "
                    "look at such calls unless a rule decides them")


def decide(index: RuleIndex, *, tool_name: str, effective_input: dict, agent: str, user: str,
           read_only_trusted: bool, auto_allow_read_only: bool, default_behavior: str,
           user_verified: bool = False, review_untrusted: bool = False) -> Decision:
    """`review_untrusted`: the tool comes from an untrusted MCP server and the tenant reviews such tools' calls;
    a call no rule decides then asks where the tenant's default would allow it (a default of deny still denies)."""
    # Candidates come in decision order, so the first rule that matches decides (or, when it allows, yields
    # to read-only auto-allow first).
    arguments = Arguments(effective_input)
    rule = next((rule for rule in index.candidates(tool_name) if rule.matches(
        tool_name=tool_name, effective_input=effective_input, agent=agent, user=user, arguments=arguments,
        user_verified=user_verified)), None)
    if rule is not None and rule.behavior in HOLDING:
        reason = f"{VERBS[rule.behavior]} by {rule.describe()}"
        oversized = rule.oversized_paths(arguments)
        if oversized:
            reason += (f" ({', '.join(oversized)} is longer than {MAX_MATCHED_CHARS:,} characters, which no "
                       "glob checks: it counts as matching)")
        return Decision(rule.behavior, rule.id, reason, rule.queue_id)
    if read_only_trusted and auto_allow_read_only:
        return Decision("allow", None, "allowed: the tool is read-only and its source is trusted")
    if rule is not None:
        return Decision("allow", rule.id, f"allowed by {rule.describe()}")
    if review_untrusted and default_behavior == "allow":
        return Decision("ask", None, UNTRUSTED_REVIEW)
    return Decision(default_behavior, None, f"no rule matched: the tenant's default is {default_behavior}")


index_cache: VersionedCache[RuleIndex] = VersionedCache(PolicyVersion)
