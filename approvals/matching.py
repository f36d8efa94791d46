"""Glob matching for rules (docs/governance.md).

Patterns match the whole value. A `*` next to white space stands for whole words: `git *` matches
`git` and `git push` but never `gitx`; `* --force` matches `--force` and `git push --force`. A `*`
inside a word matches any characters (`*.py`, `mcp__github__*`). A pattern without `*` is an exact
match, never a substring.

Matching never backtracks. A pattern is cut at its stars into literals; the first literal must start
the text, the last must end it, and each one between is looked for once, left to right, with
`str.find`: the leftmost place that fits is always the best one, so a match takes time linear in the
length of the text.

Argument values are matched as text with white space normalised (`normalize_space`: no leading or
trailing white space, every run of spaces, tabs or newlines one space), and argument globs are
normalised alike, so white space is never significant to a rule: `" rm  -rf /"` is `rm -rf /` to
`rm *`. A value whose text is longer than `MAX_MATCHED_CHARS` is not matched: it counts as matching
the argument globs of deny and ask rules and never those of allow rules, the safe side either way.
An argument may also be matched exactly, without glob or normalisation: `{"equals": <JSON value>}`;
`{"absent": true}` matches when the input has no such argument.
"""
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

MAX_MATCHED_CHARS = 65_536
SPACE = " "
# What `str.split()` and a regular expression's \s call white space.
WHITE_SPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
               "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_TO_SPACE = str.maketrans(dict.fromkeys(WHITE_SPACE, SPACE))


def normalize_space(text: str) -> str:
    return SPACE.join(text.split())


class _Star(NamedTuple):
    left: bool = False  # white space before it in the pattern: its gap starts with white space
    right: bool = False  # white space after it: its gap ends with white space
    optional: bool = False  # white space on one side only, and the pattern ends (or starts) there: may be empty


@dataclass(frozen=True)
class _Literal:
    text: str  # as written in the pattern (its own white space is matched exactly)
    needle: str  # what is looked for in spaced text: the literal, with the spaces its stars demand around it
    head: int  # 1 when the needle starts with a space the star before demands
    shift: int  # where the needle may start, relative to the end of the previous literal


class Glob:
    """A pattern with at least one `*`.

    A star may be touched by white space in the pattern. The gap it stands for is any text when it is
    not; starts with white space when white space is on its left (`git *`); ends with white space when
    white space is on its right (`* --force`). A star with white space on one side only that ends (or
    starts) the pattern may also stand for nothing: `git *` matches `git`.

    Matching works on padded text, `" " + text + " "` with every white space character a space, so a
    star's demand for a space is a space in the needle, and "nothing at the end" is the padding.
    """

    def __init__(self, pattern: str):
        parts = pattern.split("*")
        last = len(parts) - 1
        stars, literals = [], []
        for number, part in enumerate(parts):
            core = part.lstrip() if number else part  # white space right after a star is the star's
            if number:
                left, right = literals[-1][1], len(core) < len(part)
                at_start, at_end = number == 1 and not parts[0].strip(), number == last and not part.strip()
                stars.append(_Star(left, right, left != right and ((left and at_end) or (right and at_start))))
            literal = core.rstrip() if number < last else core  # white space right before a star is the star's
            literals.append((literal, len(literal) < len(core)))
        self.literals = []
        for number, (literal, _) in enumerate(literals):
            before = stars[number - 1] if number else _Star()
            after = stars[number] if number < len(stars) else _Star()
            if before.optional and before.right:
                shift = -1  # the space before the literal may be the padding before the text
            elif before.left and not before.right and not before.optional:
                shift = 1  # the gap is at least the space the previous needle ended with
            else:
                shift = 0
            self.literals.append(_Literal(
                text=literal, needle=SPACE * before.right + literal.translate(_TO_SPACE) + SPACE * after.left,
                head=int(before.right), shift=shift,
            ))

    def match_padded(self, spaced: str, padded: str | None = None) -> bool:
        """`spaced`: `" " + text + " "` with every white space character a space. `padded`: the same without
        the replacement, when the text may hold white space other than single spaces (then literals
        holding white space are checked against it)."""
        # A needle may run into the padding after the text only by its last character, the space a star after it
        # asks for; what follows that star must then start past the padding, so it cannot match unless the star
        # may stand for nothing and ends the pattern: no bound is needed on where a needle ends.
        first, *middle, last = self.literals
        if not spaced.startswith(first.needle, 1) or not self._fits(padded, first, 1):
            return False
        end = 1 + len(first.text)
        for literal in middle:
            start = end + literal.shift
            while True:
                at = spaced.find(literal.needle, start)
                if at < 0:
                    return False
                if self._fits(padded, literal, at):
                    break
                start = at + 1  # the pattern's own white space differs from the text's there
            end = at + literal.head + len(literal.text)
        at = len(spaced) - 1 - len(last.needle)  # the last needle ends where the padding after the text starts
        return at >= end + last.shift and spaced.startswith(last.needle, at) and self._fits(padded, last, at)

    @staticmethod
    def _fits(padded: str | None, literal: _Literal, at: int) -> bool:
        return padded is None or padded.startswith(literal.text, at + literal.head)


@lru_cache(maxsize=65536)
def compile_glob(pattern: str) -> Callable[[str], bool]:
    """A matcher for text as it is (tool names)."""
    if "*" not in pattern:
        return pattern.__eq__
    glob = Glob(pattern)
    if not any(char.isspace() for char in pattern):
        # No white space in the pattern (tool patterns): stars match anything, the text's white space is
        # just characters, and the commonest shape, one star, is a prefix and a suffix.
        if len(glob.literals) == 2:
            first, last = glob.literals[0].text, glob.literals[1].text
            shortest = len(first) + len(last)
            return lambda text: len(text) >= shortest and text.startswith(first) and text.endswith(last)
        return lambda text: glob.match_padded(f" {text} ")
    return lambda text: glob.match_padded(f" {text.translate(_TO_SPACE)} ", f" {text} ")


