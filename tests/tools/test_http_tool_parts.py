"""The parts of an HTTP tool (tools.http_tools.services) one by one, at their edges: filling the templates, the
request a call makes, hiding secrets, how a status, a body or a client's exception becomes the result or the error, and
the checks of a definition with their exact messages and bounds. The calls end to end: test_http_tools.py."""
import json
import socket
import threading
import time
from types import SimpleNamespace

import httpx2
import pytest
from cryptography.fernet import Fernet
from django.test import override_settings

from audit.models import Event
from common.errors import ServiceError
from common.outbound import OutboundRefused, ResponseTooLarge
from tools.http_tools import services as ht
from tools.models import HttpEndpoint, Tool
from tools.python.decorators import CallCancelled, ToolError
from tools.python.isolation import CallStop


def endpoint(**fields) -> HttpEndpoint:
    return HttpEndpoint(**{"method": "GET", "url_template": "https://api.example/x", "query": {}, "body": None,
                           "headers": {}, "response": {}, **fields})


# --- filling the templates -----------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "text"), [
    ("plain", "plain"), (None, ""), (3, "3"), (True, "true"), (1.5, "1.5"),
    ({"a": "é", "b": [1, 2]}, '{"a":"é","b":[1,2]}'),  # compact, not escaped to ASCII
])
def test_a_value_as_text(value, text):
    assert ht._text(value) == text


@pytest.mark.parametrize(("value", "segment"), [
    ("a/b?c#d%e f", "a%2Fb%3Fc%23d%25e%20f"), (".", "%2E"), ("..", "%2E%2E"), ("...", "..."), ("a.b", "a.b"),
    (None, ""), (7, "7"),
])
def test_a_value_as_one_segment_of_the_url(value, segment):
    assert ht._segment(value) == segment


def test_interpolation_fills_every_placeholder_or_is_missing():
    assert ht._interpolate("x/{a}/{b}", {"a": 1, "b": "z/y"}) == "x/1/z/y"
    assert ht._interpolate("x/{a}/{b}", {"a": 1, "b": "z/y"}, encode=ht._segment) == "x/1/z%2Fy"
    assert ht._interpolate("x/{a}/{b}", {"a": 1}) is ht.MISSING  # one absent is the whole missing
    assert ht._interpolate("no placeholders", {}) == "no placeholders"
    assert ht._interpolate("{a}", {"a": None}) == ""  # given as null is given


def test_a_json_template_keeps_types_and_leaves_out_what_is_missing():
    template = {"n": "{n}", "t": "n={n}", "gone": "{absent}", "half": "{n} {absent}", "fixed": 2,
                "list": ["{n}", "{absent}", None, {"in": "{s}"}]}
    assert ht._fill_json(template, {"n": 3, "s": "x"}) == {"n": 3, "t": "n=3", "fixed": 2,
                                                          "list": [3, None, {"in": "x"}]}
    assert ht._fill_json("{absent}", {}) is ht.MISSING
    assert ht._fill_json(False, {}) is False


def test_placeholders_are_found_in_keys_values_and_lists():
    template = {"{k}": "{v} and {secret:s}", "n": ["{w}", 3, {"x": "{secret:t}"}], "plain": "text"}
    assert ht._placeholders(template) == [(False, "k"), (False, "v"), (True, "s"), (False, "w"), (True, "t")]
    assert ht._placeholders(7) == []
    assert ht._argument_names(template) == {"k", "v", "w"}


# --- the request a call makes ------------------------------------------------------------------------

def test_a_missing_url_argument_is_named():
    with pytest.raises(ToolError) as one:
        ht.request_of(endpoint(url_template="https://h/{a}/{b}"), {"b": 1}, {})
    assert str(one.value) == "the URL needs the argument a" and one.value.error_type == "InvalidInput"
    with pytest.raises(ToolError) as two:
        ht.request_of(endpoint(url_template="https://h/{b}/{a}/{c}"), {"c": 1}, {})
    assert str(two.value) == "the URL needs the arguments a, b"


def test_the_query_follows_the_urls_own_and_repeats_for_a_list():
    request = ht.request_of(endpoint(url_template="https://h/s?v=1", query={
        "q": "{text}", "tag": "{tags}", "page": "{page}", "fixed": "a b", "mixed": "t-{tags}"}),
        {"text": "x&y=z", "tags": ["a", 2], "extra": 1}, {})
    assert request["url"] == "https://h/s?v=1&q=x%26y%3Dz&tag=a&tag=2&fixed=a%20b&mixed=t-%5B%22a%22%2C2%5D"
    plain = ht.request_of(endpoint(url_template="https://h/s", query={"q": "{text}"}), {"text": "w"}, {})
    assert plain["url"] == "https://h/s?q=w"
    none = ht.request_of(endpoint(url_template="https://h/s", query={"q": "{text}"}), {}, {})
    assert none["url"] == "https://h/s"


def test_headers_take_the_secrets_and_get_sends_no_body():
    request = ht.request_of(endpoint(headers={"Authorization": "Bearer {secret:t}", "X-Other": "{secret:gone}",
                                              "X-Plain": "p"}), {"a": 1}, {"t": "s3cr3t"})
    assert request == {"method": "GET", "url": "https://api.example/x",
                       "headers": {"Authorization": "Bearer s3cr3t", "X-Other": "", "X-Plain": "p"}}
    for method in ("DELETE", "GET"):
        assert "json" not in ht.request_of(endpoint(method=method), {"a": 1}, {})


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH"])
def test_a_body_method_sends_the_template_or_the_unused_arguments(method):
    unused = ht.request_of(endpoint(method=method, url_template="https://h/{a}", query={"q": "{b}"}),
                           {"a": 1, "b": 2, "c": 3, "d": [4]}, {})
    assert unused["json"] == {"c": 3, "d": [4]} and unused["method"] == method
    templated = ht.request_of(endpoint(method=method, body={"n": "{c}"}), {"c": 3}, {})
    assert templated["json"] == {"n": 3}
    absent = ht.request_of(endpoint(method=method, body="{c}"), {}, {})
    assert absent["json"] is None


# --- keeping secrets out of what is shown --------------------------------------------------------------

def test_each_form_of_a_secret_is_hidden_longest_first():
    forms = ht._secret_forms({"a": 'ab"c/d', "short": "abc", "n": 12345, "b": "wxyz"})
    assert forms == ['ab%22c%2Fd', 'ab\\"c/d', 'ab"c/d', "wxyz"]
    assert ht._secret_forms(None) == [] and ht._secret_forms({"four": "abcd"}) == ["abcd"]
    shown = {"k ab\"c/d": ['x ab%22c%2Fd', 'ab\\"c/d', 5, None], "n": 1.5}
    assert ht.scrub(shown, forms) == {"k [hidden]": ["x [hidden]", "[hidden]", 5, None], "n": 1.5}
    assert ht.scrub("wxyzwxyz", forms) == "[hidden][hidden]"


def test_an_excerpt_is_one_printable_line_of_bounded_length():
    assert ht._excerpt("a\x00b\n\n c\td  ", []) == "a b c d"
    assert ht._excerpt("token wxyz", ["wxyz"]) == "token [hidden]"
    exact = "x" * ht.EXCERPT_MAX
    assert ht._excerpt(exact, []) == exact
    cut = ht._excerpt(exact + "y", [])
    assert cut == "x" * (ht.EXCERPT_MAX - 1) + "…" and len(cut) == ht.EXCERPT_MAX


# --- from an answer or an exception to the result or the error -----------------------------------------

def wrapped(exc: BaseException, times: int) -> BaseException:
    for level in range(times):
        outer = RuntimeError(f"level {level}")
        if level % 2:
            outer.__cause__ = exc
        else:
            outer.__context__ = exc
        exc = outer
    return exc


