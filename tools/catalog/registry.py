"""The tool-source registry: how Python tools, built-ins and other apps' tools enter the catalog.

Apps that add tools (MCP servers, skills, knowledge) call `register_source(...)` from their
AppConfig.ready; `tools` never imports them (docs/architecture.md).
"""
import re
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

META_RESET_TOOLS = "reset_tools"
META_LOAD_SKILL = "load_skill_through_path"
META_SEARCH_TOOLS = "search_tools"
META_ENABLE_TOOLS = "enable_tools"
# The meta tools of the catalog itself (tools.catalog.meta), which no other app may provide.
CATALOG_META_TOOLS = frozenset({META_RESET_TOOLS, META_SEARCH_TOOLS, META_ENABLE_TOOLS})
# Names of the meta tools the platform puts on a session's surface; no tool of a source or a tenant
# may take one (compared as `tools.catalog.schemas.tool_name_reserved` does, so a look-alike cannot pass either).
RESERVED_TOOL_NAMES = CATALOG_META_TOOLS | {META_LOAD_SKILL}


@dataclass(frozen=True)
class ToolDefinition:
    name: str
    description: str
    input_schema: dict
    source: str
    source_ref: str = ""
    output_schema: dict | None = None
    read_only: bool = False
    trusted: bool = True
    destructive: bool = False
    idempotent: bool = False
    concurrency_safe: bool = True
    timeout_s: float = 30.0
    default_groups: tuple[str, ...] = field(default=())


class Source(Protocol):
    kinds: tuple[str, ...]

    def definitions(self, tenant) -> Iterable[ToolDefinition]:
        """The tools this source offers the tenant."""

    def invoke(self, tool, arguments: dict, ctx) -> Any:
        """Run one call; returns the tool's raw value or raises ToolError."""


_sources: list[Source] = []


SOURCE_KIND = re.compile(r"[a-z][a-z0-9_]{0,31}")  # fits Tool.source (tools.models.SOURCE_KIND_MAX)


def register_source(source: Source) -> None:
    """Add a source of tools; its kinds are what `Tool.source` holds for its tools. A kind is claimed once."""
    if source in _sources:
        return
    for kind in source.kinds:
        if not SOURCE_KIND.fullmatch(kind):
            raise ValueError(f"a source kind is 1-32 lowercase letters, digits or '_', starting with a letter: "
                             f"{kind!r}")
        holder = source_for(kind)
        if holder is not None:
            raise ValueError(f"the source kind {kind!r} is claimed by {type(holder).__qualname__}")
    _sources.append(source)


def sources() -> list[Source]:
    return list(_sources)


def source_for(kind: str) -> Source | None:
    for source in _sources:
        if kind in source.kinds:
            return source
    return None


# Other apps describe calls too (the approvals app adds each call's approval request). An
# annotator takes a list of calls and returns {call pk: {field: value}} in one query; `describes(call)`
# says, from the call alone, whether it has anything to add, so calls it has nothing for cost no query.
_call_annotators: dict = {}


def register_call_annotator(annotator, *, describes) -> None:
    _call_annotators[annotator] = describes


def calls_annotated(calls) -> bool:
    """Whether describing these calls reads anything beyond the calls (an annotator has something to add)."""
    return any(describes(call) for describes in _call_annotators.values() for call in calls)


def annotate_calls(calls) -> dict:
    extra: dict = {}
    for annotator, describes in _call_annotators.items():
        described = [call for call in calls if describes(call)]
        if described:
            for pk, fields in annotator(described).items():
                extra.setdefault(pk, {}).update(fields)
    return extra


# Jobs that run periodically; the runtime of the mode runs them (tools.calls.runtime): Celery beat in the
# distributed mode, a timer thread in the embedded mode.
_periodic: dict = {}


def register_periodic(name: str, func, every_s: float) -> None:
    _periodic[name] = (func, every_s)


def periodic_jobs() -> dict:
    return dict(_periodic)


