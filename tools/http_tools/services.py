"""HTTP tools: a tool (source `http`) whose calls an operator's HTTP endpoint answers (`HttpEndpoint`).

How a call becomes a request:
- **URL.** `url` is a template whose `{arg}` placeholders take the call's (effective) arguments. Placeholders
  may stand in the path and the query only, never in the scheme or the host, and each value is
  percent-encoded whole (`/`, `?`, `#`, `%` included; `.` and `..` too), so an argument can neither reach
  another host nor add a path segment.
- **Query.** `query` maps a parameter to a template (`{"q": "{text}", "v": "2"}`). A parameter whose
  arguments are absent is left out; `"{arg}"` alone with a list value repeats the parameter.
- **Body** (POST, PUT, PATCH). `body` is a JSON template: a string that is one placeholder (`"{count}"`)
  takes the argument's typed value (a number stays a number), a string with placeholders in text takes
  their text; a member whose argument is absent is left out. Without a template the body is the object of
  the arguments that the URL and the query did not use. GET and DELETE send no body.
- **Headers** are plain values in which `{secret:NAME}` stands for the endpoint's stored secret NAME
  (`"Authorization": "Bearer {secret:token}"`). Secrets are usable in headers only, and arguments are not.
- **OAuth.** A tool that names an OAuth provider (`oauth_provider`, tools.accounts.providers) sends a token of
  that provider as its `Authorization`: the call's verified person's own, or the provider's service account's
  (docs/accounts.md), and only to URLs under the provider's `api_url`. Its headers then hold no `Authorization`
  of their own. A 401 answer renews the token once
  and sends the request again (the API did nothing with it).
- **Response.** A JSON answer is the result's structure and text (`response.pointer`, a JSON pointer, picks
  a part of it); any other answer is text, and so is a JSON answer over ANSWER_JSON_MAX_BYTES or of more than
  ANSWER_JSON_MAX_NODES values (bounds on the work of reading it; the transport refuses an answer over
  TOOLKEEPER_OUTBOUND_MAX_MESSAGE_BYTES, a permanent failure). A status of 400 or more fails the call
  (`HttpError`, with the status and a short excerpt of the body), and so does a redirect (3xx), which is never
  followed.

Every request goes through the outbound guard (`common.outbound.http_client`): the URL is checked when
saved and every connection when made; redirects are not followed. The request ends at the tool's timeout
(the executor settles the call `timed_out` then and sets its stop signal, which ends the wait here at
once); what was sent cannot be taken back. Failures that may pass on another attempt (the connection,
a timeout, 429, 502, 503, 504) are `transient`.

No text that reaches the model or the call's record (result, error) holds a stored secret's value: an
endpoint that echoes a header back has the value replaced with `[hidden]`. Secrets are write-only: answers,
pages and audit records name them, never show them; audit records do not hold header values either.
"""
import json
import re
import threading
import time
from urllib.parse import quote, urlencode

import httpx2
from django.db import transaction

from audit.services import audit_record
from common import metrics
from common.documents import DocumentRefused, document_parse
from common.errors import ServiceError
from common.json_values import flags_check, json_parse, json_problem, seconds_check
from common.outbound import OutboundRefused, ResponseTooLarge, check_url, http_client
from common.secrets import SecretUnreadable
from common.tracing import TRACEPARENT, child_span, current_traceparent, span_error
from tenancy.selectors import tenant_slug
from tools.accounts import providers, vault
from tools.accounts.oauth import OAuthFailed
from tools.calls.traces import call_trace
from tools.catalog.registry import register_source
from tools.catalog.schemas import declared_object_schema, tool_name_reserved
from tools.models import HttpEndpoint, OAuthProvider, Tool, ToolSource
from tools.python.decorators import CallCancelled, ToolError
from tools.python.results import tool_result
from tools.upstream.servers import HEADER_VALUE
from tools.upstream.servers import check_headers as check_header_values

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
BODY_METHODS = ("POST", "PUT", "PATCH")
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
PLACEHOLDER = re.compile(r"\{(?:(secret):)?([^{}:]*)\}")
ARGUMENT = re.compile(r"[A-Za-z0-9_.-]{1,128}")
SECRET_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
URL_MAX, DESCRIPTION_MAX, TEMPLATE_MAX = 2000, 4000, 2000
QUERY_MAX, SECRETS_MAX = 50, 32
SECRET_VALUE_MAX = 8192
BODY_MAX = 64 * 1024  # the body template, as compact JSON
POINTER_MAX = 500
TIMEOUT_RANGE = (0.1, 86400.0)  # as tools.catalog.services.tool_update allows
BACKSTOP_S = 2.0  # the request's own limit is this much later than the executor's, which settles the call
TRANSIENT_STATUSES = frozenset({429, 502, 503, 504})
# A JSON answer is read as structure up to these bounds (larger ones are text): parsing is C speed, but what
# follows (checks, hiding secrets, the result) walks every value in Python.
ANSWER_JSON_MAX_BYTES = 4 * 1024 * 1024
ANSWER_JSON_MAX_NODES = 200_000
EXCERPT_MAX = 300
HIDDEN = "[hidden]"
SECRET_SHOWN_MIN = 4  # shorter values are not searched for in answers (every "a" would go)
TOOL_FIELDS = ("name", "description", "input_schema", "read_only", "destructive", "idempotent", "timeout_s",
               "enabled")
ENDPOINT_FIELDS = ("method", "url", "query", "body", "headers", "response", "oauth_provider")
FIELDS = (*TOOL_FIELDS, *ENDPOINT_FIELDS, "secrets")


# --- filling the templates ---------------------------------------------------------------------