def test_the_guards_refusal_is_found_inside_ten_wrappers_at_most():
    refusal = OutboundRefused("that address is private")
    assert ht._refusal(refusal) is refusal
    assert ht._refusal(wrapped(refusal, 9)) is refusal
    assert ht._refusal(wrapped(refusal, 10)) is None
    assert ht._refusal(wrapped(ValueError("no"), 3)) is None


@pytest.mark.parametrize(("pointer", "found"), [
    ("", {"a/b": {"~c": [10, 20, {"d": None}]}, "e": 1}), ("/e", 1), ("/a~1b/~0c/1", 20), ("/a~1b/~0c/0", 10),
    ("/a~1b/~0c/2/d", None), ("/a~1b/~0c/01", ht.MISSING), ("/a~1b/~0c/3", ht.MISSING),
    ("/a~1b/~0c/-1", ht.MISSING), ("/e/x", ht.MISSING), ("/nope", ht.MISSING), ("/a~1b/~0c/x", ht.MISSING),
])
def test_a_json_pointer_names_a_part_or_nothing(pointer, found):
    document = {"a/b": {"~c": [10, 20, {"d": None}]}, "e": 1}
    assert ht._resolve_pointer(document, pointer) == found


@pytest.mark.parametrize(("status", "transient"), [(400, False), (404, False), (429, True), (500, False),
                                                    (501, False), (502, True), (503, True), (504, True)])
def test_an_error_status_fails_the_call(status, transient):
    with pytest.raises(ToolError) as caught:
        ht.result_of(status, "text/plain", b"went\nwrong wxyz", endpoint(), ["wxyz"])
    assert str(caught.value) == f"the endpoint answered HTTP {status}: went wrong [hidden]"
    assert caught.value.error_type == "HttpError" and caught.value.transient is transient
    with pytest.raises(ToolError) as bare:
        ht.result_of(status, "text/plain", b"", endpoint(), [])
    assert str(bare.value) == f"the endpoint answered HTTP {status}"


@pytest.mark.parametrize("status", [300, 302, 399])
def test_a_redirect_fails_the_call(status):
    with pytest.raises(ToolError) as caught:
        ht.result_of(status, "application/json", b"{}", endpoint(), [])
    assert str(caught.value) == f"the endpoint answered HTTP {status}, a redirect, which is not followed"
    assert caught.value.error_type == "HttpError" and not caught.value.transient


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=utf-8",
                                          "application/problem+json", " application/json ;q=1"])
def test_a_json_answer_is_structure(content_type):
    result = ht.result_of(299, content_type, b'{"k": "wxyz", "n": [1]}', endpoint(), ["wxyz"])
    assert result == {"state": "success", "content": [{"type": "text", "text": '{"k": "[hidden]", "n": [1]}'}],
                      "structured": {"k": "[hidden]", "n": [1]}}


@pytest.mark.parametrize(("content_type", "body"), [("text/plain", b'{"k": 1}'), ("application/jsonx", b'{"k": 1}'),
                                                    ("application/json", b'{"k": '), ("", b'{"k": 1}')])
def test_other_answers_are_text(content_type, body):
    assert ht.result_of(200, content_type, body, endpoint(), []) == {
        "state": "success", "content": [{"type": "text", "text": body.decode()}], "structured": None}


def test_an_empty_answer_is_no_content_and_a_json_text_stays_text():
    assert ht.result_of(204, "", b"", endpoint(), []) == {"state": "success", "content": [], "structured": None}
    assert ht.result_of(200, "application/json", b'"wxyz!"', endpoint(), ["wxyz"]) == {
        "state": "success", "content": [{"type": "text", "text": "[hidden]!"}], "structured": None}
    shaped = ht.result_of(200, "application/json", b'{"state": "error", "content": []}', endpoint(), [])
    assert shaped["state"] == "success" and shaped["structured"] == {"state": "error", "content": []}


def test_the_pointer_picks_the_part_or_fails_the_call():
    picked = ht.result_of(200, "application/json", b'{"data": {"items": [5]}}',
                          endpoint(response={"pointer": "/data/items"}), [])
    assert picked["structured"] == [5]
    with pytest.raises(ToolError) as caught:
        ht.result_of(200, "application/json", b'{"data": {}}', endpoint(response={"pointer": "/data/items"}), [])
    assert str(caught.value) == "the endpoint's answer has nothing at /data/items"
    assert caught.value.error_type == "HttpError" and not caught.value.transient
    text = ht.result_of(200, "text/plain", b"words", endpoint(response={"pointer": "/data"}), [])
    assert text["content"] == [{"type": "text", "text": "words"}]  # a pointer picks only from JSON


def test_a_json_answer_at_the_byte_bound_is_still_structure(monkeypatch):
    monkeypatch.setattr(ht, "ANSWER_JSON_MAX_BYTES", 10)
    assert ht.result_of(200, "application/json", b'[1,2,3,45]', endpoint(), [])["structured"] == [1, 2, 3, 45]
    assert ht.result_of(200, "application/json", b'[1,2,3,456]', endpoint(), [])["structured"] is None


@pytest.mark.parametrize(("exc", "error_type", "transient", "message"), [
    (wrapped(OutboundRefused("private wxyz"), 2), "OutboundRefused", False, "private [hidden]"),
    (httpx2.ReadTimeout("slow"), "TimedOut", True, "the endpoint did not answer in time"),
    (httpx2.ConnectError("refused wxyz"), "HttpUnavailable", True,
     "the endpoint could not be reached: refused [hidden]"),
    (httpx2.ConnectError(""), "HttpUnavailable", True, "the endpoint could not be reached: ConnectError"),
    (ResponseTooLarge("over 10 bytes"), "HttpError", False, "the endpoint's answer was refused: over 10 bytes"),
    (httpx2.InvalidURL("bad wxyz"), "HttpError", False, "the request could not be made: bad [hidden]"),
    (httpx2.DecodingError("gzip"), "HttpError", False, "the request could not be made: gzip"),
    (ValueError("v"), "HttpError", False, "the request could not be made: v"),
    (TypeError("t"), "HttpError", False, "the request could not be made: t"),
])
def test_a_clients_exception_becomes_the_calls_error(exc, error_type, transient, message):
    failure = ht._failure(exc, ["wxyz"])
    assert (failure.error_type, failure.transient, str(failure)) == (error_type, transient, message)


def test_an_unforeseen_exception_is_not_hidden():
    with pytest.raises(KeyError):
        ht._failure(KeyError("k"), [])


# --- the checks of a definition ------------------------------------------------------------------------

PUBLIC = "https://93.184.215.14"


def checked(check, *args) -> dict:
    errors: dict = {}
    check(*args, errors)
    return errors


@pytest.mark.parametrize(("url", "origin"), [
    ("HTTPS://Api.Example.COM:8443/x?y#z", "https://api.example.com:8443"), ("https://h", "https://h"),
    ("http://h?x", "http://h"), ("no scheme", ""), ("", ""), (None, ""),
])
def test_the_origin_of_a_url(url, origin):
    assert ht._origin(url) == origin


def test_placeholders_name_properties_or_stored_secrets_each_once():
    long = "p" * 70
    assert checked(ht._check_placeholders, "/{a}/{a}/{b}/{bad name}/{" + long + "}", "url", {"a", "b"}) == {
        "url": ["{bad name} names no property of the input schema", "{" + "p" * 60 + "} names no property of "
                "the input schema"]}
    assert checked(ht._check_placeholders, {"q": "{secret:t}"}, "query", {"t"}) == {
        "query": ["{secret:t}: secrets may be used in headers only"]}
    errors = {"headers": ["before"]}
    ht._check_placeholders({"A": "{secret:t} {secret:u} {x}"}, "headers", set(), errors, secrets={"t": "v"})
    assert errors == {"headers": ["before", "{secret:u} names no stored secret",
                                  "{x}: headers take secrets ({secret:NAME}), not arguments"]}
    assert checked(ht._check_placeholders, "/{a}", "url", {"a"}) == {}


