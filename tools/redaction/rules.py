"""A tenant's redaction rules: what of a tool's result the model must never see.

A rule's pattern is a regular expression the tenant writes, so hostile input: patterns are compiled with RE2,
whose matching time grows linearly with the text whatever the pattern (no backtracking, so no pattern can
hang a worker), and whose memory per pattern is bounded. RE2 has no back-references or look-around; a
pattern that uses them is refused when it is saved. Compiled rules are kept per process under the tenant's
catalog version, which every write of a rule bumps (`tools.apps`).
"""
import logging
from dataclasses import dataclass, field

import re2
from django.db import transaction

from audit.services import audit_record
from common.errors import ServiceError
from tenancy.versions import VersionedCache
from tools.models import CatalogVersion, RedactionRule

logger = logging.getLogger("toolkeeper.calls")

MAX_PATTERN_CHARS = 500
MAX_REPLACEMENT_CHARS = 100
MAX_TOOL_PATTERN_CHARS = 200
MAX_RULES = 200  # per tenant: each rule is one pass over every text of every result
PATTERN_MEMORY = 1 << 20  # bytes RE2 may use for one compiled pattern


def _options():
    options = re2.Options()
    options.log_errors = False  # a bad pattern is the tenant's error, answered as such, not a log line
    options.max_mem = PATTERN_MEMORY
    return options


def pattern_compile(pattern: str):
    """The compiled pattern; ValueError with a reason for the tenant when it is refused."""
    if not pattern:
        raise ValueError("a pattern is required")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"at most {MAX_PATTERN_CHARS} characters")
    try:
        compiled = re2.compile(pattern, options=_options())
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ValueError(f"not a valid pattern ({reason}); back-references and look-around are not "
                         "supported") from None
    if compiled.search("") is not None:
        raise ValueError("the pattern matches empty text: it would redact nothing and everything")
    return compiled


def tool_pattern_matches(pattern: str, name: str) -> bool:
    """Tool patterns as permission rules read them: `*` matches any run of characters, the rest is literal, the
    whole name must match (so a pattern without `*` is the exact name)."""
    if "*" not in pattern:
        return pattern == name
    parts = pattern.split("*")
    first, last = parts[0], parts[-1]
    if len(name) < len(first) + len(last) or not name.startswith(first) or not name.endswith(last):
        return False
    position, end = len(first), len(name) - len(last)
    for part in parts[1:-1]:  # leftmost placement of each middle part is enough: `*` absorbs the rest
        found = name.find(part, position, end)
        if found < 0:
            return False
        position = found + len(part)
    return True


@dataclass(frozen=True)
class CompiledRule:
    name: str
    regex: object
    replacement: str
    tool_pattern: str
    keep_original: bool


@dataclass
class TenantRules:
    rules: tuple[CompiledRule, ...] = ()
    by_tool: dict[str, tuple[CompiledRule, ...]] = field(default_factory=dict)

    def for_tool(self, tool_name: str) -> tuple[CompiledRule, ...]:
        found = self.by_tool.get(tool_name)
        if found is None:
            found = self.by_tool[tool_name] = tuple(r for r in self.rules if tool_pattern_matches(r.tool_pattern,
                                                                                              tool_name))
        return found


def _load(tenant_id: int, version: int) -> TenantRules:
    compiled = []
    for rule in RedactionRule.objects.for_tenant(tenant_id).filter(enabled=True).order_by("name"):
        try:
            regex = pattern_compile(rule.pattern)
        except ValueError as exc:  # saved around the services (a database edit): logged, never half-applied
            logger.warning("redaction rule %r of tenant %s is not applied: %s", rule.name, tenant_id, exc)
            continue
        compiled.append(CompiledRule(name=rule.name, regex=regex, replacement=rule.replacement,
                                     tool_pattern=rule.tool_pattern, keep_original=rule.keep_original))
    return TenantRules(rules=tuple(compiled))


_cache: VersionedCache[TenantRules] = VersionedCache(CatalogVersion)


def tenant_rules(tenant_id: int, *, version: int | None = None) -> TenantRules:
    """The tenant's enabled rules, compiled; for `version`, the catalog version the caller read just now."""
    return _cache.get(tenant_id, _load, version=version)