# Work an app hands to the background after a commit (`runtime().run_soon(name, *args)`): a thread of the
# server process in the embedded mode, a Celery task in the distributed mode. Arguments are JSON values (ids).
_background: dict = {}


def register_background(name: str, func) -> None:
    _background[name] = func


def background_job(name: str):
    return _background.get(name)


class MetaToolProvider(Protocol):
    """Another app's meta tool (a name of RESERVED_TOOL_NAMES), which `tools` shows and runs without knowing
    the app: skills provide `load_skill_through_path`."""
    name: str

    def exposed(self, session, catalog) -> Any:
        """The tool as this session sees it (`tools.catalog.snapshot.ExposedTool`, with `tool=None`), or None when it is
        not on the session's surface now."""

    def run(self, *, call, session) -> Any:
        """Run one call inline, in the request; returns the result's value or raises ToolError."""

    def prompt_section(self, session) -> str:
        """What the session's system-prompt fragment says of it ("" for nothing)."""


_meta_providers: list[MetaToolProvider] = []


def register_meta_provider(provider: MetaToolProvider) -> None:
    if provider.name not in RESERVED_TOOL_NAMES or provider.name in CATALOG_META_TOOLS:
        raise ValueError(f"{provider.name!r} is not a reserved meta tool name another app may provide")
    if all(known.name != provider.name for known in _meta_providers):
        _meta_providers.append(provider)


def meta_providers() -> list[MetaToolProvider]:
    return list(_meta_providers)


class ResourceProvider(Protocol):
    """Another app's MCP resources on `/mcp/` (skills' files), shown per session."""

    def resources(self, session) -> list[dict]:
        """The resources this session may read: `{"uri", "name", "description"?, "mimeType"?}` each."""

    def templates(self, session) -> list[dict]:
        """Resource templates: `{"uriTemplate", "name", "description"?, "mimeType"?}` each."""

    def read(self, session, uri: str) -> list[dict] | None:
        """The contents of `uri` (`{"uri", "mimeType", "text"}` or `{..., "blob"}` each), or None when it is no
        resource of this provider's or not one this session may read."""

    # Optional: `stamps(session, uris) -> {uri: str | None}`, a short text that changes whenever the contents of
    # one of these resources change for the session, None for one it may not read (or that is not this
    # provider's), all at once. A provider without it is stamped by a digest of what `read` returns
    # (`tools.gateway.protocol.resource_stamps`, for resource subscriptions on `/mcp/`).


_resource_providers: list[ResourceProvider] = []


def register_resource_provider(provider: ResourceProvider) -> None:
    if provider not in _resource_providers:
        _resource_providers.append(provider)


def resource_providers() -> list[ResourceProvider]:
    return list(_resource_providers)


@dataclass(frozen=True)
class OfferedPrompt:
    """An MCP prompt a session may be offered on `/mcp/` (docs/mcp.md#prompts). `arguments`:
    `[{"name", "description", "required"}]`. `fetch(arguments)` gets its messages (`{"description"?,
    "messages"}`, MCP's JSON) and `complete(argument, context)` the values offered for an argument
    (`{"name", "value"}`, the other arguments given so far): a list of strings, or None when nothing completes
    them; both are given only by `PromptProvider.prompt`, and run outside the database pool (they may wait for an
    upstream server), raising PromptUnavailable in plain words."""
    name: str
    description: str = ""
    title: str = ""
    arguments: tuple = ()
    target: str = ""  # what the audit trail names as the source of the prompt
    fetch: Any = None
    complete: Any = None


class PromptUnavailable(Exception):
    """A prompt's messages could not be had (its server refused, failed or did not answer): plain words."""


class PromptProvider(Protocol):
    """Where a session's MCP prompts come from (tenants' MCP servers, test fixtures); `/mcp/` lists and
    governs them without knowing the provider."""

    def prompts(self, session) -> list[OfferedPrompt]:
        """The prompts this session may be offered (the exposure filters then hide some by name)."""

    def prompt(self, session, name: str) -> OfferedPrompt | None:
        """That prompt with its `fetch`, when this session may be offered it; else None."""