@pytest.mark.parametrize(("url", "message"), [
    ("", "the endpoint's URL (http or https)"), (None, "the endpoint's URL (http or https)"),
    (7, "the endpoint's URL (http or https)"),
    (PUBLIC + "/" + "x" * (ht.URL_MAX - len(PUBLIC)), f"at most {ht.URL_MAX} characters"),
    ("/relative/{a}", "an absolute http or https URL"),
    ("https://{a}.example/x", "placeholders may stand in the path and the query, not in the scheme or the host"),
    ("https://h}/x", "placeholders may stand in the path and the query, not in the scheme or the host"),
    ("https://api{.example/x", "placeholders may stand in the path and the query, not in the scheme or the host"),
    (PUBLIC + "/x#frag", "the URL may not have a fragment"),
    (PUBLIC + "/{nope}", "{nope} names no property of the input schema"),
])
def test_a_refused_url_says_why(url, message):
    assert checked(ht._check_url, {"url": url}, {"a"}) == {"url": [message]}


def test_a_url_at_the_length_bound_with_placeholders_is_taken():
    url = PUBLIC + "/{a}?b={a}&" + "x" * (ht.URL_MAX - len(PUBLIC) - 11)
    assert len(url) == ht.URL_MAX
    assert checked(ht._check_url, {"url": url}, {"a"}) == {}


def test_the_guard_checks_the_url_with_its_placeholders_filled():
    errors = checked(ht._check_url, {"url": "http://127.0.0.1/{a}"}, {"a"})
    assert list(errors) == ["url"] and "loopback" in errors["url"][0]


def test_a_name_is_looked_up_when_the_url_is_saved(monkeypatch):
    """An early answer for a name that resolves to an address tenants may not reach (checked again at every
    connection)."""
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host == "inner.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    errors = checked(ht._check_url, {"url": "https://inner.test/{a}"}, {"a"})
    assert list(errors) == ["url"] and "a private address" in errors["url"][0]


QUERY_MESSAGE = (f"a JSON object of at most {ht.QUERY_MAX} parameter names and templates (text of at most "
                 f"{ht.TEMPLATE_MAX} characters, e.g. \"{{q}}\")")


@pytest.mark.parametrize("query", [
    [], "q", {f"p{i}": "v" for i in range(ht.QUERY_MAX + 1)}, {"": "v"}, {"n" * 129: "v"}, {"q": 1},
    {"q": "t" * (ht.TEMPLATE_MAX + 1)}, {"q": "nul\x00"}, {1: "v"},
])
def test_a_refused_query_says_what_is_taken(query):
    assert checked(ht._check_query, query, {"a"}) == {"query": [QUERY_MESSAGE]}


def test_a_query_at_its_bounds_is_taken_and_its_placeholders_checked():
    at_bounds = {**{f"p{i}": "v" for i in range(ht.QUERY_MAX - 1)}, "n" * 128: "{a}" + "t" * (ht.TEMPLATE_MAX - 3)}
    assert checked(ht._check_query, at_bounds, {"a"}) == {}
    assert checked(ht._check_query, {"q": "{b}"}, {"a"}) == {"query": ["{b} names no property of the input schema"]}


def test_a_body_is_for_body_methods_json_and_bounded():
    assert checked(ht._check_body, {"method": "GET", "body": None}, set()) == {}
    assert checked(ht._check_body, {"method": "DELETE", "body": {"a": 1}}, set()) == {"body": ["DELETE sends no body"]}
    assert checked(ht._check_body, {"method": "PUT", "body": {"a": "\x00"}}, set()) == {
        "body": ["JSON strings may not contain the NUL character (\\u0000)"]}
    fits = {"a": "x" * (ht.BODY_MAX - len('{"a":""}'))}
    assert checked(ht._check_body, {"method": "PATCH", "body": fits}, set()) == {}
    over = {"a": "x" * (ht.BODY_MAX - len('{"a":""}') + 1)}
    assert checked(ht._check_body, {"method": "PATCH", "body": over}, set()) == {
        "body": [f"at most {ht.BODY_MAX} bytes of JSON"]}
    assert checked(ht._check_body, {"method": "POST", "body": {"a": "{b}"}}, {"a"}) == {
        "body": ["{b} names no property of the input schema"]}


SECRET_VALUE = f"the value of t must be 1-{ht.SECRET_VALUE_MAX} visible ASCII characters, without line breaks"


def test_secret_changes_set_replace_and_remove():
    errors: dict = {}
    assert ht._merged_secrets({"a": "1", "b": "2"}, {"a": "one", "b": None, "c": "3", "gone": None}, errors) == {
        "a": "one", "c": "3"}
    assert errors == {}
    assert ht._merged_secrets({"a": "1"}, ["a"], errors) == {"a": "1"}
    assert errors == {"secrets": ["a JSON object of secret names and values (null removes one)"]}


@pytest.mark.parametrize(("changes", "problems"), [
    ({"bad name": "v"}, ["'bad name' is not a secret name (1-64 letters, digits, '_', '.' or '-')"]),
    ({"n" * 65: "v"}, [f"{'n' * 60!r} is not a secret name (1-64 letters, digits, '_', '.' or '-')"]),
    ({"t": ""}, [SECRET_VALUE]), ({"t": 5}, [SECRET_VALUE]), ({"t": "a\nb"}, [SECRET_VALUE]),
    ({"t": "é"}, [SECRET_VALUE]), ({"t": "v" * (ht.SECRET_VALUE_MAX + 1)}, [SECRET_VALUE]),
    ({f"s{i}": "v" for i in range(ht.SECRETS_MAX + 1)}, [f"at most {ht.SECRETS_MAX} secrets"]),
])
def test_a_refused_secret_is_named_never_shown(changes, problems):
    errors: dict = {}
    ht._merged_secrets({}, changes, errors)
    assert errors == {"secrets": problems}


def test_secrets_at_their_bounds_are_taken():
    errors: dict = {}
    changes = {**{f"s{i}": "v" for i in range(ht.SECRETS_MAX - 1)}, "n" * 64: "v" * ht.SECRET_VALUE_MAX}
    assert len(ht._merged_secrets({}, changes, errors)) == ht.SECRETS_MAX and errors == {}


RESPONSE_SHAPE = ('a JSON object, e.g. {"pointer": "/data"} (a JSON pointer to the part of a JSON answer that is '
                  'the result)')
POINTER = f"pointer: a JSON pointer (\"/data/items\") of at most {ht.POINTER_MAX} characters"


@pytest.mark.parametrize(("response", "message"), [
    ([], RESPONSE_SHAPE), ({"pointer": "/a", "other": 1}, RESPONSE_SHAPE), ({"pointer": 3}, POINTER),
    ({"pointer": "data"}, POINTER), ({"pointer": "/" + "p" * ht.POINTER_MAX}, POINTER), ({"pointer": "/\x00"}, POINTER),
])
def test_a_refused_response_says_what_is_taken(response, message):
    assert checked(ht._check_response, response) == {"response": [message]}


@pytest.mark.parametrize("response", [{}, {"pointer": ""}, {"pointer": "/" + "p" * (ht.POINTER_MAX - 1)}])
def test_a_response_at_its_bounds_is_taken(response):
    assert checked(ht._check_response, response) == {}


# --- the services: the whole check, what is saved, what the audit log holds ---------------------------

SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}


def refusals(tenant, changes, tool=None) -> dict:
    with pytest.raises(ServiceError) as caught:
        ht.http_tool_check(tenant, changes, tool)
    return caught.value.fields


def make(world, **fields):
    return ht.http_tool_create(tenant=world.a.tenant, **{"name": "t1", "input_schema": SCHEMA,
                                                           "url": PUBLIC + "/x/{a}", **fields})


@pytest.mark.django_db
def test_the_check_fills_the_defaults_and_takes_null_as_empty(world):
    tool_values, endpoint_values, secrets = ht.http_tool_check(
        world.a.tenant, {"name": "t1", "url": PUBLIC + "/x", "query": None, "headers": None, "response": None})
    assert tool_values == {"name": "t1", "description": "", "input_schema": {
                               "type": "object", "properties": {}, "additionalProperties": False},
                           "read_only": False, "destructive": False, "idempotent": False, "timeout_s": 30.0,
                           "enabled": True}
    assert endpoint_values == {"method": "POST", "url_template": PUBLIC + "/x", "query": {}, "body": None,
                               "headers": {}, "response": {}, "oauth_provider": None}
    assert secrets == {}


@pytest.mark.django_db
def test_the_check_names_every_refused_field_at_once(world):
    assert refusals(world.a.tenant, {"name": "t1", "url": PUBLIC, "colour": 1, "also": 2}) == {
        "also": ["not a field of an HTTP tool"], "colour": ["not a field of an HTTP tool"]}
    fields = refusals(world.a.tenant, {"name": "bad name", "description": 5, "method": "TRACE", "url": "",
                                       "query": [], "headers": [], "response": [], "secrets": [],
                                       "input_schema": {"type": "string"}, "read_only": "yes", "timeout_s": 0})
    assert set(fields) == {"name", "description", "method", "url", "query", "headers", "response", "secrets",
                           "input_schema", "read_only", "timeout_s"}
    assert fields["name"] == ["1-64 letters, digits, '_' or '-'"]
    assert fields["description"] == [f"text of at most {ht.DESCRIPTION_MAX} characters"]
    assert fields["method"] == ["one of: GET, POST, PUT, PATCH, DELETE"]


@pytest.mark.django_db
@pytest.mark.parametrize(("changes", "field"), [
    ({"name": "n" * 65}, "name"), ({"name": ""}, "name"), ({"name": 7}, "name"),
    ({"description": "d" * (ht.DESCRIPTION_MAX + 1)}, "description"), ({"description": "nul \x00"}, "description"),
    ({"method": "GET", "body": {"a": 1}}, "body"),
])
def test_one_refused_field_is_named(world, changes, field):
    assert set(refusals(world.a.tenant, {"name": "t1", "url": PUBLIC, **changes})) == {field}


@pytest.mark.django_db
def test_names_at_their_bounds_are_taken_and_a_taken_name_is_refused(world):
    ht.http_tool_check(world.a.tenant, {"name": "n-_9" * 16, "url": PUBLIC, "description": "d" * ht.DESCRIPTION_MAX})
    make(world)
    assert refusals(world.a.tenant, {"name": "t1", "url": PUBLIC}) == {"name": ["a tool named 't1' exists"]}
    assert refusals(world.a.tenant, {"name": "reset_tools", "url": PUBLIC}) == {
        "name": ["'reset_tools' is reserved for a tool of the platform"]}
    ht.http_tool_check(world.b.tenant, {"name": "t1", "url": PUBLIC})  # another tenant's name is no clash


@pytest.mark.django_db
def test_a_body_of_a_refused_method_is_not_checked_again(world):
    assert refusals(world.a.tenant, {"name": "t1", "url": PUBLIC, "method": "TRACE", "body": {"a": "\x00"}}) == {
        "method": ["one of: GET, POST, PUT, PATCH, DELETE"]}


@pytest.mark.django_db
def test_a_refused_schema_leaves_no_properties_to_name(world):
    fields = refusals(world.a.tenant, {"name": "t1", "url": PUBLIC + "/{a}", "input_schema": {
        "type": "object", "properties": {"a": {"type": "nonsense"}}}})
    assert set(fields) == {"input_schema", "url"}
    assert fields["url"] == ["{a} names no property of the input schema"]


@pytest.mark.django_db
def test_what_is_saved_and_audited_on_create(world):
    tool = make(world, method="PUT", url=PUBLIC + "/x/{a}" + "y" * 300, query={"z": "1", "b": "2"},
                headers={"X-B": "b", "Authorization": "Bearer {secret:t}"}, secrets={"t": "s3cr3t-v4lue"},
                read_only=True, idempotent=True, destructive=True, timeout_s=12.5, enabled=False, description="d")
    assert (tool.source, tool.trusted, tool.read_only, tool.idempotent, tool.destructive, tool.timeout_s,
            tool.enabled, tool.description) == ("http", True, True, True, True, 12.5, False, "d")
    assert tool.source_ref == ("PUT " + PUBLIC + "/x/{a}" + "y" * 300)[:255] and len(tool.source_ref) == 255
    endpoint = HttpEndpoint.objects.for_tenant(world.a.tenant).get(tool=tool)
    assert (endpoint.method, endpoint.query, endpoint.secrets) == ("PUT", {"z": "1", "b": "2"}, {"t": "s3cr3t-v4lue"})
    event = Event.objects.for_tenant(world.a.tenant).get(verb="tool.created")
    assert event.target == "tool:t1"
    assert event.data == {"source": "http", "method": "PUT", "url": PUBLIC + "/x/{a}" + "y" * 300,
                          "query": ["b", "z"], "header_names": ["Authorization", "X-B"], "secret_names": ["t"],
                          "enabled": False, "oauth_provider": None}
    bare = make(world, name="t2")
    assert HttpEndpoint.objects.for_tenant(world.a.tenant).get(tool=bare).secrets is None


@pytest.mark.django_db
def test_what_an_update_changes_and_audits(world):
    tool = make(world, headers={"Authorization": "{secret:t}"}, secrets={"t": "first-v4lue", "u": "other-v4lue"})
    ht.http_tool_update(tool=tool, name="t9", url=PUBLIC + "/y/{a}", description="new", method="POST",
                        secrets={"u": None})
    tool.refresh_from_db()
    endpoint = HttpEndpoint.objects.for_tenant(world.a.tenant).get(tool=tool)
    assert (tool.name, tool.description, tool.source_ref) == ("t9", "new", "POST " + PUBLIC + "/y/{a}")
    assert endpoint.url_template == PUBLIC + "/y/{a}" and endpoint.secrets == {"t": "first-v4lue"}
    event = Event.objects.for_tenant(world.a.tenant).get(verb="tool.updated")
    assert event.target == "tool:t1"  # the name it had
    assert event.data == {"fields": ["description", "name", "url"], "secrets_changed": ["u"], "source": "http",
                          "method": "POST", "url": PUBLIC + "/y/{a}", "query": [], "header_names": ["Authorization"],
                          "secret_names": ["t"], "enabled": True, "oauth_provider": None}
    ht.http_tool_update(tool=tool, headers={}, secrets={"t": None})
    assert HttpEndpoint.objects.for_tenant(world.a.tenant).get(tool=tool).secrets is None
    ht.http_tool_delete(tool=tool)
    deleted = Event.objects.for_tenant(world.a.tenant).get(verb="tool.deleted")
    assert (deleted.target, deleted.data) == ("tool:t9", {"source": "http"})


