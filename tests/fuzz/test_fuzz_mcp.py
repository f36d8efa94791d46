"""Hypothesis fuzzes `/mcp/` with JSON-RPC messages, well-formed and not, in both protocol eras the SDK speaks.

The server is the package's live embedded server (`fuzz_server`, shared with the REST fuzz), in a tenant of
its own, so what the REST fuzz changes in the demo tenant (limits, rules, tools) is not met here. A 2025-era
client opens with `initialize` and names the session it got in `Mcp-Session-Id` on every later message; a
2026-era client sends the protocol version and the method in headers (`mcp-protocol-version`, `mcp-method`,
`mcp-name`) and its envelope in `params._meta`, for the key's session of the agent it names.

One run, deterministic (derandomized, a bounded number of examples, no example database, no shrinking),
sends a fixed set of edge cases and then generated messages: not JSON, truncated, of the wrong top-level type
(scalars, arrays, batches), with each field of the wrong type, unknown methods, values nested past 64 levels,
long strings, many keys, NUL characters and lone surrogates, NaN. Every answer is checked and every problem
kept, so each test below lists all the problems of its kind with a request that shows each:

- no answer is a server error;
- every answer is JSON-RPC (for a request with a usable id, an answer with that id) with error codes in
  JSON-RPC's ranges, or one of the HTTP refusals `/mcp/` documents, in the API's error envelope;
- no answer carries internal text (a traceback, SQL, a database's error, the names of the database drivers or
  of Django's modules) that the request did not;
- a `tools/call` whose arguments hold a value no entry takes (docs/notes/entry-and-admission.md,
  "Request bodies and JSON
  values": NUL, a lone surrogate, NaN or Infinity, nesting past 64 levels) is refused with JSON-RPC's invalid
  params (-32602), or, when its body is no UTF-8 at all, as a parse error (-32700), and nothing of it is
  stored: such calls speak for an agent of their own, which must end the run without a call or an approval
  request.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from mcp.shared.inbound import encode_header_value
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY
from mcp_types.jsonrpc import INVALID_PARAMS, PARSE_ERROR
from mcp_types.version import LATEST_HANDSHAKE_VERSION, LATEST_MODERN_VERSION

pytestmark = [pytest.mark.live, pytest.mark.xdist_group("fuzz")]

TENANT = "mcp-fuzz"
AGENT = "fuzz-mcp"
REFUSED_AGENT = "fuzz-refused"  # speaks only the tools/call messages that must be refused
ERAS = ("2025", "2026")
SEED = 20260101  # with derandomize: the same messages on every run
EXAMPLES_PER_ERA = 120
MAX_DEPTH = 64  # common.json_values.MAX_JSON_DEPTH, as the docs state it
REQUEST_TIMEOUT_S = 60
# Daphne (Twisted) drops a connection whose header line passes 16 KiB, unanswered, before /mcp/ sees it: a 2026-era
# header that would carry a longer value (the method, a name) is left out, and the body's value meets the protocol.
HEADER_MAX = 8192
CLIENT_INFO = {"name": "fuzz", "version": "1"}
# HTTP refusals of /mcp/ in the API's error envelope: a bad request before the protocol (no agent), the key,
# its scope or the host, a session that is not the key's, a body over the limit, a rate limit.
ENVELOPE_STATUSES = {400, 401, 403, 404, 413, 429}
INTERNAL_TEXT = ("Traceback", 'File "/', "INSERT INTO", "SELECT ", "UPDATE ", "psycopg", "sqlite3", "django.",
                 "IntegrityError", "OperationalError", "DataError", "ProgrammingError", "constraint failed",
                 "violates ", "DETAIL: ")
# The words of a pydantic validation error: the SDK's own parsing of the message, not an answer for a client.
VALIDATOR_TEXT = ("errors.pydantic.dev", "validation error for", "validation errors for", "input_value=")


# --- the messages --------------------------------------------------------------------------------------

KNOWN_METHODS = ["initialize", "ping", "tools/list", "tools/call", "resources/list", "resources/read",
                 "resources/templates/list", "server/discover", "notifications/initialized",
                 "notifications/cancelled", "notifications/progress", "prompts/list", "completion/complete",
                 "logging/setLevel", "sampling/createMessage", "tasks/list"]
URI_METHODS = ("resources/read", "resources/subscribe", "resources/unsubscribe")
WRONG_TYPED = st.one_of(st.none(), st.booleans(), st.floats(), st.lists(st.integers(), max_size=2),
                        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
UNSTORABLE_TEXT = st.sampled_from(["\x00", "a\x00b", "\ud800", "tail \udfff", "\udc00\ud800"])
TEXT = st.one_of(st.text(max_size=24), st.sampled_from(["", " ", "\U0001f600", "\u202e", "\udbff\udfff", "%s%n",
                                                        "{{7*7}}", "../../etc/passwd", "\\u0000"]))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from([2**63, -(2**63) - 1, 10**40]),
                    st.floats(allow_nan=False, allow_infinity=False), TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                    max_leaves=12)


def nested(depth: int, leaf="x"):
    """A value `depth` containers deep, lists and objects in turn."""
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


# Arguments holding one value no entry takes, somewhere.
UNSTORABLE_ARGUMENTS = st.one_of(
    st.tuples(TEXT, UNSTORABLE_TEXT).map(lambda pair: {"timezone": pair[0] + pair[1]}),
    UNSTORABLE_TEXT.map(lambda text: {text: "key"}),
    UNSTORABLE_TEXT.map(lambda text: {"todos": [{"content": text, "status": "pending"}]}),
    st.sampled_from([math.nan, math.inf, -math.inf]).map(lambda number: {"n": number}),
    st.integers(MAX_DEPTH + 1, 400).map(lambda depth: {"deep": nested(depth)}),
)


HUGE = st.one_of(
    st.integers(1_000, 200_000).map(lambda n: {"timezone": "x" * n}),
    st.integers(100, 20_000).map(lambda n: {f"k{i}": i for i in range(n)}),
    st.integers(1_000, 20_000).map(lambda n: {"list": list(range(n))}),
    st.integers(MAX_DEPTH - 10, MAX_DEPTH).map(lambda depth: {"deep": nested(depth - 1)}),  # at the bound
)
ARGUMENTS = st.one_of(st.dictionaries(TEXT, JSON, max_size=4), st.just({}), st.just({"timezone": "UTC"}),
                      HUGE, WRONG_TYPED, st.text(max_size=5))
CLEAN_TOOL_NAMES = st.one_of(st.sampled_from(["current_time", "no_such_tool", "", "a" * 300]), TEXT, WRONG_TYPED)
# Tools the session has: one that runs, one that asks a reviewer (a refused call must open no request).
REFUSED_TOOL_NAMES = st.sampled_from(["current_time", "todo_write"])


def params_for(method, draw) -> object:
    if method == "tools/call":
        if draw(st.integers(0, 2)) == 0:
            return {"name": draw(REFUSED_TOOL_NAMES), "arguments": draw(UNSTORABLE_ARGUMENTS)}
        return {"name": draw(CLEAN_TOOL_NAMES), "arguments": draw(ARGUMENTS)}
    if method == "initialize":
        return {"protocolVersion": draw(st.sampled_from([LATEST_HANDSHAKE_VERSION, "1999-01-01"]) | JSON),
                "capabilities": draw(st.just({}) | JSON), "clientInfo": draw(st.just(CLIENT_INFO) | JSON)}
    if method == "resources/read":
        return {"uri": draw(st.sampled_from(["skill://x/SKILL.md", "file:///etc/passwd"]) | TEXT | WRONG_TYPED)}
    if method == "notifications/cancelled":
        return {"requestId": draw(st.integers() | TEXT | WRONG_TYPED), "reason": draw(TEXT)}
    return draw(st.dictionaries(TEXT, JSON, max_size=3))


@st.composite
def messages(draw):
    """A JSON-RPC message, mostly well-formed, with at most a field or two of the wrong type or missing."""
    kind = draw(st.sampled_from(["call"] * 3 + ["known"] * 3 + ["text", "wrong"]))
    method = "tools/call" if kind == "call" else draw(
        st.sampled_from(KNOWN_METHODS) if kind == "known" else TEXT if kind == "text" else WRONG_TYPED)
    message = {"jsonrpc": "2.0", "id": draw(st.integers(0, 2**31) | TEXT), "method": method,
               "params": params_for(method, draw)}
    for name in draw(st.lists(st.sampled_from(["jsonrpc", "id", "method", "params"]), max_size=2, unique=True)):
        if draw(st.booleans()):
            del message[name]
        elif name == "jsonrpc":
            message[name] = draw(st.sampled_from(["1.0", "2", "", "2.0\x00", 2, 2.0]) | WRONG_TYPED)
        elif name == "id":
            message[name] = draw(st.sampled_from([1.5, -1, 10**40, "", "\x00", True]) | WRONG_TYPED)
        elif name == "params":
            message[name] = draw(WRONG_TYPED | st.text(max_size=5) | st.just([]))
        else:
            message[name] = draw(WRONG_TYPED | UNSTORABLE_TEXT | st.just("x" * 10_000))
    return message


@dataclass
class Case:
    era: str
    body: bytes
    headers: dict = field(default_factory=dict)
    label: str = "generated"

    @property
    def message(self):
        """The message as the server reads the body, or None when the body is no JSON."""
        try:
            return json.loads(self.body)
        except (ValueError, RecursionError):
            return None

    @property
    def request_id(self):
        """The id the answer must carry: a request's string or integer id; None for anything else."""
        message = self.message
        identifier = message.get("id") if isinstance(message, dict) else None
        return identifier if isinstance(identifier, str | int) and not isinstance(identifier, bool) else None

    @property
    def unstorable_arguments(self) -> bool:
        """A tools/call whose arguments hold a value no entry takes."""
        message = self.message
        params = message.get("params") if isinstance(message, dict) else None
        if not (isinstance(message, dict) and message.get("method") == "tools/call" and isinstance(params, dict)
                and "arguments" in params):
            return False
        return value_problem(params["arguments"])

    @property
    def must_be_refused(self) -> bool:
        """Unstorable arguments in an otherwise well-formed request: refused with invalid params, whatever else."""
        message = self.message
        return (self.unstorable_arguments and message.get("jsonrpc") == "2.0" and self.request_id is not None
                and isinstance(message["params"].get("name"), str))

    def reproduction(self) -> str:
        shown = self.body[:300].decode("utf-8", "backslashreplace")
        more = f"… ({len(self.body)} bytes)" if len(self.body) > 300 else ""
        headers = " ".join(f"-H '{name}: {value[:80]}{'…' if len(value) > 80 else ''}'"
                           for name, value in self.headers.items())
        return f"[{self.era}, {self.label}] POST /mcp/ {headers} --data '{shown}{more}'"


