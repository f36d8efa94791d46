"""MCP prompts on `/mcp/` (docs/mcp.md#prompts, docs/governance.md#prompts): what a session is offered and how a
`prompts/get` is governed, whoever provides the prompts (`tools.catalog.registry.register_prompt_provider`: the
tenants' MCP servers, `tools.upstream.prompts`).

- **Listed**: the providers' prompts for the session, minus those an exposure filter hides by name (a deny rule
  that always refuses the agent and user the prompt's name, as it would a tool of that name).
- **Got**: a prompt not listed for the session now is refused as an unknown one (JSON-RPC -32602); so are
  arguments the prompt does not declare, a declared required one missing, and values that are not strings or
  are too long. Then the provider fetches the messages (outside the database pool: an upstream server may
  take its time) and they are passed through as they are. Each get, answered or failed, is audited
  (`mcp_prompt.got`) with the argument names, never their values.
- **Completed**: `completion/complete` of a prompt's argument is governed as a get is (a prompt the session is
  not offered is unknown; the argument must be one it declares, the value and the other arguments given so far
  are checked as a get's are), then the provider offers values (an upstream server that completes its prompts'
  arguments is asked with the server's credential); nothing is recorded, since nothing runs or is read.
"""
from __future__ import annotations

import asyncio

from mcp import types
from mcp.shared.exceptions import MCPError

from audit.services import audit_record
from common.json_values import json_problem
from tools.calls.waiting import run_db
from tools.catalog.registry import OfferedPrompt, PromptUnavailable, exposure_hidden, prompt_providers
from tools.models import AgentSession

COMPLETIONS_MAX = 100  # values in one answer (MCP's bound)
COMPLETION_VALUE_MAX = 1000  # characters of one value offered

ARGUMENT_VALUE_MAX = 16 * 1024  # characters of one argument's value
ARGUMENTS_TOTAL_MAX = 64 * 1024  # characters of all of them
NAME_SHOWN_MAX = 100  # of a name echoed in an error


def _hidden(session: AgentSession, names: list[str]) -> dict[str, str]:
    return exposure_hidden(tenant=session.tenant, agent=session.agent, user=session.user,
                           user_verified=session.user_verified, names=names)


def session_prompts(session: AgentSession) -> list[OfferedPrompt]:
    """The prompts the session is offered now, by name (a name two providers give: the first's)."""
    offered: dict[str, OfferedPrompt] = {}
    for provider in prompt_providers():
        for prompt in provider.prompts(session):
            offered.setdefault(prompt.name, prompt)
    hidden = _hidden(session, sorted(offered))
    return [offered[name] for name in sorted(offered) if name not in hidden]


def session_prompt(session: AgentSession, name: str) -> OfferedPrompt | None:
    """That prompt, ready to fetch, when the session is offered it now; else None."""
    if not isinstance(name, str) or not name or _hidden(session, [name]):
        return None
    for provider in prompt_providers():
        prompt = provider.prompt(session, name)
        if prompt is not None:
            return prompt
    return None


def prompt_listing(prompt: OfferedPrompt) -> types.Prompt:
    return types.Prompt.model_validate({
        "name": prompt.name, "description": prompt.description, **({"title": prompt.title} if prompt.title else {}),
        "arguments": [{"name": a["name"], "required": bool(a.get("required")),
                       **({"description": a["description"]} if a.get("description") else {})}
                      for a in prompt.arguments]})