@pytest.mark.django_db
def test_another_host_needs_the_kept_secrets_again(world):
    tool = make(world, headers={"A": "{secret:t}", "B": "{secret:u}"}, secrets={"t": "first-v4lue", "u": "other-v4lue"})
    assert refusals(world.a.tenant, {"url": "https://93.184.215.15/x/{a}"}, tool) == {"secrets": [
        "the URL now points at another host: send the secrets again (t, u), or remove them (stored secrets are only "
        "sent where they were entered for)"]}
    assert refusals(world.a.tenant, {"url": "https://93.184.215.15/x/{a}", "secrets": {"t": "new-v4lue"}},
                    tool)["secrets"][0].startswith("the URL now points at another host: send the secrets again (u),")
    ht.http_tool_check(world.a.tenant, {"url": "HTTPS://93.184.215.14/other"}, tool)  # the same origin
    ht.http_tool_check(world.a.tenant, {"url": "https://93.184.215.15/x", "headers": {}, "secrets": {
        "t": None, "u": None}}, tool)


@pytest.mark.django_db
def test_only_http_tools_are_changed_here(world):
    other = Tool.objects.for_tenant(world.a.tenant).exclude(source="http").first()
    for change in (lambda: ht.http_tool_update(tool=other, description="x"), lambda: ht.http_tool_delete(tool=other)):
        with pytest.raises(ServiceError) as caught:
            change()
        assert str(caught.value.detail) == "this tool is not an HTTP tool"
    assert Tool.objects.for_tenant(world.a.tenant).filter(pk=other.pk).exists()


# --- importing an OpenAPI document -------------------------------------------------------------------

def parse_refusal(text: str) -> list:
    with pytest.raises(ServiceError) as caught:
        ht.openapi_parse(text)
    return caught.value.fields["document"]


OPENAPI_SHAPE = 'an OpenAPI 3 document: an object with "openapi": "3.x" and "paths"'


@pytest.mark.parametrize("text", ["[1]", "openapi: '2.0'\npaths: {}", '{"paths": {}}', "openapi: 3.0.0\npaths: []",
                                  "openapi: 3.0.0"])
def test_a_document_that_is_no_openapi_3_is_refused(text):
    assert parse_refusal(text) == [OPENAPI_SHAPE]


def test_a_document_is_read_as_plain_json_values():
    assert ht.openapi_parse("openapi: 3\npaths: {}\nwhen: 2020-01-02\n1: x") == {
        "openapi": 3, "paths": {}, "when": "2020-01-02", "1": "x"}
    assert parse_refusal("openapi: 3.0.0\npaths: {}\n2020-01-02: x") == [
        "mapping keys must be text, numbers, true, false or null"]
    assert parse_refusal('{"openapi": "3.0.0", "paths": {}, "x": "\\u0000"}') == [
        "JSON strings may not contain the NUL character (\\u0000)"]
    assert ht._messages(ServiceError({"a": ["one", "two"], "b": ["three"]})) == "a: one two; b: three"
    assert ht._messages(ServiceError("plain")) == "plain"


def test_a_broken_json_document_says_where_within_bounds():
    [message] = parse_refusal('{"openapi": "3.0.0", "paths": {' + '"x": 1, ' * 10 + "}")
    assert 0 < len(message) <= 500 and "line 1" in message


def test_local_references_are_followed_a_few_times():
    chain = {f"c{i}": {"$ref": f"#/c{i + 1}"} for i in range(9)}
    document = {**chain, "c9": {"type": "string"}, "loop": {"$ref": "#/loop"}, "list": [1, 2]}
    assert ht._local(document, {"$ref": "#/c2"}) == {"type": "string"}  # 8 steps
    assert ht._local(document, {"$ref": "#/c1"}) is None  # 9: given up
    assert ht._local(document, {"$ref": "#/loop"}) is None
    assert ht._local(document, {"$ref": "other.yaml#/x"}) is None
    assert ht._local(document, {"$ref": "#/nothing"}) is None
    assert ht._local(document, {"$ref": "#/list/1"}) == 2
    assert ht._local(document, {"$ref": 5, "type": "x"}) is None  # a reference that cannot be followed


def operation_fields(operation: dict, *, path="/things/{id}", method="post", shared=None, base="https://h/v1/"):
    document = {"paths": {path: {method: operation, **({"parameters": shared} if shared else {})}},
                "components": {"parameters": {"Id": {"name": "id", "in": "path", "schema": {"type": "integer"}}},
                               "schemas": {"Thing": {"type": "object", "properties": {"n": {"type": "string"}}}}}}
    return ht._operation_tool(document, path, method, operation, base, "p_", ht._SchemaCopies(document))


def test_an_operation_becomes_a_tools_fields():
    name, fields, reason = operation_fields({
        "operationId": "make thing!", "summary": "Make one", "description": "unused",
        "parameters": [{"name": "q", "in": "query", "description": "d" * 1200, "schema": {"type": "string"}},
                       {"name": "r", "in": "query", "required": True}, {"name": "h", "in": "header"}],
        "requestBody": {"content": {"application/json": {"schema": {
            "type": "object", "properties": {"n": {"$ref": "#/components/schemas/Thing"}, "m": 5,
                           "l": {"type": "array", "items": {"$ref": "#/components/schemas/Thing"}}},
            "required": ["n", "absent", 3]}}}}},
        shared=[{"$ref": "#/components/parameters/Id"}])
    assert (name, reason) == ("p_make_thing", "")
    assert fields == {
        "name": "p_make_thing", "description": "Make one",
        "input_schema": {"type": "object", "required": ["id", "n", "r"], "properties": {
            "id": {"type": "integer"}, "q": {"type": "string", "description": "d" * 1000}, "r": {},
            "n": {"type": "object", "properties": {"n": {"type": "string"}}}, "m": {},
            "l": {"type": "array", "items": {"$ref": "#/$defs/Thing"}}},
            "$defs": {"Thing": {"type": "object", "properties": {"n": {"type": "string"}}}}},
        "method": "POST", "url": "https://h/v1/things/{id}", "query": {"q": "{q}", "r": "{r}"},
        "body": {"n": "{n}", "m": "{m}", "l": "{l}"}, "read_only": False, "idempotent": False, "destructive": False}


@pytest.mark.parametrize(("method", "read_only", "idempotent", "destructive"), [
    ("get", True, True, False), ("put", False, True, False), ("delete", False, True, True),
    ("patch", False, False, False), ("post", False, False, False)])
def test_the_method_says_what_the_tool_is(method, read_only, idempotent, destructive):
    _, fields, _ = operation_fields({"description": "D" * (ht.DESCRIPTION_MAX + 5)}, path="/a.b/c", method=method)
    assert (fields["read_only"], fields["idempotent"], fields["destructive"]) == (read_only, idempotent, destructive)
    assert fields["description"] == "D" * ht.DESCRIPTION_MAX and fields["method"] == method.upper()
    assert fields["body"] is None and fields["input_schema"] == {"type": "object", "properties": {}, "required": []}


def test_an_operation_without_an_id_is_named_after_its_method_and_path():
    name, _, _ = operation_fields({"operationId": 5}, path="/a.b/{c}/", method="get")
    assert name == "p_get__a_b_c"  # "get_" and "/a.b/{c}/"
    long, _, _ = operation_fields({"operationId": "x" * 80})
    assert long == "p_" + "x" * 62


