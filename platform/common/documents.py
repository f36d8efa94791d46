"""Documents from outside (YAML or JSON text): read with work held to the bounds, or refused early.

PyYAML's pure-Python scanner is quadratic in flow nesting (each token checks every open level's possible
simple key, and a key stays possible for 1024 characters), and its composer recurses once per level: a 10 KB
document of nested `[` costs seconds before a check of the built value could run. So every bound is checked
on the parser's event stream, which is lazy, and reading stops at the first event past one:

- size: the text's UTF-8 bytes, before anything is parsed;
- nesting: lists and mappings inside one another; the pure-Python scanner also refuses a flow collection
  opened past the bound, before it scans further ahead;
- values: scalars (mapping keys included), lists and mappings, counted one event at a time;
- anchors and aliases, refused at the first (an alias-built document can be huge once expanded), and merge
  keys (`<<`), which exist for them;
- optionally a mapping key that appears twice.

The value is built from the same events as they are read, in one pass, without a node graph or recursion;
scalars resolve and construct as PyYAML's safe loader makes them (YAML's own tags only). libyaml's parser is
used when PyYAML has it (C speed); the pure-Python one otherwise, under the same bounds. JSON goes through
`json_values.json_parse`, which parses at C speed and checks the same bounds on the value.
"""
import datetime

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.events import (
    AliasEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)
from yaml.nodes import ScalarNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from common.json_values import MAX_JSON_DEPTH, json_parse

try:
    from yaml.cyaml import CParser
except ImportError:  # PyYAML built without libyaml
    CParser = None

# libyaml's own limit on nesting; its scanner reaches it before the first event of such a document
LIBYAML_NESTING = "exceeded maximum nesting depth"


class DocumentRefused(ValueError):
    """Why a document is not read. `kind`: size, text, nesting, nodes, anchor, merge, duplicate or syntax;
    `line` and `column` (from 1) where the parser was, when known; `key`, the repeated key of a `duplicate`."""

    def __init__(self, message: str, *, kind: str, line: int | None = None, column: int | None = None,
                 key: str | None = None, reason: str = ""):
        super().__init__(message)
        self.kind, self.line, self.column, self.key = kind, line, column, key
        self.reason = reason or message  # without the position


def _nesting(max_depth: int) -> DocumentRefused:
    return DocumentRefused(f"nested more than {max_depth} levels deep (lists and mappings inside one another)",
                           kind="nesting")


def size_check(text, max_bytes: int) -> None:
    """DocumentRefused unless `text` is a string of at most `max_bytes` UTF-8 bytes (a lone surrogate is not)."""
    if not isinstance(text, str):
        raise DocumentRefused("a document is text", kind="text")
    try:  # C speed: a copy of what is in memory already
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise DocumentRefused(f"a lone surrogate (\\u{ord(text[exc.start]):04x}) is not text",
                              kind="text") from None
    if size > max_bytes:
        raise DocumentRefused(f"{size} bytes; at most {max_bytes}", kind="size")


class _PythonParser(Reader, Scanner, Parser):
    """PyYAML's pure-Python parser, refusing a flow collection opened past the nesting bound as it scans: its
    scanner looks up to 1024 characters ahead before the first event, at a cost that grows with the levels."""

    def __init__(self, text: str, max_depth: int):
        Reader.__init__(self, text)
        Scanner.__init__(self)
        Parser.__init__(self)
        self.max_flow_level = max_depth

    def fetch_flow_collection_start(self, TokenClass):  # noqa: N803 (PyYAML's name)
        if self.flow_level >= self.max_flow_level:
            raise _nesting(self.max_flow_level)
        super().fetch_flow_collection_start(TokenClass)


def event_parser(text: str, max_depth: int):
    """The parser whose events are read: libyaml's when PyYAML has it."""
    return CParser(text) if CParser is not None else _PythonParser(text, max_depth)