class _Missing:
    """An argument the call did not give (a member or parameter that needs it is left out)."""


MISSING = _Missing()


def _text(value) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _segment(value) -> str:
    """A value as one encoded piece of the URL: nothing in it is a delimiter, and it is no dot segment."""
    text = quote(_text(value), safe="")
    return text.replace(".", "%2E") if text in (".", "..") else text


def _interpolate(template: str, arguments: dict, encode=None) -> str | _Missing:
    missing = False

    def fill(match):
        nonlocal missing
        if match.group(2) not in arguments:
            missing = True
            return ""
        value = arguments[match.group(2)]
        return encode(value) if encode else _text(value)

    filled = PLACEHOLDER.sub(fill, template)
    return MISSING if missing else filled


def _fill_json(template, arguments: dict):
    if isinstance(template, str):
        whole = PLACEHOLDER.fullmatch(template)
        if whole:
            return arguments.get(whole.group(2), MISSING)
        return _interpolate(template, arguments)
    if isinstance(template, dict):
        filled = {key: _fill_json(value, arguments) for key, value in template.items()}
        return {key: value for key, value in filled.items() if value is not MISSING}
    if isinstance(template, list):
        return [value for value in (_fill_json(item, arguments) for item in template) if value is not MISSING]
    return template


def _placeholders(template) -> list[tuple[bool, str]]:
    """(is a secret reference, name) of every placeholder in a template (strings of a JSON one included)."""
    if isinstance(template, str):
        return [(bool(m.group(1)), m.group(2)) for m in PLACEHOLDER.finditer(template)]
    if isinstance(template, dict):
        return [found for key, value in template.items() for found in (*_placeholders(key), *_placeholders(value))]
    if isinstance(template, list):
        return [found for item in template for found in _placeholders(item)]
    return []


def _argument_names(template) -> set[str]:
    return {name for secret, name in _placeholders(template) if not secret}


def request_of(endpoint: HttpEndpoint, arguments: dict, secrets: dict) -> dict:
    """The request a call makes: method, url (with the query), headers, and json when it has a body."""
    url = _interpolate(endpoint.url_template, arguments, encode=_segment)
    if url is MISSING:
        absent = sorted(_argument_names(endpoint.url_template) - set(arguments))
        raise ToolError(f"the URL needs the argument{'s' if len(absent) > 1 else ''} {', '.join(absent)}",
                        error_type="InvalidInput")
    params = []
    for name, template in (endpoint.query or {}).items():
        whole = PLACEHOLDER.fullmatch(template)
        if whole and isinstance(arguments.get(whole.group(2)), list):
            params += [(name, _text(item)) for item in arguments[whole.group(2)]]
        elif (value := _interpolate(template, arguments)) is not MISSING:
            params.append((name, value))
    if params:  # after the URL's own query (a client's `params` would replace it)
        url += ("&" if "?" in url else "?") + urlencode(params, quote_via=quote)
    headers = {name: PLACEHOLDER.sub(lambda m: secrets.get(m.group(2), ""), value)
               for name, value in (endpoint.headers or {}).items()}
    request = {"method": endpoint.method, "url": url, "headers": headers}
    if endpoint.method in BODY_METHODS:
        if endpoint.body is None:
            used = _argument_names(endpoint.url_template) | _argument_names(endpoint.query or {})
            request["json"] = {name: value for name, value in arguments.items() if name not in used}
        else:
            body = _fill_json(endpoint.body, arguments)
            request["json"] = None if body is MISSING else body
    return request


# --- keeping secrets out of what is shown ------------------------------------------------------

def _secret_forms(secrets: dict) -> list[str]:
    forms = set()
    for value in (secrets or {}).values():
        if isinstance(value, str) and len(value) >= SECRET_SHOWN_MIN:
            forms |= {value, json.dumps(value)[1:-1], quote(value, safe="")}
    return sorted(forms, key=len, reverse=True)  # a longer form first, so no part of it is left over


def scrub(value, forms: list[str]):
    """`value` with every stored secret's value replaced by `[hidden]`, in strings and keys at any depth."""
    if isinstance(value, str):
        for form in forms:
            value = value.replace(form, HIDDEN)
        return value
    if isinstance(value, dict):
        return {scrub(key, forms): scrub(item, forms) for key, item in value.items()}
    if isinstance(value, list):
        return [scrub(item, forms) for item in value]
    return value


def _excerpt(text: str, forms: list[str]) -> str:
    text = " ".join("".join(c if c.isprintable() else " " for c in scrub(text, forms)).split())
    return text if len(text) <= EXCERPT_MAX else text[:EXCERPT_MAX - 1] + "…"


# --- sending -----------------------------------------------------------------------------------