def arguments_problem(prompt: OfferedPrompt, arguments, *, partial: bool = False) -> str:
    """Why these arguments cannot be sent for the prompt ("" when they can); `partial`: some may be still to come
    (a completion's), so none is missing."""
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return "arguments must be an object of names and string values"
    declared = {a["name"]: a for a in prompt.arguments}
    unknown = sorted(str(name)[:NAME_SHOWN_MAX] for name in arguments if name not in declared)
    if unknown:
        return f"{prompt.name} takes no argument {', '.join(repr(n) for n in unknown[:5])}"
    missing = [] if partial else sorted(name for name, a in declared.items()
                                        if a.get("required") and name not in arguments)
    if missing:
        return f"{prompt.name} needs the argument {', '.join(repr(n) for n in missing)}"
    total = 0
    for name, value in arguments.items():
        if not isinstance(value, str):
            return f"the argument {name!r} must be a string"
        if len(value) > ARGUMENT_VALUE_MAX:
            return f"the argument {name!r} is longer than {ARGUMENT_VALUE_MAX} characters"
        if json_problem(value):
            return f"the argument {name!r} holds a character that cannot be sent"
        total += len(value)
    if total > ARGUMENTS_TOTAL_MAX:
        return f"the arguments are longer than {ARGUMENTS_TOTAL_MAX} characters in all"
    return ""


def _audited(session: AgentSession, actor: str, prompt: OfferedPrompt, arguments: dict, error: str) -> None:
    audit_record(tenant=session.tenant, actor=actor, verb="mcp_prompt.got", target=prompt.target or prompt.name,
                 data={"prompt": prompt.name, "session": str(session.pk), "agent": session.agent,
                       "arguments": sorted(arguments), "ok": not error, **({"error": error} if error else {})})


def _unknown(name) -> MCPError:
    return MCPError(code=types.INVALID_PARAMS,
                    message=f"no prompt named {str(name)[:NAME_SHOWN_MAX]!r} is available in this session")


async def list_prompts(session: AgentSession) -> types.ListPromptsResult:
    offered = await run_db(session_prompts, session)
    return types.ListPromptsResult(prompts=[prompt_listing(prompt) for prompt in offered])


async def get_prompt(session: AgentSession, actor: str, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    prompt = await run_db(session_prompt, session, params.name)
    if prompt is None or prompt.fetch is None:
        raise _unknown(params.name)
    arguments = params.arguments if params.arguments is not None else {}
    if problem := arguments_problem(prompt, arguments):
        raise MCPError(code=types.INVALID_PARAMS, message=problem)
    try:
        got = await asyncio.to_thread(prompt.fetch, dict(arguments))
        result = types.GetPromptResult.model_validate(got)
    except PromptUnavailable as exc:
        await run_db(_audited, session, actor, prompt, arguments, str(exc))
        raise MCPError(code=types.INTERNAL_ERROR, message=str(exc)) from None
    except ValueError:  # what the provider handed back is no prompt result
        error = f"{prompt.name} answered with messages that cannot be used"
        await run_db(_audited, session, actor, prompt, arguments, error)
        raise MCPError(code=types.INTERNAL_ERROR, message=error) from None
    await run_db(_audited, session, actor, prompt, arguments, "")
    return result


async def complete_prompt_argument(session: AgentSession, name, argument, context) -> types.CompleteResult:
    """Values for one argument of an offered prompt (see the module's docstring)."""
    prompt = await run_db(session_prompt, session, name)
    if prompt is None:
        raise _unknown(name)
    argument_name, value = argument.get("name"), argument.get("value", "")
    if not any(a["name"] == argument_name for a in prompt.arguments):
        raise MCPError(code=types.INVALID_PARAMS,
                       message=f"{prompt.name} takes no argument {str(argument_name)[:NAME_SHOWN_MAX]!r}")
    given = {**(context or {}), argument_name: value}
    if problem := arguments_problem(prompt, given, partial=True):
        raise MCPError(code=types.INVALID_PARAMS, message=problem)
    values: list = []
    if prompt.complete is not None:
        try:
            values = await asyncio.to_thread(prompt.complete, {"name": argument_name, "value": value},
                                             dict(context or {}))
        except PromptUnavailable as exc:
            raise MCPError(code=types.INTERNAL_ERROR, message=str(exc)) from None
    offered = [v for v in values or () if isinstance(v, str) and len(v) <= COMPLETION_VALUE_MAX and not json_problem(v)]
    return types.CompleteResult(completion=types.Completion(values=offered[:COMPLETIONS_MAX],
                                                            has_more=len(offered) > COMPLETIONS_MAX))