_prompt_providers: list[PromptProvider] = []


def register_prompt_provider(provider: PromptProvider) -> None:
    if provider not in _prompt_providers:
        _prompt_providers.append(provider)


def prompt_providers() -> list[PromptProvider]:
    return list(_prompt_providers)


# Other apps keep tools off a session's listed surface: the approvals app hides the tools a deny rule always
# refuses the session's agent and user. A filter is called as `fn(tenant=, agent=, user=, user_verified=, names=)`
# with the
# names of the tools the session would be listed (never meta tools), and returns {name: why} for those it hides
# (`why` says which rule, for the console). Filters shape listings only
# (`tools.catalog.selectors.visible_tools`); a call still meets the step that decides it, so a hidden tool's
# call gets that step's answer. `/mcp/` passes the names of the MCP prompts it would offer through the same
# filters (`tools.gateway.prompts`): a prompt hidden so is neither listed nor got.
_exposure_filters: list = []


def register_exposure_filter(fn) -> None:
    if fn not in _exposure_filters:
        _exposure_filters.append(fn)


def exposure_hidden(*, tenant, agent: str, user: str, names, user_verified: bool = False) -> dict[str, str]:
    """The tools of `names` some exposure filter hides from this agent and user, each with the first reason."""
    hidden: dict[str, str] = {}
    if not names:
        return hidden
    for fn in _exposure_filters:
        for name, why in fn(tenant=tenant, agent=agent, user=user, user_verified=user_verified, names=names).items():
            hidden.setdefault(name, why)
    return hidden


# What happens to calls of tools whose flags the platform does not trust (an untrusted MCP server's), for the
# pages that show those tools: the approvals app describes it from its rules and the tenant's settings. A
# describer is called as `fn(tenant=, tools=)` and returns {tool pk: CallOutcome} for the tools it describes.
@dataclass(frozen=True)
class CallOutcome:
    behavior: str  # allow, ask or deny: how a call that no conditional rule matches is decided
    label: str  # a few words for a badge ("asks a reviewer")
    reason: str  # the decision's reason
    conditional: bool  # some rule with conditions (agents, users, arguments) may decide a call otherwise


_outcome_describers: list = []


def register_outcome_describer(fn) -> None:
    if fn not in _outcome_describers:
        _outcome_describers.append(fn)


def call_outcomes(*, tenant, tools) -> dict:
    """{tool pk: CallOutcome} for the tools of `tools` that a describer describes (none without the approvals
    app)."""
    tools = list(tools)
    found: dict = {}
    if not tools:
        return found
    for fn in _outcome_describers:
        for pk, outcome in fn(tenant=tenant, tools=tools).items():
            found.setdefault(pk, outcome)
    return found


class StepChain:
    """An ordered chain of steps (the call pipeline, the steps after a tool ran) that the apps owning the steps
    fill from their AppConfig.ready, each step at a position: the chain runs them in ascending position. Each
    owner imports the chain, so the import contracts see every step's dependency."""

    def __init__(self, name: str):
        self.name = name
        self._at: dict[int, type] = {}
        self._built: tuple | None = None

    def register(self, position: int, step: type) -> None:
        held = self._at.get(position)
        if held is not None and held is not step:
            raise ValueError(f"{self.name}: position {position} is taken by {held.__qualname__}")
        self._at[position] = step
        self._built = None

    def classes(self) -> list[type]:
        return [self._at[position] for position in sorted(self._at)]

    def steps(self) -> tuple:
        """One instance of each step, in order (built once; steps hold no state of a call)."""
        if self._built is None:
            self._built = tuple(step() for step in self.classes())
        return self._built

    @contextmanager
    def replaced(self, classes: Iterable[type]):
        """The chain made of `classes` only, in their order, while the block runs (for tests and tools)."""
        saved = dict(self._at)
        self._at = {position: step for position, step in enumerate(classes)}
        self._built = None
        try:
            yield self
        finally:
            self._at, self._built = saved, None