def _refusal(exc: BaseException) -> OutboundRefused | None:
    """The guard's refusal, when that is what ended the request (a client library may wrap it)."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OutboundRefused):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _send(request: dict, *, timeout_s: float, cancelled) -> tuple[int, str, bytes]:
    """Send the request on a thread of its own and wait for it, the call's stop signal, or the deadline.
    Returns (status, content type, body); raises the client's exception, CallCancelled or a TimedOut error."""
    deadline = time.monotonic() + timeout_s
    outcome: dict = {}
    done = threading.Event()
    gave_up = threading.Event()

    def run() -> None:
        try:
            with http_client(timeout=httpx2.Timeout(timeout_s)) as client, client.stream(**request) as response:
                chunks = []
                for chunk in response.iter_bytes():
                    if gave_up.is_set() or time.monotonic() > deadline:
                        raise httpx2.ReadTimeout("the endpoint did not finish its answer in time")
                    chunks.append(chunk)
                outcome["response"] = (response.status_code, response.headers.get("content-type", ""),
                                       b"".join(chunks))
        except BaseException as exc:  # handed to the waiting thread
            outcome["error"] = exc
        finally:
            done.set()

    on_set = getattr(cancelled, "on_set", None)
    remove = on_set(done.set) if on_set is not None else None
    threading.Thread(target=run, name="toolkeeper-http-tool", daemon=True).start()
    pause = 3600.0 if on_set is not None else 0.2  # a plain Event wakes no one: look at it now and then
    try:
        while not done.wait(max(0.0, min(deadline - time.monotonic(), pause))):
            if (cancelled is not None and cancelled.is_set()) or time.monotonic() >= deadline:
                break
    finally:
        if remove is not None:
            remove()
    if "response" in outcome:
        return outcome["response"]
    if "error" in outcome:
        raise outcome["error"]
    gave_up.set()
    if cancelled is not None and cancelled.is_set():
        raise CallCancelled("the call was cancelled")
    raise ToolError(f"the endpoint did not answer within {timeout_s:g} s", error_type="TimedOut", transient=True)


def _resolve_pointer(document, pointer: str):
    """RFC 6901: the part of `document` that `pointer` names, or MISSING."""
    if pointer == "":
        return document
    value = document
    for step in pointer[1:].split("/"):
        step = step.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict) and step in value:
            value = value[step]
        elif isinstance(value, list) and step.isdigit() and (step == "0" or not step.startswith("0")) \
                and int(step) < len(value):
            value = value[int(step)]
        else:
            return MISSING
    return value


def result_of(status: int, content_type: str, body: bytes, endpoint: HttpEndpoint, forms: list[str]) -> dict:
    text = body.decode("utf-8", "replace")
    if 300 <= status < 400:  # not followed: the endpoint the operator configured is the one that answers
        raise ToolError(f"the endpoint answered HTTP {status}, a redirect, which is not followed",
                        error_type="HttpError")
    if status >= 400:
        excerpt = _excerpt(text, forms)
        raise ToolError(f"the endpoint answered HTTP {status}" + (f": {excerpt}" if excerpt else ""),
                        error_type="HttpError", transient=status in TRANSIENT_STATUSES)
    media = content_type.split(";")[0].strip().lower()
    pointer = (endpoint.response or {}).get("pointer", "")
    if (media == "application/json" or media.endswith("+json")) and len(body) <= ANSWER_JSON_MAX_BYTES:
        try:
            value = json_parse(text, max_nodes=ANSWER_JSON_MAX_NODES)
        except ValueError:  # not JSON, or not a value the platform can store and read back
            value = MISSING
        if value is not MISSING:
            value = _resolve_pointer(value, pointer) if pointer else value
            if value is MISSING:
                raise ToolError(f"the endpoint's answer has nothing at {pointer}", error_type="HttpError")
            return _result(scrub(value, forms))
    return _result(scrub(text, forms) if text else None)


def _result(value) -> dict:
    """The answer as a result; built here, so that an answer shaped like a result is still only data."""
    if value is None or isinstance(value, str):
        return tool_result(value)
    return {"state": "success", "content": [{"type": "text", "text": json.dumps(value, ensure_ascii=False)}],
            "structured": value}


def _failure(exc: Exception, forms: list[str]) -> ToolError:
    if (refused := _refusal(exc)) is not None:
        return ToolError(_excerpt(str(refused), forms), error_type="OutboundRefused")
    if isinstance(exc, httpx2.TimeoutException):
        return ToolError("the endpoint did not answer in time", error_type="TimedOut", transient=True)
    if isinstance(exc, httpx2.TransportError):
        what = _excerpt(str(exc), forms) or type(exc).__name__
        if isinstance(exc, ResponseTooLarge):  # stays too large on another attempt
            return ToolError(f"the endpoint's answer was refused: {what}", error_type="HttpError")
        return ToolError(f"the endpoint could not be reached: {what}", error_type="HttpUnavailable", transient=True)
    if isinstance(exc, httpx2.HTTPError | httpx2.InvalidURL | ValueError | TypeError):
        return ToolError(f"the request could not be made: {_excerpt(str(exc), forms)}", error_type="HttpError")
    raise exc


def _provider_token(endpoint: HttpEndpoint, ctx, refused: str | None = None) -> str:
    """The token of the tool's OAuth provider for this call (the caller's own, or the service account's); a new
    one when the API `refused` the one sent."""
    provider = endpoint.oauth_provider
    try:
        if refused is not None:
            return vault.token_refused(upstream=provider, session=ctx.session, token=refused)
        return vault.call_token(upstream=provider, session=ctx.session)
    except vault.AccountNeeded as exc:
        raise ToolError(str(exc), error_type=exc.error_type) from None
    except OAuthFailed as exc:
        raise ToolError(f"no token could be got from the OAuth provider {provider.name!r}: {exc}",
                        error_type="UpstreamUnavailable") from None


def _tenant_of(tool: Tool, ctx) -> str:
    """The tool's tenant's slug for the metrics: the call's tenant when its context holds it."""
    slug = getattr(getattr(ctx, "tenant", None), "slug", None)
    return slug if isinstance(slug, str) else tenant_slug(tool.tenant_id)