def value_problem(value) -> bool:
    """Whether `value` holds what no entry takes: NUL or a lone surrogate in a string or key, a number that
    is not finite, nesting past MAX_DEPTH levels (the value itself is the first)."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list) and depth > MAX_DEPTH:
            return True
        members = [*item, *item.values()] if isinstance(item, dict) else item if isinstance(item, list) else [item]
        for member in members:
            if isinstance(member, str) and ("\x00" in member or any(0xD800 <= ord(c) <= 0xDFFF for c in member)):
                return True
            if isinstance(member, float) and not math.isfinite(member):
                return True
            if isinstance(member, dict | list):
                pending.append((member, depth + 1))
    return False


# --- the two eras ----------------------------------------------------------------------------------------

ENVELOPE = {PROTOCOL_VERSION_META_KEY: LATEST_MODERN_VERSION, CLIENT_CAPABILITIES_META_KEY: {},
            CLIENT_INFO_META_KEY: CLIENT_INFO}


def _header(value) -> str | None:
    """The header value a client sends for a body value, or None where it sends none (not text, a lone
    surrogate that no header can carry, too long)."""
    try:
        encoded = encode_header_value(value) if isinstance(value, str) else None
    except UnicodeEncodeError:
        return None
    return encoded if encoded is not None and len(encoded) <= HEADER_MAX else None


class Eras:
    """How each era's client sends a message: the headers (and the 2026 envelope) around it."""

    def __init__(self, sessions: dict[str, str]):
        self.sessions = sessions  # agent → the session its 2025-era connection opened

    def case(self, era: str, message, *, label: str = "generated", encoding: str = "json") -> Case:
        agent = REFUSED_AGENT if Case(era, _encode(message, "json")).unstorable_arguments else AGENT
        if era == "2025":
            headers = {"Mcp-Session-Id": self.sessions[agent], "Mcp-Protocol-Version": LATEST_HANDSHAKE_VERSION}
        else:
            if isinstance(message, dict) and isinstance(message.get("params"), dict):
                message = {**message, "params": {"_meta": ENVELOPE, **message["params"]}}
            headers = {"Mcp-Protocol-Version": LATEST_MODERN_VERSION, "X-Toolkeeper-Agent": agent}
            method = message.get("method") if isinstance(message, dict) else None
            params = message.get("params") if isinstance(message, dict) else None
            for name, value in (("Mcp-Method", method), ("Mcp-Name", _name_of(method, params))):
                if _header(value) is not None:
                    headers[name] = _header(value)
        return Case(era, _encode(message, encoding), headers, label)

    def raw(self, era: str, body: bytes, label: str) -> Case:
        if era == "2025":
            headers = {"Mcp-Session-Id": self.sessions[AGENT], "Mcp-Protocol-Version": LATEST_HANDSHAKE_VERSION}
        else:
            headers = {"Mcp-Protocol-Version": LATEST_MODERN_VERSION, "Mcp-Method": "tools/call",
                       "X-Toolkeeper-Agent": AGENT}
        return Case(era, body, headers, label)


