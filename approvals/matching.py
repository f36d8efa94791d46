"""Glob matching for rules (DESIGN §5).

Patterns match the whole value. A `*` next to white space stands for whole words: `git *` matches
`git` and `git push` but never `gitx`; `* --force` matches `--force` and `git push --force`. A `*`
inside a word matches any characters (`*.py`, `mcp__github__*`). A pattern without `*` is an exact
match, never a substring.
"""
import json
import re
from collections.abc import Callable
from functools import lru_cache

_STAR = re.compile(r"(\s*)\*(\s*)")


@lru_cache(maxsize=65536)
def glob_regex(pattern: str) -> re.Pattern:
    out = []
    position = 0
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


@lru_cache(maxsize=65536)
def compile_glob(pattern: str) -> Callable[[str], bool]:
    if "*" not in pattern:
        return pattern.__eq__
    return glob_regex(pattern).fullmatch


def value_text(value) -> str:
    """What an argument's value looks like to a glob."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return " ".join(value)
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


_MISSING = object()


def lookup(data, path: str):
    """`a.b.c` into nested objects; missing → a sentinel."""
    current = data
    for key in path.split("."):
        if isinstance(current, dict) and key in current:
            current = current[key]
        else:
            return _MISSING
    return current


def arg_matches(effective_input: dict, path: str, globs: tuple) -> bool:
    value = lookup(effective_input, path)
    if value is _MISSING:
        return False
    text = value_text(value)
    return any(compile_glob(glob)(text) for glob in globs)


def pattern_prefix(pattern: str) -> str:
    """The literal part before the first `*`: the key under which the rule index files a pattern."""
    return pattern.split("*", 1)[0]