class HttpSource:
    kinds = ("http",)

    def definitions(self, tenant):
        return ()  # HTTP tools are rows operators create (http_tool_create), not offered by code

    def invoke(self, tool, arguments, ctx):
        endpoint = (HttpEndpoint.objects.for_tenant(tool.tenant_id).select_related("oauth_provider__tenant")
                    .filter(tool_id=tool.pk).first())
        if endpoint is None:
            raise ToolError(f"{tool.name} has no endpoint configured", error_type="ToolNotAvailable")
        try:
            secrets = dict(endpoint.secrets or {})
        except SecretUnreadable:
            raise ToolError("the endpoint's stored secrets cannot be read with the platform's keys; an operator "
                            "must enter them again", error_type="ToolNotAvailable") from None
        request = request_of(endpoint, arguments if isinstance(arguments, dict) else {}, secrets)
        token = None
        if endpoint.oauth_provider_id is not None:
            if not providers.url_under(request["url"], endpoint.oauth_provider.api_url):  # it moved since
                raise ToolError(f"the OAuth provider {endpoint.oauth_provider.name!r} sends its tokens under "
                                f"{endpoint.oauth_provider.api_url} only, and this tool's URL is elsewhere",
                                error_type="OutboundRefused")
            token = _provider_token(endpoint, ctx)
            request["headers"]["Authorization"] = f"Bearer {token}"
            secrets["Authorization"] = token  # hidden from answers that echo it, as a stored secret is
        forms = _secret_forms(secrets)
        call = getattr(ctx, "call", None)
        with child_span(call_trace(call) if call is not None else None, request["method"], {
                "http.request.method": request["method"], "toolkeeper.http_tool": tool.name}, client=True) as span:
            _traced(request)
            try:
                return self._answer(endpoint, request, secrets, forms, token, tool, ctx)
            except ToolError as exc:
                span_error(span, exc.error_type)
                raise

    def _answer(self, endpoint, request, secrets, forms, token, tool, ctx) -> dict:
        try:
            check_url(request["url"])
            with metrics.upstream_request("http", tenant=_tenant_of(tool, ctx), server=tool.name) as sent:
                status, content_type, body = _send(request, timeout_s=tool.timeout_s + BACKSTOP_S,
                                                   cancelled=getattr(ctx, "cancel_signal", None))
                if status >= 500:
                    sent.failed()
            if status == 401 and token is not None:
                # Refused before its recorded end (revoked or replaced at the authorization server): renewed once
                # and sent again. A 401 means the API did nothing with the request, so sending it again is safe.
                renewed = _provider_token(endpoint, ctx, refused=token)
                if renewed != token:  # the same one again (renewed moments ago): the API's 401 stands
                    request["headers"]["Authorization"] = f"Bearer {renewed}"
                    forms = _secret_forms({**secrets, "Renewed": renewed})
                    with metrics.upstream_request("http", tenant=_tenant_of(tool, ctx), server=tool.name) as sent:
                        status, content_type, body = _send(request, timeout_s=tool.timeout_s + BACKSTOP_S,
                                                           cancelled=getattr(ctx, "cancel_signal", None))
                        if status >= 500:
                            sent.failed()
        except ToolError:
            raise
        except Exception as exc:
            raise _failure(exc, forms) from None
        return result_of(status, content_type, body, endpoint, forms)


def _traced(request: dict) -> None:
    """Our span's `traceparent` on the request, in place of any header of that name the tool's configuration has
    (no one else speaks for our trace); without a span, the headers are left as they are."""
    traceparent = current_traceparent()
    if traceparent is not None:
        request["headers"] = {name: value for name, value in request["headers"].items()
                              if name.lower() != TRACEPARENT} | {TRACEPARENT: traceparent}


register_source(HttpSource())


# --- create, update, delete --------------------------------------------------------------------

def _origin(url: str) -> str:
    match = re.match(r"(?i)([a-z][a-z0-9+.-]*://[^/?#]*)", url or "")
    return match.group(1).lower() if match else ""


def _check_tool(tenant, values: dict, errors: dict, tool: Tool | None) -> None:
    name = values["name"]
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        errors["name"] = ["1-64 letters, digits, '_' or '-'"]
    elif tool_name_reserved(name):
        errors["name"] = [f"{name!r} is reserved for a tool of the platform"]
    elif Tool.objects.for_tenant(tenant).filter(name=name).exclude(pk=getattr(tool, "pk", None)).exists():
        errors["name"] = [f"a tool named {name!r} exists"]
    if not isinstance(values["description"], str) or len(values["description"]) > DESCRIPTION_MAX \
            or json_problem(values["description"]):
        errors["description"] = [f"text of at most {DESCRIPTION_MAX} characters"]
    flags_check(values, ("read_only", "destructive", "idempotent", "enabled"), errors)
    seconds_check(values, "timeout_s", TIMEOUT_RANGE, errors)
    schema = declared_object_schema(values["input_schema"], errors, "input_schema")
    if schema is not None:
        values["input_schema"] = schema


def _check_placeholders(template, field: str, properties: set[str], errors: dict, *, secrets=None) -> None:
    """Arguments in templates name properties of the input schema; secrets are named in headers only."""
    problems = []
    for secret, name in _placeholders(template):
        if secret and secrets is None:
            problems.append(f"{{secret:{name}}}: secrets may be used in headers only")
        elif secret and name not in secrets:
            problems.append(f"{{secret:{name}}} names no stored secret")
        elif not secret and secrets is not None:
            problems.append(f"{{{name}}}: headers take secrets ({{secret:NAME}}), not arguments")
        elif not secret and (not ARGUMENT.fullmatch(name) or name not in properties):
            problems.append(f"{{{name[:60]}}} names no property of the input schema")
    if problems:
        errors.setdefault(field, []).extend(dict.fromkeys(problems))