@pytest.mark.parametrize(("operation", "method", "reason"), [
    ({"parameters": [5]}, "post", "a parameter could not be read"),
    ({"parameters": [{"in": "query"}]}, "post", "a parameter could not be read"),
    ({"parameters": [{"name": "k", "in": "header", "required": True}]}, "post",
     "it needs the header k, which an HTTP tool takes from no argument"),
    ({"parameters": [{"name": "c" * 80, "in": "cookie", "required": True}]}, "post",
     f"it needs the cookie {'c' * 60}, which an HTTP tool takes from no argument"),
    ({"parameters": [{"name": "b", "in": "body"}]}, "post", "the parameter 'b' cannot be an argument"),
    ({"parameters": [{"name": "a b", "in": "query"}]}, "post", "the parameter 'a b' cannot be an argument"),
    ({"requestBody": {"required": True, "content": {"text/plain": {}}}}, "post", "its body is not JSON"),
    ({"requestBody": {"content": {"application/json": {"schema": {"type": "object"}}}}}, "get", "GET sends no body"),
    ({"requestBody": {"content": {"application/json": {"schema": {"type": "string"}}}}}, "post",
     "its JSON body is not an object with properties"),
    ({"requestBody": {"content": {"application/json": {"schema": {"properties": {}}}}}}, "put",
     "its JSON body is not an object with properties"),
    ({"parameters": [{"name": "n", "in": "query"}], "requestBody": {"content": {"application/json": {"schema": {
        "properties": {"n": {}}}}}}}, "post", "the body's property 'n' cannot be an argument"),
    ({"requestBody": {"content": {"application/json": {"schema": {"properties": {"a b": {}}}}}}}, "patch",
     "the body's property 'a b' cannot be an argument"),
])
def test_an_operation_that_cannot_be_a_tool_says_why(operation, method, reason):
    _, fields, why = operation_fields(operation, path="/x", method=method)
    assert (fields, why) == (None, reason)


def test_an_optional_body_that_is_not_json_is_left_out():
    _, fields, reason = operation_fields({"requestBody": {"content": {"text/plain": {}}}}, path="/x")
    assert reason == "" and fields["body"] is None
    _, fields, _ = operation_fields({"requestBody": {"content": "nonsense"}}, path="/x")
    assert fields["body"] is None


def test_the_schema_budget_stops_an_operation_not_the_import(monkeypatch):
    monkeypatch.setattr(ht, "IMPORT_SCHEMA_VALUES_MAX", 5)
    name, fields, reason = operation_fields({"operationId": "big", "parameters": [
        {"name": "q", "in": "query", "schema": {"type": "object", "properties": {"a": {}, "b": {}}}}]}, path="/x")
    assert (name, fields) == ("p_big", None)
    assert reason == ("the input schemas of one import's tools hold at most 5 values together: import this "
                      "operation in another request (operations)")


def test_the_schema_copies_count_every_value():
    copies = ht._SchemaCopies({"components": {"schemas": {"A": {"$ref": "#/components/schemas/B"}, "B": [1, 2]}}})
    assert copies.copy({"x": [1, {"$ref": "#/components/schemas/A"}]}) == {"x": [1, {"$ref": "#/$defs/A"}]}
    assert copies.left == ht.IMPORT_SCHEMA_VALUES_MAX - 3 - 3 - 3
    assert copies.defs() == {"A": {"$ref": "#/$defs/B"}, "B": [1, 2]} and copies.defs() == {}
    copies.left = 2
    copies.spend(2)
    with pytest.raises(ht._BudgetSpent):
        copies.spend(1)
    assert ht._SchemaCopies({"components": []}).components == {}
    assert ht._SchemaCopies({"components": {"schemas": [1]}}).components == {}


def test_a_component_name_is_unescaped_and_a_missing_one_left_for_the_check():
    copies = ht._SchemaCopies({"components": {"schemas": {"a/b~c": {"type": "string"}}}})
    copies.copy({"$ref": "#/components/schemas/a~1b~0c"})
    copies.copy({"$ref": "#/components/schemas/gone/properties/x"})
    assert copies.defs() == {"a/b~c": {"type": "string"}}


IMPORTED = """
openapi: 3.0.0
servers: [{description: none}, {url: "https://93.184.215.14/v1"}]
paths:
  /skip: 5
  /a:
    parameters: 7
    get: {operationId: listA}
    post: {operationId: makeA}
    trace: {operationId: traced}
    put: nonsense
  /b/{id}:
    delete: {parameters: [{name: id, in: path}]}
"""


@pytest.mark.django_db
def test_an_import_reports_each_operation_it_looked_at(world):
    report = ht.http_tools_import(tenant=world.a.tenant, document=IMPORTED, prefix="x-", timeout_s=7.5,
                                  headers={"A": "{secret:t}"}, secrets={"t": "v4lue-one"})
    made = {entry["operation"]: entry for entry in report}
    assert list(made) == ["GET /a", "POST /a", "DELETE /b/{id}"]
    assert [(e["name"], e["created"], e["reason"]) for e in report] == [
        ("x-listA", True, ""), ("x-makeA", True, ""), ("x-delete__b_id", True, "")]
    endpoint = HttpEndpoint.objects.for_tenant(world.a.tenant).get(pk=made["DELETE /b/{id}"]["id"])
    assert (endpoint.url_template, endpoint.method, endpoint.headers, endpoint.secrets, endpoint.tool.timeout_s) == (
        "https://93.184.215.14/v1/b/{id}", "DELETE", {"A": "{secret:t}"}, {"t": "v4lue-one"}, 7.5)
    again = ht.http_tools_import(tenant=world.a.tenant, document=IMPORTED, prefix="x-",
                                 operations=["POST /a", "listA"], base_url="https://93.184.215.15")
    assert [(e["operation"], e["created"], e["id"], e["reason"]) for e in again] == [
        ("GET /a", False, None, "name: a tool named 'x-listA' exists"),
        ("POST /a", False, None, "name: a tool named 'x-makeA' exists")]


@pytest.mark.django_db
def test_an_import_takes_so_many_operations_at_once(world, monkeypatch):
    monkeypatch.setattr(ht, "IMPORT_OPERATIONS_MAX", 1)
    report = ht.http_tools_import(tenant=world.a.tenant, document=IMPORTED)
    assert [(e["operation"], e["created"], e["reason"]) for e in report] == [
        ("GET /a", True, ""), ("POST /a", False, "only 1 operations are imported at once"),
        ("DELETE /b/{id}", False, "only 1 operations are imported at once")]  # each one past the bound
    assert report[2]["name"] == "" and report[2]["id"] is None
    monkeypatch.setattr(ht, "IMPORT_OPERATIONS_MAX", 0)  # both of a path's operations past it: each reported
    report = ht.http_tools_import(tenant=world.a.tenant, document=IMPORTED, prefix="y-")
    assert [(e["operation"], e["created"]) for e in report] == [
        ("GET /a", False), ("POST /a", False), ("DELETE /b/{id}", False)]


@pytest.mark.django_db
@pytest.mark.parametrize(("arguments", "field", "message"), [
    ({"prefix": "a b"}, "prefix", "0-32 letters, digits, '_' or '-'"),
    ({"prefix": "p" * 33}, "prefix", "0-32 letters, digits, '_' or '-'"),
    ({"prefix": None}, "prefix", "0-32 letters, digits, '_' or '-'"),
    ({"document": "openapi: 3.0.0\npaths: {}"}, "base_url", "the API's absolute http(s) URL: the document names none"),
    ({"base_url": "ftp://h"}, "base_url", "the API's absolute http(s) URL: the document names none"),
    ({"document": "openapi: 3.0.0\nservers: [{url: /relative}]\npaths: {}"}, "base_url",
     "the API's absolute http(s) URL: the document names none"),
])
def test_an_import_refuses_a_prefix_or_base_it_cannot_use(world, arguments, field, message):
    with pytest.raises(ServiceError) as caught:
        ht.http_tools_import(tenant=world.a.tenant, **{"document": IMPORTED, **arguments})
    assert caught.value.fields == {field: [message]}