def _name_of(method, params):
    if not isinstance(params, dict):
        return None
    return params.get("name") if method == "tools/call" else params.get("uri") if method in URI_METHODS \
        else None


def _is_utf8(body: bytes) -> bool:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _encode(message, encoding: str) -> bytes:
    if encoding == "utf-8":  # raw UTF-8; a lone surrogate becomes bytes no UTF-8 decoder takes
        return json.dumps(message, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return json.dumps(message).encode()


def edge_cases(eras: Eras, era: str) -> list[Case]:
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "current_time", "arguments": {}}}
    whole = _encode(call, "json")

    def calling(arguments, name="current_time") -> dict:
        return {**call, "params": {"name": name, "arguments": arguments}}

    deep_text = b"[" * 5000 + b"1" + b"]" * 5000
    cases = [eras.raw(era, body, label) for body, label in [
        (b"", "empty body"), (b"{not json", "not JSON"), (b"\xff\xfe\x00", "binary"),
        (whole[:len(whole) // 2], "truncated"), (whole[:-1], "truncated by one"),
        (b"null", "null"), (b"3", "a number"), (b'"tools/call"', "a string"), (b"true", "a boolean"),
        (b"[]", "an empty batch"), (b"[1, 2]", "a batch of numbers"), (b"[" + whole + b"," + whole + b"]", "a batch"),
        (b"{}", "an empty object"), (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"a": "\xff"}}',
                                     "invalid UTF-8 in a string"),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"a": ' + deep_text + b"}}",
         "5000 levels in params"),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "current_time", "arguments": '
         b'{"a": ' + deep_text + b"}}}", "5000 levels in arguments"),
        (b'{"jsonrpc": "2.0", "id": 1, "id": 2, "method": "tools/list"}', "the id twice"),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "current_time", "arguments": '
         b'{"n": NaN}}}', "NaN in arguments"),
    ]]
    cases += [eras.case(era, message, label=label) for message, label in [
        (calling({"timezone": "U\x00TC"}), "NUL in an argument"),
        (calling({"time\x00zone": "UTC"}), "NUL in an argument's name"),
        (calling({"todos": [{"content": "\x00", "status": "pending"}]}, "todo_write"), "NUL in a write call"),
        (calling({"timezone": "\ud800"}), "a lone surrogate in an argument"),
        (calling({"deep": nested(MAX_DEPTH + 1)}), "65 levels in arguments"),
        (calling({"deep": nested(MAX_DEPTH + 1)}, "todo_write"), "65 levels in a write call"),
        (calling({"n": math.inf}), "Infinity in arguments"),
        (calling({"timezone": "x" * 500_000}), "a long string"),
        (calling({f"k{i}": i for i in range(30_000)}), "many keys"),
        (calling({"timezone": "UTC"}, name="\x00"), "NUL in a tool name"),
        ({**call, "method": "tools/\x00call"}, "NUL in the method"),
        ({**call, "id": "\x00"}, "NUL in the id"),
        ({**call, "id": "\ud800"}, "a lone surrogate in the id"),
        ({**call, "id": 10**40}, "a huge id"),
        ({**call, "id": 1.5}, "a fractional id"),
        ({**call, "id": None}, "a null id"),
        ({**call, "jsonrpc": "1.0"}, "JSON-RPC 1.0"),
        ({**call, "method": "tools/explode"}, "an unknown method"),
        *((({**call, "method": method, "params": {"uri": uri}}, f"{method} {label}") for method in URI_METHODS[1:]
           for uri, label in (("skill://x/SKILL.md", "of no resource"), ("skill://x/\x00", "with NUL"),
                              ("skill://" + "x" * 100_000, "of a long URI"), (["skill://x/SKILL.md"], "of a list"),
                              (None, "of null"), ("skill://[x/SKILL.md", "of no URI")))),
        ({**call, "method": "x" * 100_000}, "a long method"),
        ({**call, "params": []}, "params as an array"),
        ({**call, "params": {"name": "current_time", "arguments": []}}, "arguments as an array"),
        ({"jsonrpc": "2.0", "id": 8, "result": {}}, "a response from the client"),
        ({"jsonrpc": "2.0", "id": 8, "error": {"code": -1, "message": "no"}}, "an error from the client"),
        ({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}, "a cancel"),
        ({"jsonrpc": "2.0", "method": "notifications/whatever"}, "an unknown notification"),
    ]]
    cases.append(eras.case(era, calling({"timezone": "\ud800"}), label="a raw lone surrogate", encoding="utf-8"))
    return cases