def _check_url(values: dict, properties: set[str], errors: dict) -> None:
    url = values["url"]
    if not isinstance(url, str) or not url:
        errors["url"] = ["the endpoint's URL (http or https)"]
        return
    if len(url) > URL_MAX:
        errors["url"] = [f"at most {URL_MAX} characters"]
        return
    authority = re.match(r"(?i)[a-z][a-z0-9+.-]*://[^/?#]*", url)
    if authority is None:
        errors["url"] = ["an absolute http or https URL"]
        return
    if "{" in authority.group(0) or "}" in authority.group(0):
        errors["url"] = ["placeholders may stand in the path and the query, not in the scheme or the host"]
        return
    if "#" in url:
        errors["url"] = ["the URL may not have a fragment"]
        return
    try:
        check_url(PLACEHOLDER.sub("x", url), resolve=True)
    except OutboundRefused as exc:
        errors["url"] = [str(exc)]
        return
    _check_placeholders(url, "url", properties, errors)


def _check_query(query, properties: set[str], errors: dict) -> None:
    if not isinstance(query, dict) or len(query) > QUERY_MAX or not all(
            isinstance(name, str) and 0 < len(name) <= 128 and isinstance(value, str) and len(value) <= TEMPLATE_MAX
            for name, value in query.items()) or json_problem(query):
        errors["query"] = [f"a JSON object of at most {QUERY_MAX} parameter names and templates "
                           f"(text of at most {TEMPLATE_MAX} characters, e.g. \"{{q}}\")"]
        return
    _check_placeholders(query, "query", properties, errors)


def _check_body(values: dict, properties: set[str], errors: dict) -> None:
    body = values["body"]
    if body is None:
        return
    if values["method"] not in BODY_METHODS:
        errors["body"] = [f"{values['method']} sends no body"]
        return
    if problem := json_problem(body):
        errors["body"] = [problem]
        return
    if len(json.dumps(body, separators=(",", ":")).encode()) > BODY_MAX:
        errors["body"] = [f"at most {BODY_MAX} bytes of JSON"]
        return
    _check_placeholders(body, "body", properties, errors)


def _check_headers(headers, secrets: dict, errors: dict) -> None:
    """As an MCP server's headers (names, values, the transport's own refused), and secrets named exist."""
    if check_header_values(headers, errors) is not None:
        _check_placeholders(headers, "headers", set(), errors, secrets=secrets)


def _merged_secrets(stored: dict, changes, errors: dict) -> dict:
    """The stored secrets with `changes` applied: a value sets or replaces one, null removes it."""
    if not isinstance(changes, dict):
        errors["secrets"] = ["a JSON object of secret names and values (null removes one)"]
        return dict(stored)
    merged, problems = dict(stored), []
    for name, value in changes.items():
        if not isinstance(name, str) or not SECRET_NAME.fullmatch(name):
            problems.append(f"{str(name)[:60]!r} is not a secret name (1-64 letters, digits, '_', '.' or '-')")
        elif value is None:
            merged.pop(name, None)
        elif not isinstance(value, str) or not value or len(value) > SECRET_VALUE_MAX \
                or not HEADER_VALUE.fullmatch(value):
            # never echo the value: it is a credential
            problems.append(f"the value of {name} must be 1-{SECRET_VALUE_MAX} visible ASCII characters, "
                            "without line breaks")
        else:
            merged[name] = value
    if len(merged) > SECRETS_MAX:
        problems.append(f"at most {SECRETS_MAX} secrets")
    if problems:
        errors["secrets"] = problems
    return merged


def _check_response(response, errors: dict) -> None:
    if not isinstance(response, dict) or set(response) - {"pointer"}:
        errors["response"] = ['a JSON object, e.g. {"pointer": "/data"} (a JSON pointer to the part of a JSON '
                              'answer that is the result)']
        return
    pointer = response.get("pointer", "")
    if not isinstance(pointer, str) or len(pointer) > POINTER_MAX or (pointer and not pointer.startswith("/")) \
            or json_problem(pointer):
        errors["response"] = [f"pointer: a JSON pointer (\"/data/items\") of at most {POINTER_MAX} characters"]


def _check_provider(tenant, values: dict, errors: dict) -> OAuthProvider | None:
    """The OAuth provider the tool names (its name, or null for the tenant's credential)."""
    name = values["oauth_provider"]
    if name is None or name == "":
        return None
    provider = OAuthProvider.objects.for_tenant(tenant).filter(name=name).first() if isinstance(name, str) else None
    if provider is None:
        errors["oauth_provider"] = ["the name of one of the tenant's OAuth providers, or null"]
        return None
    if any(str(header).lower() == "authorization" for header in (values["headers"] or {})):
        errors["headers"] = ["the OAuth provider's token is the Authorization header: leave it out of the headers"]
    if isinstance(values["url"], str) and not providers.url_under(values["url"], provider.api_url):
        errors["oauth_provider"] = [f"its tokens go to URLs under {provider.api_url} only: this tool's URL is "
                                    "elsewhere"]
    return provider