class ArgumentText:
    """An argument's text as globs see it: `" " + normalised text + " "`, and (when a glob asks) its words."""

    __slots__ = ("padded", "_words")

    def __init__(self, text: str):
        self.padded = f" {text} "
        self._words = None

    def has_words(self, words: tuple[str, ...]) -> bool:
        if self._words is None:
            self._words = frozenset(self.padded.split(SPACE))
        return all(word in self._words for word in words)


class ExactArgGlob:
    __slots__ = ("padded",)

    def __init__(self, pattern: str):
        self.padded = f" {pattern} "

    def match(self, argument: ArgumentText) -> bool:
        return argument.padded == self.padded


class ArgGlob(Glob):
    """A glob on argument text. A literal between two stars that holds whole words (`* --force *`) needs those
    words in the text: a look at the text's set of words rules most such globs out without a scan."""

    def __init__(self, pattern: str):
        super().__init__(pattern)
        self.words = tuple(word for literal in self.literals[1:-1]
                           for word in literal.needle.split(SPACE)[1:-1] if word)

    def match(self, argument: ArgumentText) -> bool:
        if self.words and not argument.has_words(self.words):
            return False
        return self.match_padded(argument.padded)


@lru_cache(maxsize=65536)
def compile_arg_glob(pattern: str) -> ArgGlob | ExactArgGlob:
    """A matcher of `ArgumentText`; the pattern is normalised like the values."""
    pattern = normalize_space(pattern)
    return ArgGlob(pattern) if "*" in pattern else ExactArgGlob(pattern)


def value_text(value) -> str:
    """What an argument's value looks like to a glob."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return " ".join(value)
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def canonical_json(value) -> str:
    """One text per JSON value: what `{"equals": …}` compares (so `1`, `1.0` and `true` stay apart)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


_MISSING = object()
OVERSIZED = object()


def lookup(data, path: str):
    """`a.b.c` into nested objects; missing → a sentinel."""
    current = data
    for key in path.split("."):
        if isinstance(current, dict) and key in current:
            current = current[key]
        else:
            return _MISSING
    return current


class Arguments:
    """An effective input as argument specs see it: each value's text worked out once per decision."""

    def __init__(self, effective_input: dict):
        self.effective_input = effective_input
        self._texts: dict[str, object] = {}
        self._canonical: dict[str, str | None] = {}

    def text(self, path: str):
        """The argument's `ArgumentText`; None when it is missing, OVERSIZED past the cap."""
        if path not in self._texts:
            value = lookup(self.effective_input, path)
            text = None
            if value is not _MISSING:
                text = normalize_space(value_text(value))
                text = OVERSIZED if len(text) > MAX_MATCHED_CHARS else ArgumentText(text)
            self._texts[path] = text
        return self._texts[path]

    def canonical(self, path: str) -> str | None:
        if path not in self._canonical:
            value = lookup(self.effective_input, path)
            self._canonical[path] = None if value is _MISSING else canonical_json(value)
        return self._canonical[path]


@dataclass(frozen=True)
class GlobMatch:
    """The argument's text matches one of the globs."""

    path: str
    globs: tuple[str, ...]

    def matches(self, arguments: Arguments, *, oversized: bool) -> bool:
        text = arguments.text(self.path)
        if text is None:
            return False
        if text is OVERSIZED:
            return oversized
        return any(compile_arg_glob(glob).match(text) for glob in self.globs)

    def describe(self) -> str:
        return f"{self.path} matches {' or '.join(repr(glob) for glob in self.globs)}"


@dataclass(frozen=True)
class EqualsMatch:
    """The argument is exactly this JSON value."""

    path: str
    value: str  # canonical JSON

    def matches(self, arguments: Arguments, *, oversized: bool) -> bool:
        return arguments.canonical(self.path) == self.value

    def describe(self) -> str:
        return f"{self.path} equals {self.value}"


@dataclass(frozen=True)
class AbsentMatch:
    """The input has no such argument."""

    path: str

    def matches(self, arguments: Arguments, *, oversized: bool) -> bool:
        return arguments.canonical(self.path) is None

    def describe(self) -> str:
        return f"{self.path} is absent"


def is_arg_spec(spec) -> bool:
    """A glob, a non-empty list of globs, `{"equals": value}` or `{"absent": true}`."""
    if isinstance(spec, str):
        return True
    if isinstance(spec, list):
        return bool(spec) and all(isinstance(glob, str) for glob in spec)
    return isinstance(spec, dict) and (set(spec) == {"equals"} or spec == {"absent": True})


def compile_arg_spec(path: str, spec) -> GlobMatch | EqualsMatch | AbsentMatch:
    if isinstance(spec, dict) and "absent" in spec:
        return AbsentMatch(path=path)
    if isinstance(spec, dict):
        return EqualsMatch(path=path, value=canonical_json(spec["equals"]))
    globs = spec if isinstance(spec, list) else [spec]
    return GlobMatch(path=path, globs=tuple(str(glob) for glob in globs))


def arg_matches(effective_input: dict, path: str, globs: tuple, *, oversized: bool = True) -> bool:
    return GlobMatch(path=path, globs=tuple(globs)).matches(Arguments(effective_input), oversized=oversized)


def pattern_prefix(pattern: str) -> str:
    """The literal part before the first `*`: the key under which the rule index files a pattern."""
    return pattern.split("*", 1)[0]