STR, MAP, SEQ = "tag:yaml.org,2002:str", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"
MERGE, TIMESTAMP = "tag:yaml.org,2002:merge", "tag:yaml.org,2002:timestamp"
COLLECTION_TAGS = frozenset({"tag:yaml.org,2002:set", "tag:yaml.org,2002:omap", "tag:yaml.org,2002:pairs"})
_KEY = object()  # a mapping's next node is a key
_UNSEEN = object()


class _Builder(SafeConstructor, Resolver):
    """Builds the value from the parser's events, checking each against the bounds as it is read: no node
    graph, no recursion. Scalars are resolved and constructed as PyYAML's safe loader does (YAML's own tags
    only; a plain scalar's value is kept for the next one alike); a list or mapping takes no tag but its own,
    and merge keys (`<<`) are refused with the aliases they exist for."""

    def __init__(self, *, max_depth: int, max_nodes: int, unique_keys: bool):
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self.max_depth, self.max_nodes, self.unique_keys = max_depth, max_nodes, unique_keys
        self.plain: dict = {}  # plain scalar text -> its value (immutable: an int, a date, a string…)

    def build(self, parser):
        # one frame per open collection: [the list or dict, the pending key (or _KEY), the keys seen]
        frames: list[list] = []
        nodes, documents, value = 0, 0, None
        plain, max_nodes, unique_keys, next_event = self.plain, self.max_nodes, self.unique_keys, parser.get_event
        while True:
            event = next_event()
            kind = type(event)
            if kind is ScalarEvent:
                nodes += 1
                if nodes > max_nodes:
                    raise _too_many(max_nodes)
                if event.anchor is not None:
                    raise _anchor()
                tag = event.tag
                if tag is None and event.implicit[0]:
                    item = plain.get(event.value, _UNSEEN)
                    if item is _UNSEEN:
                        item = plain[event.value] = self._plain(event)
                elif tag is None or tag == "!" or tag == STR:
                    item = event.value
                else:
                    item = self._construct(tag, event)
            elif kind is SequenceEndEvent or kind is MappingEndEvent:
                item = frames.pop()[0]
            elif kind is SequenceStartEvent or kind is MappingStartEvent:
                nodes += 1
                if nodes > max_nodes:
                    raise _too_many(max_nodes)
                if event.anchor is not None:
                    raise _anchor()
                mapping = kind is MappingStartEvent
                tag = event.tag
                if tag is not None and tag != "!" and tag != (MAP if mapping else SEQ):
                    raise _tag_refused(tag, event.start_mark)
                frames.append([{}, _KEY, set() if unique_keys else None] if mapping else [[], None, None])
                if len(frames) > self.max_depth:
                    raise _nesting(self.max_depth)
                continue
            elif kind is AliasEvent:
                raise _anchor()
            elif kind is DocumentStartEvent:
                documents += 1
                if documents > 1:
                    raise ComposerError(None, None, "expected a single document, but found another",
                                        event.start_mark)
                continue
            elif kind is StreamEndEvent or event is None:
                return value
            else:  # the stream's start, a document's end
                continue
            if not frames:
                value = item
                continue
            frame = frames[-1]
            container = frame[0]
            if type(container) is list:
                container.append(item)
            elif frame[1] is _KEY:
                if isinstance(item, dict | list):
                    raise ConstructorError(None, None, "a mapping key may not be a list or a mapping",
                                           event.start_mark)
                if unique_keys:
                    if item in frame[2]:
                        raise DocumentRefused(f"the key {str(item)[:80]!r} appears more than once",
                                              kind="duplicate", key=str(item))
                    frame[2].add(item)
                frame[1] = item
            else:
                container[frame[1]] = item
                frame[1] = _KEY

    def _plain(self, event):
        """A plain scalar's value: its type as YAML 1.1's implicit rules resolve it (PyYAML's)."""
        text = event.value
        if text.isdigit() and text.isascii() and len(text) <= 18 and (text[0] != "0" or len(text) == 1):
            return int(text)  # what the rules and the constructor make of it, without their regular expressions
        for tag, pattern in self.yaml_implicit_resolvers.get(text[:1], ()):
            if pattern.match(text):
                if tag == MERGE:
                    raise DocumentRefused("YAML merge keys (<<) are not accepted; write the values out",
                                          kind="merge")
                if tag == TIMESTAMP and len(text) == 10:  # the pattern matched: YYYY-MM-DD, a date alone
                    return self._date(text, event)
                return self._construct(tag, event)
        return text

    @staticmethod
    def _date(text: str, event) -> datetime.date:
        try:
            return datetime.date(int(text[:4]), int(text[5:7]), int(text[8:]))
        except ValueError as exc:
            raise ConstructorError(None, None, f"{text!r} cannot be read: {exc}", event.start_mark) from None

    def _construct(self, tag: str, event):
        construct = self.yaml_constructors.get(tag)
        if construct is None or tag in (MAP, SEQ) or tag in COLLECTION_TAGS:
            raise _tag_refused(tag, event.start_mark)
        try:
            return construct(self, ScalarNode(tag, event.value, event.start_mark, event.end_mark))
        except (ValueError, OverflowError) as exc:  # a date that is none (2024-13-45), an int of 5,000 digits
            raise ConstructorError(None, None, f"{event.value[:40]!r} cannot be read: {exc}",
                                   event.start_mark) from None