def http_tool_check(tenant, changes: dict, tool: Tool | None = None) -> tuple[dict, dict, dict]:
    """The tool's and the endpoint's fields after `changes`, and the secrets, checked whole; ServiceError
    naming each refused field."""
    unknown = set(changes) - set(FIELDS)
    if unknown:
        raise ServiceError({name: ["not a field of an HTTP tool"] for name in sorted(unknown)})
    if tool is None:
        current = {"name": "", "description": "", "input_schema": {"type": "object", "properties": {}},
                   "read_only": False, "destructive": False, "idempotent": False, "timeout_s": 30.0,
                   "enabled": True, "method": "POST", "url": "", "query": {}, "body": None, "headers": {},
                   "response": {}, "oauth_provider": None}
        stored = {}
    else:
        endpoint = tool.http
        current = {**{name: getattr(tool, name) for name in TOOL_FIELDS}, "method": endpoint.method,
                   "url": endpoint.url_template, "query": endpoint.query, "body": endpoint.body,
                   "headers": endpoint.headers, "response": endpoint.response,
                   "oauth_provider": endpoint.oauth_provider.name if endpoint.oauth_provider_id else None}
        try:
            stored = dict(endpoint.secrets or {})
        except SecretUnreadable:
            stored = {}  # unreadable: only new values can be used
    values = {**current, **{k: v for k, v in changes.items() if k != "secrets"}}
    if values["query"] is None:
        values["query"] = {}
    if values["headers"] is None:
        values["headers"] = {}
    if values["response"] is None:
        values["response"] = {}
    errors: dict = {}
    _check_tool(tenant, values, errors, tool)
    if values["method"] not in METHODS:
        errors["method"] = [f"one of: {', '.join(METHODS)}"]
    properties = set((values["input_schema"] or {}).get("properties") or {}) if "input_schema" not in errors else set()
    secrets = _merged_secrets(stored, changes.get("secrets", {}), errors)
    _check_url(values, properties, errors)
    _check_query(values["query"], properties, errors)
    if "method" not in errors:
        _check_body(values, properties, errors)
    _check_headers(values["headers"], secrets, errors)
    _check_response(values["response"], errors)
    provider = _check_provider(tenant, values, errors)
    if tool is not None and "url" not in errors and _origin(values["url"]) != _origin(tool.http.url_template):
        kept = sorted(name for name in stored if name in secrets and name not in (changes.get("secrets") or {}))
        if kept:
            errors.setdefault("secrets", []).append(
                f"the URL now points at another host: send the secrets again ({', '.join(kept)}), or remove them "
                "(stored secrets are only sent where they were entered for)")
    if errors:
        raise ServiceError(errors)
    tool_values = {name: values[name] for name in TOOL_FIELDS}
    endpoint_values = {"method": values["method"], "url_template": values["url"], "query": values["query"],
                       "body": values["body"], "headers": values["headers"], "response": values["response"],
                       "oauth_provider": provider}
    return tool_values, endpoint_values, secrets


def _source_ref(endpoint_values: dict) -> str:
    return f"{endpoint_values['method']} {endpoint_values['url_template']}"[:255]


def _described(tool_values: dict, endpoint_values: dict, secrets: dict) -> dict:
    """What the audit log may hold: never a secret's value, nor a header's."""
    return {"source": ToolSource.HTTP, "method": endpoint_values["method"], "url": endpoint_values["url_template"],
            "query": sorted(endpoint_values["query"]), "header_names": sorted(endpoint_values["headers"]),
            "secret_names": sorted(secrets), "enabled": tool_values["enabled"],
            "oauth_provider": endpoint_values["oauth_provider"].name if endpoint_values["oauth_provider"] else None}


@transaction.atomic
def http_tool_create(*, tenant, actor=None, **fields) -> Tool:
    tool_values, endpoint_values, secrets = http_tool_check(tenant, fields)
    tool = Tool.objects.create(tenant=tenant, source=ToolSource.HTTP, source_ref=_source_ref(endpoint_values),
                               trusted=True, **tool_values)
    HttpEndpoint.objects.create(tenant=tenant, tool=tool, secrets=secrets or None, **endpoint_values)
    audit_record(tenant=tenant, actor=actor, verb="tool.created", target=f"tool:{tool.name}",
                 data=_described(tool_values, endpoint_values, secrets))
    return tool


def _http_tool(tool: Tool) -> Tool:
    if tool.source != ToolSource.HTTP or not HttpEndpoint.objects.for_tenant(tool.tenant_id).filter(
            tool_id=tool.pk).exists():
        raise ServiceError("this tool is not an HTTP tool")
    return tool


@transaction.atomic
def http_tool_update(*, tool: Tool, actor=None, **changes) -> Tool:
    """Change any field; `secrets` sets, replaces (a value) or removes (null) the secrets it names, the others
    stay. The tool is saved whatever changed, so the catalog's version moves with the endpoint."""
    _http_tool(tool)
    tool_values, endpoint_values, secrets = http_tool_check(tool.tenant, changes, tool)
    endpoint = tool.http
    changed = sorted(name for name, value in tool_values.items() if getattr(tool, name) != value)
    changed += sorted({"url_template": "url"}.get(name, name) for name, value in endpoint_values.items()
                      if getattr(endpoint, name) != value)
    secret_changes = sorted(changes.get("secrets") or {})
    old_name = tool.name
    for name, value in tool_values.items():
        setattr(tool, name, value)
    tool.source_ref = _source_ref(endpoint_values)
    tool.save()
    for name, value in endpoint_values.items():
        setattr(endpoint, name, value)
    if secret_changes:
        endpoint.secrets = secrets or None
    endpoint.save()
    audit_record(tenant=tool.tenant, actor=actor, verb="tool.updated", target=f"tool:{old_name}",
                 data={"fields": changed, "secrets_changed": secret_changes,
                       **_described(tool_values, endpoint_values, secrets)})
    return tool


@transaction.atomic
def http_tool_delete(*, tool: Tool, actor=None) -> None:
    """The tool and its endpoint go; its calls keep their record (with the tool's name)."""
    _http_tool(tool)
    audit_record(tenant=tool.tenant, actor=actor, verb="tool.deleted", target=f"tool:{tool.name}",
                 data={"source": ToolSource.HTTP})
    tool.delete()


# --- importing the operations of an OpenAPI document -------------------------------------------

