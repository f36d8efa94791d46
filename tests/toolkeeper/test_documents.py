"""The bounded reader of documents from outside (common.documents): every bound is checked as the parser's
events arrive, and reading stops at the first event past one, with libyaml's parser and with PyYAML's
pure-Python one alike. No timed assertions: the parser's work is counted (events read, characters scanned)."""
import pytest
import yaml

from common import documents, json_values
from common.documents import DocumentRefused, document_parse, yaml_parse
from common.json_values import json_parse

MIB = 1024 * 1024
NODES = 1000  # the bound on values in these tests
DEPTH = 64

PARSERS = ["libyaml", "python"] if documents.CParser is not None else ["python"]


@pytest.fixture(params=PARSERS)
def parsed(request, monkeypatch):
    """Which parser reads (libyaml when PyYAML has it, and always the pure-Python fallback), and a record of
    its work: the events it handed out and the parser itself (the pure-Python one knows how far it scanned)."""
    if request.param == "python":
        monkeypatch.setattr(documents, "CParser", None)
    work = {"events": 0, "parser": None}
    real = documents.event_parser

    class Counting:
        def __init__(self, parser):
            self.parser = parser

        def check_event(self, *choices):
            return self.parser.check_event(*choices)

        def get_event(self):
            work["events"] += 1
            return self.parser.get_event()

        def dispose(self):
            self.parser.dispose()

    def counting(text, max_depth):
        work["parser"] = real(text, max_depth)
        return Counting(work["parser"])

    monkeypatch.setattr(documents, "event_parser", counting)
    return work


def refusal(text: str, **bounds) -> DocumentRefused:
    with pytest.raises(DocumentRefused) as caught:
        document_parse(text, **{"max_bytes": MIB, "max_nodes": NODES, **bounds})
    return caught.value