@pytest.mark.django_db
def test_a_prefix_at_its_bound_and_an_uppercase_scheme_are_taken(world):
    report = ht.http_tools_import(tenant=world.a.tenant, document="openapi: 3.0.0\npaths: {/a: {get: {}}}",
                                  prefix="p" * 32, base_url="HTTPS://93.184.215.14")
    assert [(e["name"], e["created"]) for e in report] == [("p" * 32 + "get__a", True)]


@pytest.mark.django_db
def test_a_long_refusal_is_cut_in_the_report(world):
    document = "openapi: 3.0.0\npaths:\n  /a:\n    get: {operationId: " + "n" * 70 + ", summary: s}\n"
    headers = {f"bad name {i} " + "x" * 60: "v" for i in range(30)}
    [entry] = ht.http_tools_import(tenant=world.a.tenant, document=document, base_url=PUBLIC, headers=headers)
    assert entry["created"] is False and len(entry["reason"]) == 1000 and entry["reason"].startswith("headers: ")


# --- sending: the answer, the deadline and the stop signal ---------------------------------------------

@pytest.fixture
def served(settings):
    from tests.tools.http_endpoint import serve

    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1"]
    yield from serve()


def test_sending_returns_the_status_type_and_whole_body(served):
    signal = CallStop()
    assert ht._send({"method": "GET", "url": served.url + "/text", "headers": {}}, timeout_s=5, cancelled=signal) == (
        200, "text/plain; charset=utf-8", b"plain words")
    assert signal._hooks == []  # the wake-up hook is taken back once the answer is in
    status, content_type, body = ht._send({"method": "PUT", "url": served.url + "/echo/x", "headers": {},
                                           "json": {"n": 1}}, timeout_s=5, cancelled=None)
    assert (status, content_type) == (200, "application/json") and json.loads(body)["body"] == {"n": 1}
    assert ht._send({"method": "GET", "url": served.url + "/nothing", "headers": {}}, timeout_s=5,
                    cancelled=None)[:2] == (404, "text/plain")


def test_sending_gives_up_at_the_deadline(served):
    with pytest.raises(ToolError) as caught:
        ht._send({"method": "GET", "url": served.url + "/slow", "headers": {}}, timeout_s=0.3, cancelled=None)
    assert (str(caught.value), caught.value.error_type, caught.value.transient) == (
        "the endpoint did not answer within 0.3 s", "TimedOut", True)


@pytest.mark.parametrize("signal", [CallStop, threading.Event], ids=["call stop", "plain event"])
def test_sending_stops_when_the_call_is_cancelled(served, signal):
    cancelled = signal()
    timer = threading.Timer(0.2, cancelled.set)
    timer.start()
    with pytest.raises(CallCancelled) as caught:
        ht._send({"method": "GET", "url": served.url + "/slow", "headers": {}}, timeout_s=60, cancelled=cancelled)
    assert str(caught.value) == "the call was cancelled"
    already = signal()
    already.set()
    with pytest.raises(CallCancelled):
        ht._send({"method": "GET", "url": served.url + "/slow", "headers": {}}, timeout_s=60, cancelled=already)


def test_the_clients_own_exception_reaches_the_caller(served):
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(httpx2.ConnectError):
        ht._send({"method": "GET", "url": f"http://127.0.0.1:{port}/", "headers": {}}, timeout_s=5, cancelled=None)


def invoke(tool, arguments, ctx=None):
    return ht.HttpSource().invoke(Tool.objects.for_tenant(tool.tenant_id).get(pk=tool.pk), arguments, ctx)


@pytest.mark.django_db
def test_a_call_without_arguments_an_endpoint_or_readable_secrets(world, served):
    tool = make(world, url=served.url + "/text", method="POST")
    assert invoke(tool, None)["content"] == [{"type": "text", "text": "plain words"}]  # no object: no arguments
    assert served.received[0].body == b"{}"
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[old]):
        keyed = make(world, name="t2", url=served.url + "/text", headers={"A": "{secret:t}"}, secrets={"t": "v4lue"})
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[new]), pytest.raises(ToolError) as unreadable:
        invoke(keyed, {})
    assert str(unreadable.value) == ("the endpoint's stored secrets cannot be read with the platform's keys; an "
                                     "operator must enter them again")
    assert unreadable.value.error_type == "ToolNotAvailable" and served.received[1:] == []
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[new]), pytest.raises(ServiceError) as check:
        ht.http_tool_update(tool=Tool.objects.for_tenant(world.a.tenant).get(pk=keyed.pk), description="x")
    assert check.value.fields == {"headers": ["{secret:t} names no stored secret"]}  # unreadable: none kept
    HttpEndpoint.objects.for_tenant(world.a.tenant).filter(tool=tool).delete()
    with pytest.raises(ToolError) as missing:
        invoke(tool, {})
    assert (str(missing.value), missing.value.error_type) == ("t1 has no endpoint configured", "ToolNotAvailable")


@pytest.mark.django_db
def test_a_call_waits_past_its_timeout_by_the_backstop_and_stops_on_its_signal(world, served):
    tool = make(world, url=served.url + "/slow", method="GET", timeout_s=0.3)
    with pytest.raises(ToolError) as caught:
        invoke(tool, {})
    assert str(caught.value) == f"the endpoint did not answer within {0.3 + ht.BACKSTOP_S:g} s"
    stop = CallStop()
    stop.set()
    with pytest.raises(CallCancelled):
        invoke(tool, {}, SimpleNamespace(cancel_signal=stop))


@pytest.mark.django_db
def test_lists_and_pages_stay_up_when_no_key_opens_the_stored_credentials(world):
    from django.urls import reverse

    from tools.upstream.servers import mcp_server_create

    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[old]):
        tool = make(world, headers={"A": "{secret:t}"}, secrets={"t": "v4lue-one"})
        server = mcp_server_create(tenant=world.a.tenant, name="github", transport="streamable_http",
                                   url="https://93.184.215.14/mcp", headers={"Authorization": "Bearer x-y-z"})
    api, console = world.a.client("admin"), world.a.console("admin")
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[new]):
        tools = api.get("/api/v1/http-tools")
        assert tools.status_code == 200
        [listed] = [t for t in tools.json()["results"] if t["name"] == tool.name]
        assert listed["secret_names"] == [] and listed["headers"] == {"A": "{secret:t}"}
        servers = api.get("/api/v1/mcp-servers")
        assert servers.status_code == 200 and servers.json()["results"][0]["header_names"] == []
        page = console.get(reverse("console:mcp_server_detail", kwargs={"tenant": world.a.tenant.slug,
                                                                         "server_id": server.pk}))
        assert page.status_code == 200


def test_only_a_local_reference_is_followed():
    document = {"a": {"type": "string"}}
    assert ht._local(document, {"$ref": "x/a"}) is None  # "/a" after its first character, but no "#/"
    assert ht._local(document, {"$ref": "#/a"}) == {"type": "string"}


def test_only_a_ref_is_rewritten_and_a_component_is_carried_once():
    copies = ht._SchemaCopies({"components": {"schemas": {"A": {"type": "object", "properties": {"n": {}}},
                                                          "B": {"type": "string"}}}})
    text = {"description": "#/components/schemas/B", "title": "see #/components/schemas/B"}
    assert copies.copy(text) == text and copies.defs() == {}  # text that looks like a reference is text
    left = copies.left
    copied = copies.copy({"a": {"$ref": "#/components/schemas/A"}, "b": {"$ref": "#/components/schemas/A"},
                          "c": {"$ref": "#/components/schemas/A/properties/n"}})
    assert copied["c"] == {"$ref": "#/$defs/A/properties/n"}
    assert copies.defs() == {"A": {"type": "object", "properties": {"n": {}}}}
    assert left - copies.left == 7 + 3 * 3 + (5 + 3 + 1)  # the mapping, its three references, then A once
    into = ht._SchemaCopies({"components": {"schemas": {"A": {"type": "string"}}}})
    into.copy({"$ref": "#/components/schemas/A/properties/n"})  # a reference into a component carries it
    assert into.defs() == {"A": {"type": "string"}}