IMPORT_MAX_BYTES = 1024 * 1024
# values (scalars, keys, lists, mappings) of a document; a realistic OpenAPI document of IMPORT_MAX_BYTES holds
# about 50,000 (indented JSON) to 95,000 (compact JSON, YAML): docs/notes/entry-and-admission.md,
# "Documents from tenants"
IMPORT_MAX_NODES = 200_000
IMPORT_OPERATIONS_MAX = 200
# values in the input schemas of the tools one import makes, together (checking them costs about 40 µs a value);
# the 200 operations of a realistic document hold about 5,000
IMPORT_SCHEMA_VALUES_MAX = 20_000
PREFIX = re.compile(r"[a-zA-Z0-9_-]{0,32}")


def _refused(field: str, message: str) -> ServiceError:
    return ServiceError({field: [message]})


def openapi_parse(text: str) -> dict:
    """An OpenAPI 3 document (JSON or YAML) as plain JSON values, read by `common.documents` within the
    import's bounds (size, nesting, values; YAML anchors and aliases refused), which stop the reading early."""
    try:
        value = document_parse(text, max_bytes=IMPORT_MAX_BYTES, max_nodes=IMPORT_MAX_NODES)
    except DocumentRefused as exc:
        raise _refused("document", f"the document is {exc}" if exc.kind in ("size", "nesting", "nodes")
                       else str(exc)) from None
    except ValueError as exc:  # JSON's, saying what is wrong
        raise _refused("document", str(exc)[:500]) from None
    try:
        value = json.loads(json.dumps(value, default=str))  # dates and the like as text, keys as strings
    except (TypeError, ValueError):
        raise _refused("document", "mapping keys must be text, numbers, true, false or null") from None
    if not isinstance(value, dict) or not str(value.get("openapi", "")).startswith("3") \
            or not isinstance(value.get("paths"), dict):
        raise _refused("document", 'an OpenAPI 3 document: an object with "openapi": "3.x" and "paths"')
    if problem := json_problem(value):
        raise _refused("document", problem)
    return value


def _local(document: dict, value, depth: int = 0):
    """`value`, or what its local `$ref` ("#/components/...") names, followed a few times at most."""
    while isinstance(value, dict) and isinstance(value.get("$ref"), str) and depth < 8:
        ref = value["$ref"]
        value = _resolve_pointer(document, ref[1:]) if ref.startswith("#/") else MISSING
        depth += 1
    return None if value is MISSING or (isinstance(value, dict) and "$ref" in value) else value


class _BudgetSpent(Exception):
    """The input schemas of one import's tools reached IMPORT_SCHEMA_VALUES_MAX."""


COMPONENT = "#/components/schemas/"


class _SchemaCopies:
    """The input schemas of one import's tools, copied from the document with their references to components
    rewritten to `$defs`: each tool carries the components it references (and those reference), no others.
    Every value copied counts against IMPORT_SCHEMA_VALUES_MAX: checking a schema costs about 40 µs a value,
    and a component that every operation references is copied into each of them."""

    def __init__(self, document: dict):
        components = document.get("components")
        schemas = components.get("schemas") if isinstance(components, dict) else None
        self.components = schemas if isinstance(schemas, dict) else {}
        self.left = IMPORT_SCHEMA_VALUES_MAX
        self.found: list[str] = []  # components named by what was copied since the last `defs`

    def spend(self, values: int) -> None:
        self.left -= values
        if self.left < 0:
            raise _BudgetSpent

    def schema(self, value) -> dict:
        """A parameter's or a property's schema (a non-object is none: {}), copied."""
        return self.copy(value if isinstance(value, dict) else {})

    def copy(self, value):
        """`value` rewritten, its values counted, the components it names noted."""
        if isinstance(value, dict):
            self.spend(1 + 2 * len(value))  # the mapping, its keys and its values, as a document's are counted
            copied = {}
            for key, item in value.items():
                if key == "$ref" and isinstance(item, str):
                    if item.startswith(COMPONENT):
                        self.found.append(item[len(COMPONENT):].split("/")[0].replace("~1", "/").replace("~0", "~"))
                    copied[key] = item.replace(COMPONENT, "#/$defs/")
                else:
                    copied[key] = self.copy(item)
            return copied
        if isinstance(value, list):
            self.spend(1 + len(value))
            return [self.copy(item) for item in value]
        return value

    def defs(self) -> dict:
        """The components named since the last call, with those they name, in the order they were named."""
        carried, queue, seen, taken = {}, [], set(), 0
        while True:
            queue += [name for name in self.found if name not in seen and not seen.add(name)]
            self.found = []
            if taken == len(queue):
                return carried
            name, taken = queue[taken], taken + 1
            if name in self.components:  # a reference to nothing is left for the schema's check to name
                carried[name] = self.copy(self.components[name])


def _operation_tool(document: dict, path: str, method: str, operation: dict, base_url: str, prefix: str,
                    copies: _SchemaCopies):
    """The fields of the HTTP tool for one operation, or (None, why not)."""
    raw = operation.get("operationId") if isinstance(operation.get("operationId"), str) else f"{method}_{path}"
    name = (prefix + re.sub(r"[^A-Za-z0-9_-]+", "_", raw).strip("_"))[:64]
    copies.found = []
    try:
        return name, *_operation_fields(document, path, method, operation, base_url, name, copies)
    except _BudgetSpent:
        return name, None, (f"the input schemas of one import's tools hold at most {IMPORT_SCHEMA_VALUES_MAX} "
                            "values together: import this operation in another request (operations)")