@st.composite
def generated_cases(draw, eras: Eras, era: str):
    shape = draw(st.sampled_from(["message"] * 6 + ["raw utf-8", "truncated", "not JSON", "top level", "batch"]))
    if shape == "message":
        return eras.case(era, draw(messages()))
    if shape == "raw utf-8":
        return eras.case(era, draw(messages()), label="raw UTF-8", encoding="utf-8")
    if shape == "truncated":
        body = _encode(draw(messages()), "json")
        return eras.raw(era, body[:draw(st.integers(0, max(0, len(body) - 1)))], "truncated")
    if shape == "not JSON":
        return eras.raw(era, draw(st.binary(max_size=64) | st.text(max_size=64).map(str.encode)), "not JSON")
    if shape == "top level":
        return eras.raw(era, _encode(draw(SCALARS), "json"), "a scalar")
    return eras.raw(era, _encode(draw(st.lists(messages() | SCALARS, max_size=3)), "json"), "a batch")


# --- the answers ----------------------------------------------------------------------------------------

@dataclass
class Problem:
    kind: str
    what: str
    case: Case
    status: int | None = None
    answer: str = ""

    def describe(self) -> str:
        return f"{self.kind}: {self.what}\n    {self.case.reproduction()}\n    → {self.status} {self.answer[:300]}"


