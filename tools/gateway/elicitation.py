"""Questions for the session's user over /mcp/ (docs/mcp.md, "Elicitation"): a call `awaiting_user` asks through
the client's form elicitation when the client has it.

The endpoint is stateless, so the SDK cannot send a server→client request. A 2026-era `tools/call` gets an
`input_required` result carrying the elicitation; the client's retry (same tool and arguments, same session)
attaches to the call and brings the answer in `inputResponses`. On a 2025-era connection the request is written
on the tools/call's own response stream with an id minted here: signed, naming the session, the call and the
question, so the client's answer (a JSON-RPC response POSTed to the endpoint, to any server process) is applied
through the database, by whichever process receives it.
"""
from __future__ import annotations

import logging

from django.core import signing
from mcp import types
from mcp.shared.jsonrpc_dispatcher import _plan_outbound  # the SDK's own routing of a message to a request
from mcp_types import JSONRPCRequest

from common.errors import Conflict, NotPermitted, ServiceError
from tenancy.fastread import fetch_one
from tools.calls.questions import answer_permitted, call_answer, public_question
from tools.models import CallStatus, ToolCall

logger = logging.getLogger("toolkeeper.mcp")

FORM_ELICITATION = "mcp_form_elicitation"  # in its context: the connection's client answers forms
ID_PREFIX = "tk-ask."
_SIGNER = signing.Signer(salt="toolkeeper.mcp.elicitation")


def elicits_forms(message) -> bool:
    """Whether a 2025-era `initialize` says the client shows forms (`elicitation: {}` is form mode too)."""
    params = message.get("params") if isinstance(message, dict) else None
    capabilities = params.get("capabilities") if isinstance(params, dict) else None
    elicitation = capabilities.get("elicitation") if isinstance(capabilities, dict) else None
    if not isinstance(elicitation, dict):
        return False
    return not elicitation or isinstance(elicitation.get("form"), dict)


def client_elicits_forms(ctx, session) -> bool:
    """A 2026-era request carries the client's capabilities; a 2025-era connection said them at `initialize`."""
    capabilities = getattr(ctx.session, "client_capabilities", None)
    elicitation = getattr(capabilities, "elicitation", None) if capabilities is not None else None
    if elicitation is not None:
        return getattr(elicitation, "form", None) is not None or getattr(elicitation, "url", None) is None
    return bool(session.context.get(FORM_ELICITATION))


def question_key(call: ToolCall) -> str:
    """The id of this call's current question for its session: unguessable, and good for this question only."""
    question = call.question or {}
    return ID_PREFIX + _SIGNER.sign(f"{call.session_id}|{call.pk}|{question.get('expires_at', '')}")


def _asked(session_pk, key) -> tuple[str, str] | None:
    """(call id, question's deadline) that `key` names for this session, or None when it names nothing of it."""
    if not isinstance(key, str) or not key.startswith(ID_PREFIX):
        return None
    try:
        session_id, call_pk, expires = _SIGNER.unsign(key[len(ID_PREFIX):]).split("|", 2)
    except (signing.BadSignature, ValueError):
        return None
    return (call_pk, expires) if session_id == str(session_pk) else None


def answered_call(caller, key) -> ToolCall | None:
    """The session's call a question's id names (whatever it became since), or None."""
    asked = _asked(caller.session.pk, key)
    return fetch_one(ToolCall, tenant=caller.session.tenant_id, pk=asked[0]) if asked is not None else None


def is_answer(message) -> bool:
    """Whether a POSTed message is a client's response to a question asked here (a 2025-era connection)."""
    return (isinstance(message, dict) and "method" not in message and ("result" in message or "error" in message)
            and isinstance(message.get("id"), str) and message["id"].startswith(ID_PREFIX))


def elicit_params(call: ToolCall) -> types.ElicitRequestFormParams:
    question = public_question(call) or {}
    return types.ElicitRequestFormParams(message=question.get("message", ""),
                                         requested_schema=question.get("requestedSchema") or {"type": "object"})


def input_required(call: ToolCall) -> types.InputRequiredResult:
    """A 2026-era answer: the question, for the client to ask and send back with its retry."""
    return types.InputRequiredResult(input_requests={
        question_key(call): types.ElicitRequest(params=elicit_params(call))})


def answer_apply(caller, key, result, *, actor: str) -> bool:
    """Apply the client's answer to the question `key` names: an ElicitResult's fields (`result`), or None
    for an error (the client could not ask: a cancel). False when it names no open question of the session."""
    asked = _asked(caller.session.pk, key)
    if asked is None:
        return False
    call_pk, expires = asked
    call = fetch_one(ToolCall, tenant=caller.session.tenant_id, pk=call_pk)
    if call is None or call.status != CallStatus.AWAITING_USER or (call.question or {}).get("expires_at") != expires:
        return False
    result = result if isinstance(result, dict) else {}
    action = result.get("action") if result.get("action") in ("accept", "decline", "cancel") else "cancel"
    content = result.get("content") if isinstance(result.get("content"), dict) else None
    try:
        # as over REST: a verified person's question is answered by their own client only, not by another key
        # that may name their session
        answer_permitted(session=caller.session, api_key=caller.api_key)
        call_answer(call=call, action=action, content=content, actor=None, responder=actor)
    except (Conflict, NotPermitted, ServiceError):
        return False
    return True


def input_responses_apply(caller, responses, *, actor: str) -> None:
    """A 2026-era retry's `inputResponses`: each answer to a question asked here."""
    for key, response in (responses or {}).items():
        fields = response.model_dump(by_alias=True, mode="json") if hasattr(response, "model_dump") else response
        answer_apply(caller, key, fields, actor=actor)


async def ask_on_stream(ctx, call: ToolCall) -> bool:
    """A 2025-era connection: write the question as an `elicitation/create` request on the tools/call's response
    stream (the stateless transport has no back channel of its own). False when the stream cannot carry it."""
    outbound = getattr(ctx.session, "_request_outbound", None)
    dispatcher = getattr(outbound, "_dispatcher", None)
    if dispatcher is None or outbound.request_id is None:
        return False
    params = elicit_params(call).model_dump(by_alias=True, mode="json", exclude_none=True)
    request = JSONRPCRequest(jsonrpc="2.0", id=question_key(call), method="elicitation/create", params=params)
    try:
        await dispatcher._write(request, _plan_outbound(outbound.request_id, None).metadata)
    except Exception:
        logger.info("a question could not be written on an MCP stream", exc_info=True)
        return False
    return True