class Redaction:
    """Applies rules to texts, counting replacements per rule (never remembering what was replaced)."""

    def __init__(self, rules: tuple[CompiledRule, ...]):
        self.rules = rules
        self.counts: dict[str, int] = {}

    def text(self, value: str) -> str:
        for rule in self.rules:
            value, count = rule.regex.subn(lambda match, rule=rule: rule.replacement, value)
            if count:
                self.counts[rule.name] = self.counts.get(rule.name, 0) + count
        return value

    def value(self, value):
        """Every string inside a JSON value, keys included (a key can be an e-mail address)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(item) for item in value]
        if isinstance(value, dict):
            redacted = {}
            for key, item in value.items():
                new_key = self.text(key) if isinstance(key, str) else key
                while new_key in redacted:  # two keys redacted alike both stay
                    new_key = f"{new_key}#"
                redacted[new_key] = self.value(item)
            return redacted
        return value

    @property
    def matched(self) -> list[CompiledRule]:
        return [rule for rule in self.rules if rule.name in self.counts]


# --- writes --------------------------------------------------------------------------------------

FIELDS = ("name", "pattern", "replacement", "tool_pattern", "keep_original", "enabled")


def _check(values: dict) -> None:
    errors: dict[str, list[str]] = {}
    name = values.get("name", "")
    if not isinstance(name, str) or not name.strip() or len(name) > 64:
        errors["name"] = ["1-64 characters"]
    try:
        pattern_compile(values.get("pattern", ""))
    except ValueError as exc:
        errors["pattern"] = [str(exc)]
    replacement = values.get("replacement", "")
    if not isinstance(replacement, str) or len(replacement) > MAX_REPLACEMENT_CHARS:
        errors["replacement"] = [f"at most {MAX_REPLACEMENT_CHARS} characters"]
    tool_pattern = values.get("tool_pattern", "")
    if (not isinstance(tool_pattern, str) or not tool_pattern or len(tool_pattern) > MAX_TOOL_PATTERN_CHARS
            or any(char.isspace() for char in tool_pattern)):
        errors["tool_pattern"] = [f"a tool name or a pattern with * (1-{MAX_TOOL_PATTERN_CHARS} characters, "
                                  "no spaces)"]
    if errors:
        raise ServiceError(errors)


def _audit_data(rule: RedactionRule) -> dict:
    # The pattern is configuration, not data; the texts it matched are never recorded anywhere.
    return {"pattern": rule.pattern, "tool_pattern": rule.tool_pattern, "keep_original": rule.keep_original,
            "enabled": rule.enabled}


def redaction_rule_create(*, tenant, name: str, pattern: str, replacement: str = "[redacted]",
                          tool_pattern: str = "*", keep_original: bool = False, enabled: bool = True,
                          actor=None) -> RedactionRule:
    values = {"name": name, "pattern": pattern, "replacement": replacement, "tool_pattern": tool_pattern}
    _check(values)
    name = name.strip()
    if RedactionRule.objects.for_tenant(tenant).filter(name=name).exists():
        raise ServiceError({"name": [f"a rule named {name!r} exists"]})
    if RedactionRule.objects.for_tenant(tenant).count() >= MAX_RULES:
        raise ServiceError({"name": [f"a tenant has at most {MAX_RULES} redaction rules"]})
    with transaction.atomic():
        rule = RedactionRule.objects.create(tenant=tenant, name=name, pattern=pattern, replacement=replacement,
                                            tool_pattern=tool_pattern, keep_original=keep_original, enabled=enabled)
        audit_record(tenant=tenant, actor=actor, verb="redaction_rule.created", target=f"redaction_rule:{name}",
                     data=_audit_data(rule))
    return rule


def redaction_rule_update(*, rule: RedactionRule, actor=None, **changes) -> RedactionRule:
    unknown = set(changes) - set(FIELDS)
    if unknown:
        raise ServiceError({name: ["cannot be changed"] for name in sorted(unknown)})
    values = {name: changes.get(name, getattr(rule, name)) for name in FIELDS}
    _check(values)
    values["name"] = values["name"].strip()
    if values["name"] != rule.name and RedactionRule.objects.for_tenant(rule.tenant_id).filter(
            name=values["name"]).exists():
        raise ServiceError({"name": [f"a rule named {values['name']!r} exists"]})
    with transaction.atomic():
        for name, value in values.items():
            setattr(rule, name, value)
        rule.save()
        audit_record(tenant=rule.tenant, actor=actor, verb="redaction_rule.updated",
                     target=f"redaction_rule:{rule.name}", data=_audit_data(rule))
    return rule


def redaction_rule_delete(*, rule: RedactionRule, actor=None) -> None:
    with transaction.atomic():
        rule.delete()
        audit_record(tenant=rule.tenant, actor=actor, verb="redaction_rule.deleted",
                     target=f"redaction_rule:{rule.name}")