def _events(text: str) -> list[str]:
    """The data of each event of a `text/event-stream` body; a priming event (an id and empty data, which opens a
    resumable stream: docs/mcp.md, "Streams") carries no message."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = block.split("\n")
        data = [line[5:].lstrip(" ") for line in lines if line.startswith("data:")]
        if data == [""] and any(line.startswith("id:") and line[3:].strip() for line in lines):
            continue
        if data:
            events.append("\n".join(data))
    return events


def _same_id(left, right) -> bool:
    return type(left) is type(right) and left == right


def rpc_problem(message, case: Case) -> str | None:
    """What is wrong with one JSON-RPC message the server sent, or None."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return "not a JSON-RPC 2.0 message"
    if "method" in message:  # a notification on the stream (progress, list changed)
        return None if isinstance(message["method"], str) and "id" not in message else "a request to the client"
    if ("result" in message) == ("error" in message) or "id" not in message:
        return "a response needs an id and exactly one of result and error"
    if "error" in message:
        error = message["error"]
        if not (isinstance(error, dict) and isinstance(error.get("message"), str)
                and isinstance(error.get("code"), int) and not isinstance(error.get("code"), bool)):
            return "an error needs an integer code and a message"
        code = error["code"]
        if not (code in (-32700, -32600, -32601, -32602, -32603) or -32099 <= code <= -32000):
            return f"the error code {code} is outside JSON-RPC's ranges"
        if message["id"] is not None and not _same_id(message["id"], case.request_id):
            return f"the error answers the id {message['id']!r}, not {case.request_id!r}"
        return None
    if case.request_id is None or not _same_id(message["id"], case.request_id):
        return f"a result for the id {message['id']!r}, not {case.request_id!r}"
    return None