def _too_many(max_nodes: int) -> DocumentRefused:
    return DocumentRefused(f"more than {max_nodes} values (scalars, keys, lists and mappings)", kind="nodes")


def _tag_refused(tag: str, mark) -> yaml.YAMLError:
    if tag in SafeConstructor.yaml_constructors:
        return ConstructorError(None, None, f"the tag {tag!r} is not accepted here: write a plain value, list or "
                                "mapping", mark)
    return ConstructorError(None, None, f"could not determine a constructor for the tag {tag!r}", mark)


def _anchor() -> DocumentRefused:
    return DocumentRefused("YAML anchors and aliases (&name, *name) are not accepted; write the values out",
                           kind="anchor")


def _syntax(exc: yaml.YAMLError, max_depth: int) -> DocumentRefused:
    reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if reason == LIBYAML_NESTING:
        return _nesting(max_depth)
    mark = getattr(exc, "problem_mark", None)
    line, column = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
    where = f" (line {line}, column {column})" if mark is not None else ""
    return DocumentRefused(f"not valid YAML{where}: {reason}", kind="syntax", line=line, column=column,
                           reason=reason)


def _yaml_value(text: str, *, max_nodes: int, max_depth: int, unique_keys: bool):
    parser = event_parser(text, max_depth)
    try:
        return _Builder(max_depth=max_depth, max_nodes=max_nodes, unique_keys=unique_keys).build(parser)
    except yaml.YAMLError as exc:
        raise _syntax(exc, max_depth) from None
    finally:
        parser.dispose()


def yaml_parse(text: str, *, max_bytes: int, max_nodes: int, max_depth: int = MAX_JSON_DEPTH,
               unique_keys: bool = False):
    """The value of a YAML document (one), read within the bounds; DocumentRefused saying why not. With
    `unique_keys`, a key repeated in a mapping is refused too (YAML forbids it; PyYAML keeps the last)."""
    size_check(text, max_bytes)
    return _yaml_value(text, max_nodes=max_nodes, max_depth=max_depth, unique_keys=unique_keys)


def document_parse(text: str, *, max_bytes: int, max_nodes: int, max_depth: int = MAX_JSON_DEPTH):
    """The value of a JSON or YAML document (JSON when it starts with `{`), read within the bounds; ValueError
    saying why not (DocumentRefused but for JSON's own messages)."""
    size_check(text, max_bytes)
    if text.lstrip()[:1] == "{":
        return json_parse(text, max_depth=max_depth, max_nodes=max_nodes)
    return _yaml_value(text, max_nodes=max_nodes, max_depth=max_depth, unique_keys=False)