HEAD = "openapi: 3.0.0\nx: "
ROOM = MIB - 64
DEEP = {  # the text, and how many characters hold its first n levels
    "issue's 10 KB of [": (HEAD + "[" * 5000 + "]" * 5000, lambda n: len(HEAD) + n),
    "flow [": (HEAD + "[" * (ROOM // 2) + "]" * (ROOM // 2), lambda n: len(HEAD) + n),
    "flow {a:": (HEAD + "{a: " * (ROOM // 5) + "1" + "}" * (ROOM // 5), lambda n: len(HEAD) + 4 * n),
    "block - - -": ("x:\n  " + "- " * (ROOM // 2) + "1", lambda n: 5 + 2 * n),
    "indented mappings": ("".join(" " * i + "a:\n" for i in range(1400)), lambda n: sum(i + 3 for i in range(n))),
}


@pytest.mark.parametrize("shape", sorted(DEEP))
def test_deep_nesting_is_refused_at_the_bound(parsed, shape):
    text, levels = DEEP[shape]
    exc = refusal(text)
    assert exc.kind == "nesting" and f"nested more than {DEPTH} levels" in str(exc)
    # stopped at the bound: the events of DEPTH levels (a key and a mapping each), not of the whole document
    assert parsed["events"] <= 2 * DEPTH + 10, parsed["events"]
    if isinstance(parsed["parser"], documents._PythonParser):
        # and the pure-Python scanner read hardly past the bound's level: not the 1024 characters of look-ahead
        # a possible key gets in a flow collection, nor the rest of the document
        assert parsed["parser"].pointer <= levels(DEPTH + 2) + 16, (parsed["parser"].pointer, levels(DEPTH + 2))


TINY = {
    "flow [1,1,1": HEAD + "[" + "1," * (ROOM // 2) + "1]",
    "block - 1 lines": "x:\n" + "- 1\n" * (ROOM // 4),
    "flat mapping": "".join(f"k{i}: {i}\n" for i in range(ROOM // 16)),
}


@pytest.mark.parametrize("shape", sorted(TINY))
def test_many_small_values_are_refused_at_the_bound(parsed, shape):
    exc = refusal(TINY[shape])
    assert exc.kind == "nodes" and f"more than {NODES} values" in str(exc)
    assert parsed["events"] <= NODES + 10, parsed["events"]


def test_anchors_and_aliases_are_refused_at_the_first(parsed):
    many = "".join(f"a{i}: &a{i} 1\n" for i in range(ROOM // 20))
    exc = refusal(many)
    assert exc.kind == "anchor" and "anchors and aliases" in str(exc)
    assert parsed["events"] <= 5
    bomb = 'a: ["lol", "lol"]\nb: [*a, *a]\n'  # an alias of nothing anchored is refused as an alias too
    assert refusal(bomb).kind in ("anchor", "syntax")
    assert refusal("a: &x 1\nb: *x\n").kind == "anchor"


def test_merge_keys_are_refused(parsed):
    exc = refusal("base: 1\n<<: {a: 1}\n")
    assert exc.kind == "merge" and "<<" in str(exc)


def test_long_keys_and_values_are_read(parsed):
    text = "".join(f"? {'k' * 2000}{i}\n: {'v' * 3000}\n" for i in range(100))
    value = yaml_parse(text, max_bytes=MIB, max_nodes=NODES)
    assert len(value) == 100 and value["k" * 2000 + "7"] == "v" * 3000


def test_a_realistic_document_is_read_as_safe_load_reads_it(parsed):
    text = """openapi: 3.0.3
info: {title: Demo, version: "1.0"}
servers: [{url: 'https://api.example.com/v1'}]
paths:
  /items/{id}:
    get:
      operationId: getItem
      parameters:
        - {name: id, in: path, required: true, schema: {type: integer, minimum: 1}}
        - name: when
          in: query
          schema: {type: string, format: date, example: 2024-01-01}
      responses:
        '200': {description: OK}
        404:
          description: |
            Not there.
            Really not.
x-flags: [true, no, ~, 0x1f, 1.5e3, .inf, !!str 12, !!binary aGk=]
"""
    assert yaml_parse(text, max_bytes=MIB, max_nodes=NODES) == yaml.safe_load(text)


@pytest.mark.parametrize(("text", "words"), [
    ("a: !!python/object/apply:os.system ['true']", "could not determine a constructor"),
    ("a: !!python/name:os.system", "could not determine a constructor"),
    ("a: !!set {x, y}", "is not accepted here"),
    ("? [a]\n: 1", "a mapping key may not be a list or a mapping"),
    ("--- 1\n--- 2", "expected a single document"),
    ("a: [1, 2\n", "expected ',' or ']'"),
])
def test_what_safe_load_would_refuse_or_build_beyond_json_is_refused(parsed, text, words):
    exc = refusal(text)
    assert exc.kind == "syntax" and words in str(exc) and exc.line is not None, str(exc)


def test_repeated_keys_are_refused_when_asked_at_any_depth(parsed):
    assert yaml_parse("a: 1\na: 2", max_bytes=MIB, max_nodes=NODES) == {"a": 2}  # as PyYAML reads it
    for text in ("a: 1\na: 2", "m: {x: 1, y: {z: 1, z: 2}}", "1: a\n01: b"):
        with pytest.raises(DocumentRefused) as caught:
            yaml_parse(text, max_bytes=MIB, max_nodes=NODES, unique_keys=True)
        assert caught.value.kind == "duplicate", text
    assert yaml_parse("a: {k: 1}\nb: {k: 1}", max_bytes=MIB, max_nodes=NODES, unique_keys=True) == {
        "a": {"k": 1}, "b": {"k": 1}}  # the same key in two mappings is no repeat


def test_size_is_checked_before_parsing(parsed):
    exc = refusal("a: " + "é" * 600, max_bytes=1000)  # 600 characters, 1203 bytes
    assert exc.kind == "size" and str(exc) == "1203 bytes; at most 1000"
    assert parsed["events"] == 0 and parsed["parser"] is None
    assert refusal("a: '\ud800'").kind == "text"
    assert refusal(b"a: 1").kind == "text"


def test_libyaml_is_used_when_pyyaml_has_it(monkeypatch):
    assert (documents.CParser is not None) == yaml.__with_libyaml__
    if documents.CParser is not None:
        assert isinstance(documents.event_parser("a: 1", DEPTH), documents.CParser)
    monkeypatch.setattr(documents, "CParser", None)
    assert isinstance(documents.event_parser("a: 1", DEPTH), documents._PythonParser)


# --- JSON: C speed, and the same bounds on the value ---------------------------------------------------

def test_json_goes_through_json_parse_with_the_same_bounds():
    assert document_parse(' {"a": [1, {"b": null}]}', max_bytes=MIB, max_nodes=NODES) == {"a": [1, {"b": None}]}
    with pytest.raises(ValueError, match=f"nested at most {DEPTH} levels"):
        document_parse('{"x": ' + "[" * (ROOM // 2) + "]" * (ROOM // 2) + "}", max_bytes=MIB, max_nodes=NODES)
    with pytest.raises(ValueError, match=f"at most {NODES} values"):
        document_parse('{"x": [' + "1," * (ROOM // 2) + "1]}", max_bytes=MIB, max_nodes=NODES)


def test_json_node_bound_stops_before_looking_at_the_members(monkeypatch):
    looked = []
    real = json_values._character_problem
    monkeypatch.setattr(json_values, "_character_problem", lambda text: looked.append(text) or real(text))
    with pytest.raises(ValueError, match="at most 10 values"):
        json_parse('["' + '","'.join(["a"] * 100_000) + '"]', max_nodes=10)
    assert looked == []  # refused on the list's length, before its 100,000 strings were checked
    with pytest.raises(ValueError, match="at most 10 values"):
        json_parse('{"a": {"b": {"c": 1, "d": 2, "e": 3, "f": 4}}, "g": 5}', max_nodes=10)
    assert json_parse('{"a": [1, 2, 3]}', max_nodes=6) == {"a": [1, 2, 3]}  # object, key, list, three values
    with pytest.raises(ValueError, match="at most 5 values"):
        json_parse('{"a": [1, 2, 3]}', max_nodes=5)
    assert json_parse("[" * 10 + "]" * 10) == [[[[[[[[[[]]]]]]]]]]  # no bound unless asked