def answer_problems(case: Case, status: int, content_type: str, text: str) -> tuple[list[str], list]:
    """What is wrong with an answer's form, and the JSON-RPC messages it carries."""
    if status == 202:
        return ([] if not text.strip() else ["202 with a body"]), []
    if content_type.startswith("text/event-stream"):
        try:
            sent = [json.loads(data) for data in _events(text)]
        except ValueError:
            return ["an event that is not JSON"], []
        problems = [problem for problem in (rpc_problem(message, case) for message in sent) if problem]
        answers = [message for message in sent if isinstance(message, dict) and "method" not in message]
        if len(answers) != 1:
            problems.append(f"{len(answers)} answers on the stream, not one")
        return problems, sent
    if content_type.startswith("application/json"):
        try:
            value = json.loads(text)
        except ValueError:
            return ["a JSON answer that is not JSON"], []
        if isinstance(value, dict) and "jsonrpc" in value:
            problem = rpc_problem(value, case)
            return ([problem] if problem else []), [value]
        error = value.get("error") if isinstance(value, dict) else None
        if (isinstance(error, dict) and isinstance(error.get("code"), str) and isinstance(error.get("message"), str)
                and isinstance(error.get("fields"), dict)):
            return ([] if status in ENVELOPE_STATUSES else [f"the error envelope with {status}"]), []
        return ["JSON that is neither JSON-RPC nor the API's error envelope"], []
    return [f"a {content_type or 'untyped'} answer, neither JSON-RPC nor the API's error envelope"], []


@dataclass
class FuzzRun:
    problems: list[Problem] = field(default_factory=list)
    sent: dict = field(default_factory=dict)  # (era, what) → how many
    stored: dict = field(default_factory=dict)

    def count(self, era: str, what: str) -> None:
        self.sent[(era, what)] = self.sent.get((era, what), 0) + 1

    def of_kind(self, kind: str) -> list[Problem]:
        return [problem for problem in self.problems if problem.kind == kind]


def check(run: FuzzRun, client: httpx.Client, case: Case) -> None:
    run.count(case.era, "requests")
    try:
        response = client.post("/mcp/", content=case.body, headers=case.headers)
    except httpx.HTTPError as exc:
        run.problems.append(Problem("no answer", f"{type(exc).__name__}", case))
        return
    text = response.content.decode("utf-8", "replace")
    status, content_type = response.status_code, response.headers.get("content-type", "")

    def problem(kind: str, what: str) -> None:
        run.problems.append(Problem(kind, what, case, status, text))

    if status >= 500:
        problem("server error", f"{status}")
    sent_text = case.body.decode("utf-8", "replace")
    for marker in INTERNAL_TEXT:
        if marker in text and marker not in sent_text:
            problem("internal text", repr(marker))
    for marker in VALIDATOR_TEXT:
        if marker in text and marker not in sent_text:
            problem("validator text", repr(marker))
    form, messages = answer_problems(case, status, content_type, text)
    for what in form:
        problem("not JSON-RPC", what)
    codes = [m["error"].get("code") for m in messages if isinstance(m, dict) and isinstance(m.get("error"), dict)]
    if any(isinstance(m, dict) and "result" in m for m in messages):
        run.count(case.era, "results")
    if any(isinstance(m, dict) and m.get("id") is not None and _same_id(m["id"], case.request_id) for m in messages):
        run.count(case.era, "answers for the request's id")
    if case.unstorable_arguments:
        run.count(case.era, "unstorable arguments")
    # a body no UTF-8 decoder takes is no JSON text at all (RFC 8259): a parse error refuses it as well
    refusals = [[INVALID_PARAMS]] if _is_utf8(case.body) else [[INVALID_PARAMS], [PARSE_ERROR]]
    if case.must_be_refused and codes not in refusals:
        problem("unstorable arguments taken", f"answered {status} with the codes {codes}, not one of {refusals}")


# --- the run --------------------------------------------------------------------------------------------