def _operation_fields(document: dict, path: str, method: str, operation: dict, base_url: str, name: str,
                      copies: _SchemaCopies) -> tuple[dict | None, str]:
    properties, required, query, body = {}, [], {}, None
    shared, own = document["paths"][path].get("parameters"), operation.get("parameters")
    parameters = [*(shared if isinstance(shared, list) else []), *(own if isinstance(own, list) else [])]
    for parameter in (_local(document, p) for p in parameters):
        if not isinstance(parameter, dict) or not isinstance(parameter.get("name"), str):
            return None, "a parameter could not be read"
        where, pname = parameter.get("in"), parameter["name"]
        if where in ("header", "cookie"):
            if parameter.get("required"):
                return None, f"it needs the {where} {pname[:60]}, which an HTTP tool takes from no argument"
            continue
        if where not in ("path", "query") or not ARGUMENT.fullmatch(pname):
            return None, f"the parameter {pname[:60]!r} cannot be an argument"
        properties[pname] = {**copies.schema(_local(document, parameter.get("schema"))),
                             **({"description": parameter["description"][:1000]}
                                if isinstance(parameter.get("description"), str) else {})}
        if where == "path" or parameter.get("required") is True:
            required.append(pname)
        if where == "query":
            query[pname] = "{" + pname + "}"
    request_body = _local(document, operation.get("requestBody"))
    if isinstance(request_body, dict):
        content = request_body.get("content") if isinstance(request_body.get("content"), dict) else {}
        media = content.get("application/json")
        schema = _local(document, media.get("schema")) if isinstance(media, dict) else None
        if schema is None:
            if request_body.get("required"):
                return None, "its body is not JSON"
        elif method.upper() not in BODY_METHODS:
            return None, f"{method.upper()} sends no body"
        elif not isinstance(schema.get("properties"), dict) or not schema["properties"]:
            return None, "its JSON body is not an object with properties"
        else:
            body = {}
            for pname, pschema in schema["properties"].items():
                if pname in properties or not ARGUMENT.fullmatch(pname):
                    return None, f"the body's property {pname[:60]!r} cannot be an argument"
                properties[pname] = copies.schema(_local(document, pschema))
                body[pname] = "{" + pname + "}"
            listed = schema.get("required") if isinstance(schema.get("required"), list) else []
            copies.spend(len(listed))
            required += [r for r in listed if isinstance(r, str) and r in body]
    input_schema = {"type": "object", "properties": properties, "required": sorted(set(required))}
    if defs := copies.defs():
        input_schema["$defs"] = defs
    description = next((operation[k] for k in ("summary", "description") if isinstance(operation.get(k), str)), "")
    return {"name": name, "description": description[:DESCRIPTION_MAX], "input_schema": input_schema,
            "method": method.upper(), "url": base_url.rstrip("/") + path, "query": query, "body": body,
            "read_only": method.upper() == "GET", "idempotent": method.upper() in ("GET", "PUT", "DELETE"),
            "destructive": method.upper() == "DELETE"}, ""


def _messages(exc: ServiceError) -> str:
    fields = exc.fields
    if not fields:
        return str(exc.detail)
    return "; ".join(f"{field}: {' '.join(messages)}" for field, messages in fields.items())


def http_tools_import(*, tenant, document: str, prefix: str = "", base_url: str = "", operations=None,
                      headers=None, secrets=None, oauth_provider=None, timeout_s: float = 30.0,
                      actor=None) -> list[dict]:
    """One HTTP tool per operation of an OpenAPI 3 document (those in `operations`, by operationId or
    "METHOD /path", or all): its path and query parameters and the properties of its JSON body are the
    arguments. Each is created as `http_tool_create` would, or reported with why not; `headers`, `secrets` and
    `oauth_provider` go to every tool made. Returns one entry per operation looked at."""
    if not isinstance(prefix, str) or not PREFIX.fullmatch(prefix):
        raise _refused("prefix", "0-32 letters, digits, '_' or '-'")
    parsed = openapi_parse(document)
    servers = parsed.get("servers") if isinstance(parsed.get("servers"), list) else []
    base = base_url or next((s.get("url") for s in servers if isinstance(s, dict) and isinstance(s.get("url"), str)),
                            "")
    if not isinstance(base, str) or not re.match(r"(?i)https?://", base):
        raise _refused("base_url", "the API's absolute http(s) URL: the document names none")
    wanted = set(operations) if operations else None
    report, looked_at, copies = [], 0, _SchemaCopies(parsed)
    for path, item in parsed["paths"].items():
        if not isinstance(item, dict):
            continue
        for method in ("get", "post", "put", "patch", "delete"):
            operation = item.get(method)
            if not isinstance(operation, dict):
                continue
            key = f"{method.upper()} {path}"
            if wanted is not None and key not in wanted and operation.get("operationId") not in wanted:
                continue
            looked_at += 1
            if looked_at > IMPORT_OPERATIONS_MAX:
                report.append({"operation": key, "name": "", "created": False, "id": None,
                               "reason": f"only {IMPORT_OPERATIONS_MAX} operations are imported at once"})
                continue
            name, fields, reason = _operation_tool(parsed, path, method, operation, base, prefix, copies)
            if fields is not None:
                try:
                    with transaction.atomic():
                        tool = http_tool_create(tenant=tenant, actor=actor, timeout_s=timeout_s,
                                                headers=headers or {}, secrets=secrets or {},
                                                oauth_provider=oauth_provider, **fields)
                except ServiceError as exc:
                    reason = _messages(exc)
                else:
                    report.append({"operation": key, "name": name, "created": True, "id": tool.http.pk,
                                   "reason": ""})
                    continue
            report.append({"operation": key, "name": name, "created": False, "id": None, "reason": reason[:1000]})
    return report