def test_an_operations_name_keeps_its_own_letters_and_the_base_url_its_path():
    document = {"paths": {"/x": {"get": {"operationId": "_XlistX_"}}}}
    operation = document["paths"]["/x"]["get"]
    name, fields, _ = ht._operation_tool(document, "/x", "get", operation, "https://h/apiX//", "",
                                         ht._SchemaCopies(document))
    assert name == "XlistX" and fields["url"] == "https://h/apiX/x" and fields["description"] == ""


def test_parameters_and_bodies_by_reference_and_every_parameter_read():
    document = {"paths": {"/x": {"post": {
        "parameters": [{"name": "h", "in": "header"}, {"name": "q", "in": "query",
                                                       "schema": {"$ref": "#/components/schemas/Id"}}],
        "requestBody": {"$ref": "#/components/requestBodies/Thing"}}}},
        "components": {"schemas": {"Id": {"type": "integer"}},
                       "requestBodies": {"Thing": {"content": {"application/json": {"schema": {
                           "type": "object", "properties": {"n": {"type": "string"}}}}}}}}}
    operation = document["paths"]["/x"]["post"]
    _, fields, reason = ht._operation_tool(document, "/x", "post", operation, "https://h", "",
                                           ht._SchemaCopies(document))
    assert reason == "" and fields["query"] == {"q": "{q}"} and fields["body"] == {"n": "{n}"}
    assert fields["input_schema"]["properties"] == {"q": {"type": "integer"}, "n": {"type": "string"}}


@pytest.mark.parametrize(("operation", "reason"), [
    ({"parameters": [{"name": "b" * 80, "in": "body"}]}, f"the parameter {'b' * 60!r} cannot be an argument"),
    ({"requestBody": {"content": {"application/json": {"schema": {"properties": {"p q" + "r" * 80: {}}}}}}},
     f"the body's property {('p q' + 'r' * 80)[:60]!r} cannot be an argument"),
])
def test_a_long_name_in_a_reason_is_cut(operation, reason):
    assert operation_fields(operation, path="/x")[2] == reason


@pytest.mark.django_db
def test_an_import_takes_every_method_and_the_default_timeout(world):
    document = ("openapi: 3.0.0\npaths:\n  /a:\n" + "".join(f"    {m}: {{operationId: {m}A}}\n"
                                                         for m in ("get", "post", "put", "patch", "delete", "head")))
    report = ht.http_tools_import(tenant=world.a.tenant, document=document, base_url=PUBLIC)
    assert [(e["operation"], e["created"]) for e in report] == [
        ("GET /a", True), ("POST /a", True), ("PUT /a", True), ("PATCH /a", True), ("DELETE /a", True)]
    assert {t.timeout_s for t in Tool.objects.for_tenant(world.a.tenant).filter(source="http")} == {30.0}


@pytest.mark.django_db
def test_an_http_tool_without_its_endpoint_is_not_changed_here(world):
    tool = make(world)
    HttpEndpoint.objects.for_tenant(world.a.tenant).filter(tool=tool).delete()
    with pytest.raises(ServiceError) as caught:
        ht.http_tool_update(tool=Tool.objects.for_tenant(world.a.tenant).get(pk=tool.pk), description="x")
    assert str(caught.value.detail) == "this tool is not an HTTP tool"


def test_a_documents_refusals_in_exact_words():
    assert parse_refusal("openapi: 3.0.0\npaths: {}\n#" + "x" * ht.IMPORT_MAX_BYTES) == [
        f"the document is {ht.IMPORT_MAX_BYTES + 26} bytes; at most {ht.IMPORT_MAX_BYTES}"]
    assert parse_refusal('openapi: 3.0.0\npaths: {}\nx: "a\\0b"') == [  # YAML's escapes reach what JSON refuses
        "JSON strings may not contain the NUL character (\\u0000)"]
    assert parse_refusal("openapi: 3.0.0\npaths: {}\nx: .nan") == [
        "JSON numbers must be finite (NaN and Infinity are not JSON)"]


def test_an_answer_is_read_as_utf_8_and_given_back_unescaped():
    assert ht.result_of(200, "text/plain", b"\xff ok \xc3\xa9", endpoint(), [])["content"] == [
        {"type": "text", "text": "\ufffd ok é"}]
    assert ht.result_of(200, "application/json", '{"k": "é"}'.encode(), endpoint(), [])["content"] == [
        {"type": "text", "text": '{"k": "é"}'}]


@pytest.mark.django_db
def test_an_import_passes_over_what_it_cannot_use_or_was_not_asked_for(world):
    document = ("openapi: 3.0.0\npaths:\n  /0: 7\n  /a:\n    get: 5\n    post: {operationId: makeA}\n"
                "    put: {operationId: putA}\n    delete: {operationId: dropA}\n")
    admin = world.a.users["admin"]
    report = ht.http_tools_import(tenant=world.a.tenant, document=document, base_url=PUBLIC, actor=admin)
    assert [e["operation"] for e in report] == ["POST /a", "PUT /a", "DELETE /a"]
    assert {e.actor for e in Event.objects.for_tenant(world.a.tenant).filter(verb="tool.created")} == {admin}
    again = ht.http_tools_import(tenant=world.a.tenant, document=document, base_url=PUBLIC, prefix="b_",
                                 operations=["dropA"])
    assert [(e["operation"], e["name"], e["created"]) for e in again] == [("DELETE /a", "b_dropA", True)]


def request_threads_end(within_s: float = 5.0) -> bool:
    """Whether every request thread of an HTTP tool has ended, waiting up to `within_s`."""
    deadline = time.monotonic() + within_s
    while any(t.name == "toolkeeper-http-tool" for t in threading.enumerate()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_request_given_up_stops_its_own_thread(served):
    assert request_threads_end()  # none left by an earlier test
    with pytest.raises(ToolError):  # the endpoint never answers: the client's own timeout ends the request
        ht._send({"method": "GET", "url": served.url + "/slow", "headers": {}}, timeout_s=0.3, cancelled=None)
    assert request_threads_end()
    cancelled = CallStop()
    threading.Timer(0.2, cancelled.set).start()
    with pytest.raises(CallCancelled):  # the endpoint keeps sending: the next piece that arrives ends it
        ht._send({"method": "GET", "url": served.url + "/drip", "headers": {}}, timeout_s=60, cancelled=cancelled)
    assert request_threads_end()


def test_an_answer_without_a_type_is_text_and_a_long_one_comes_whole(served):
    assert ht._send({"method": "GET", "url": served.url + "/bare", "headers": {}}, timeout_s=5, cancelled=None) == (
        200, "", b"bare")
    status, _, body = ht._send({"method": "GET", "url": served.url + "/stream/100000", "headers": {}}, timeout_s=5,
                               cancelled=None)
    assert body == b'"' + b"x" * 99_998 + b'"'  # many pieces, joined as they came


@pytest.mark.django_db
def test_a_tool_made_of_nothing_needs_its_name_and_url(world):
    assert refusals(world.a.tenant, {}) == {"name": ["1-64 letters, digits, '_' or '-'"],
                                            "url": ["the endpoint's URL (http or https)"]}


@pytest.mark.django_db
def test_a_refused_url_is_not_also_another_host(world):
    tool = make(world, headers={"A": "{secret:t}"}, secrets={"t": "first-v4lue"})
    fields = refusals(world.a.tenant, {"url": "ftp://93.184.215.15/x/{a}"}, tool)
    assert list(fields) == ["url"]