SETUP = f"""
import json
from tenancy.services import apikey_create, tenant_create
tenant = tenant_create(slug={TENANT!r}, name="MCP fuzz")
print(json.dumps({{"key": apikey_create(tenant=tenant, name="mcp-fuzz", scopes=["agent"]).key}}))
"""
STORED = f"""
import json
from approvals.models import ApprovalRequest
from common.json_values import json_problem
from tools.models import ToolCall
calls = ToolCall.all_tenants.filter(tenant__slug={TENANT!r})
print(json.dumps({{
    "calls of the refused agent": [c.tool_name for c in calls.filter(session__agent={REFUSED_AGENT!r})],
    "approvals of the refused agent": ApprovalRequest.all_tenants.filter(
        tenant__slug={TENANT!r}, agent={REFUSED_AGENT!r}).count(),
    "calls with unstorable input": [c.tool_name for c in calls if json_problem(c.input)],
    "calls": calls.count(),
}}))
"""


def _manage_json(server, code: str) -> dict:
    return json.loads(server.manage("shell", "-c", code).strip().splitlines()[-1])


def _open_session(client: httpx.Client, agent: str) -> str:
    response = client.post("/mcp/", headers={"X-Toolkeeper-Agent": agent}, json={
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": LATEST_HANDSHAKE_VERSION, "capabilities": {}, "clientInfo": CLIENT_INFO}})
    assert response.status_code == 200, response.text
    return response.headers["mcp-session-id"]


def mcp_fuzz_run(server) -> FuzzRun:
    """The whole run against a live server (`tests.live.server.LiveServer`) that has no tenant TENANT yet."""
    key = _manage_json(server, SETUP)["key"]
    run = FuzzRun()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=REQUEST_TIMEOUT_S) as client:
        eras = Eras({agent: _open_session(client, agent) for agent in (AGENT, REFUSED_AGENT)})
        for number, era in enumerate(ERAS):
            for case in edge_cases(eras, era):
                check(run, client, case)

            @seed(SEED + number)
            @settings(max_examples=EXAMPLES_PER_ERA, derandomize=True, database=None, deadline=None,
                      phases=[Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=generated_cases(eras, era))
            def fuzz_era(case):
                check(run, client, case)

            fuzz_era()
    run.stored = _manage_json(server, STORED)
    return run


@pytest.fixture(scope="module")
def mcp_fuzz(fuzz_server) -> FuzzRun:
    return mcp_fuzz_run(fuzz_server)


def _listed(problems: list[Problem]) -> str:
    return "\n".join(problem.describe() for problem in problems)


def test_the_fuzz_reached_the_protocol_in_both_eras(mcp_fuzz):
    for era in ERAS:
        assert mcp_fuzz.sent.get((era, "requests"), 0) >= EXAMPLES_PER_ERA, mcp_fuzz.sent
        # Requests got past the parsing to the protocol's handlers, and some of them through.
        assert mcp_fuzz.sent.get((era, "answers for the request's id"), 0) >= 40, mcp_fuzz.sent
        assert mcp_fuzz.sent.get((era, "results"), 0) >= 5, mcp_fuzz.sent
        assert mcp_fuzz.sent.get((era, "unstorable arguments"), 0) >= 10, mcp_fuzz.sent
    assert mcp_fuzz.stored["calls"] > 0  # calls with fine arguments were stored


def test_no_message_gets_a_server_error(mcp_fuzz):
    problems = mcp_fuzz.of_kind("server error") + mcp_fuzz.of_kind("no answer")
    assert not problems, _listed(problems)


def test_every_answer_is_json_rpc_or_a_documented_refusal(mcp_fuzz):
    problems = mcp_fuzz.of_kind("not JSON-RPC")
    assert not problems, _listed(problems)


def test_no_answer_carries_internal_text(mcp_fuzz):
    problems = mcp_fuzz.of_kind("internal text")
    assert not problems, _listed(problems)


def test_no_answer_carries_the_validators_text(mcp_fuzz):
    problems = mcp_fuzz.of_kind("validator text")
    assert not problems, _listed(problems)


def test_unstorable_arguments_are_refused_with_invalid_params(mcp_fuzz):
    problems = mcp_fuzz.of_kind("unstorable arguments taken")
    assert not problems, _listed(problems)


def test_refused_calls_leave_nothing_stored(mcp_fuzz):
    stored = mcp_fuzz.stored
    assert stored["calls of the refused agent"] == [], stored
    assert stored["approvals of the refused agent"] == 0, stored
    assert stored["calls with unstorable input"] == [], stored
