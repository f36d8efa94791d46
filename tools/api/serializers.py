import json

from django.conf import settings
from django.core.validators import RegexValidator
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema_field
from rest_framework import serializers

from common import serializers as strict
from common.secrets import secret_names
from toolkeeper.openapi import NOT_NULL, only_with
from tools.calls.questions import public_question
from tools.catalog.declared import DECLARED_MAX, DESCRIPTION_MAX
from tools.catalog.registry import annotate_calls, calls_annotated
from tools.catalog.selectors import FORMATS
from tools.models import (
    AgentSession,
    BoundArgument,
    CallEvent,
    McpServer,
    McpTransport,
    Tool,
    ToolCall,
    ToolGroup,
)
from tools.upstream.servers import (
    HEADERS_MAX,
    NAME_LENGTH_MAX,
    NAMES_MAX,
    SERVER_ACCOUNT_MODES,
    SERVER_NAME,
    SERVER_NAME_RULE,
    TIMEOUT_RANGE,
)

_DECLARATION = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
        "description": {"type": "string", "maxLength": DESCRIPTION_MAX},
        "input_schema": {"type": "object", "description": 'a JSON Schema of type "object"'},
        "parameters": {"type": "object", "description": "input_schema by its OpenAI name (send one of the two)"},
    },
    "required": ["name"],
    "additionalProperties": False,
}


@extend_schema_field({"oneOf": [_DECLARATION, {
    "type": "object", "description": "an OpenAI-style tool",
    "properties": {"type": {"type": "string", "enum": ["function"]}, "function": _DECLARATION},
    "required": ["type", "function"]}]})
class ToolDeclarationField(serializers.JSONField):
    """One declared tool; `tools.catalog.declared` checks it (the document states its shape)."""


def declared_tools_field(help_text: str) -> serializers.ListField:
    return serializers.ListField(child=ToolDeclarationField(), required=False, max_length=DECLARED_MAX,
                                 help_text=help_text + (
        ': schema-only tools, each {"name", "description", "input_schema"}, whose calls wait in awaiting_external '
        "for the app to post their result"))


def tools_mode_field(*, only_with_tools: bool = False, **kwargs) -> serializers.ChoiceField:
    help_text = "add the declared tools to the session's surface, or make them the whole surface"
    if only_with_tools:
        help_text += "; sent only with `tools`"
    return serializers.ChoiceField(choices=["add", "replace"], help_text=help_text, **kwargs)


class SessionCreateSerializer(strict.Serializer):
    agent = serializers.CharField(max_length=100, help_text="may be left out with an API key locked to an agent")
    user = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    user_id_token = serializers.CharField(
        max_length=16_000, required=False, write_only=True, trim_whitespace=True,
        help_text="the end user's ID token from the deployment's identity provider: the session's user is then the "
                  "person it vouches for, verified (`user_verified`), instead of a name the app asserts")
    context = serializers.DictField(required=False, default=dict)
    tools = declared_tools_field("tools declared for this session")
    tools_mode = tools_mode_field(required=False, default="add")

    def __init__(self, *args, agent_locked: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        if agent_locked:  # the key's agent is the session's
            agent = self.fields["agent"]
            agent.required, agent.allow_blank, agent.default = False, True, ""


class SessionSerializer(serializers.ModelSerializer):
    tools = serializers.ListField(child=serializers.DictField(), source="declared_tools", read_only=True,
                                  help_text="the tools the app declared for this session")
    tools_mode = serializers.CharField(source="declared_mode", read_only=True)

    class Meta:
        model = AgentSession
        fields = ["id", "agent", "user", "user_verified", "context", "active_groups", "tools", "tools_mode",
                  "created_at"]


class SessionToolsSerializer(strict.Serializer):
    """A change of the session's declared tools: `tools` replaces the whole list."""

    tools = declared_tools_field("the session's declared tools, all of them")
    tools_mode = tools_mode_field(required=False)


class ToolsQuerySerializer(serializers.Serializer):
    format = serializers.ChoiceField(choices=FORMATS, default="openai")


@extend_schema_field({"type": "object", "additionalProperties": {}})
class JSONObjectField(serializers.JSONField):
    """A JSON object (checked by the serializer, with its own message)."""


class BoundValueField(serializers.JSONField):
    """A bound argument's value: any JSON value but null when sent; null in answers to those who may
    not see it."""

    def to_internal_value(self, data):
        if data is None:
            raise serializers.ValidationError("may not be null")
        return super().to_internal_value(data)


class BoundValueFieldSchema(OpenApiSerializerFieldExtension):
    target_class = BoundValueField

    def map_serializer_field(self, auto_schema, direction):
        return NOT_NULL if direction == "request" else {**NOT_NULL, "nullable": True}


WAIT_MAX_S = 60
CALL_TEXT_MAX = 128  # characters of a call's id and tool name


class CallSpecSerializer(strict.Serializer):
    id = serializers.CharField(max_length=CALL_TEXT_MAX, required=False, allow_blank=False,
                               help_text="the model's call id; defaults to call_<n>")
    name = serializers.CharField(max_length=CALL_TEXT_MAX, help_text="the tool's name")
    input = JSONObjectField(required=False, default=dict)

    def validate_input(self, value):
        if not isinstance(value, dict):
            raise serializers.ValidationError("must be a JSON object")
        return value


def wait_field() -> serializers.FloatField:
    return serializers.FloatField(required=False, default=0, min_value=0, max_value=WAIT_MAX_S,
                                  help_text="seconds to hold the answer until every call settles")


class CallBatchSerializer(strict.Serializer):
    """One call, or a batch under `calls`, with an optional `wait` in seconds."""

    calls = CallSpecSerializer(many=True, required=False)
    id = serializers.CharField(max_length=128, required=False)
    name = serializers.CharField(max_length=128, required=False)
    input = serializers.JSONField(required=False)
    wait = wait_field()
    tools = declared_tools_field("tools declared for the calls of this request only")
    tools_mode = tools_mode_field(required=False)

    def validate(self, attrs):
        declared = {"tools": attrs["tools"], "tools_mode": attrs.get("tools_mode", "add")} if "tools" in attrs else {}
        if "tools_mode" in attrs and not declared:
            raise serializers.ValidationError({"tools_mode": ["send it with the `tools` it applies to"]})
        return {**self._calls(attrs), **declared}

    def _calls(self, attrs):
        if "calls" in attrs:
            if any(key in attrs for key in ("id", "name", "input")):
                raise serializers.ValidationError("send either one call or a `calls` list, not both")
            calls = attrs["calls"]
            if not calls:
                raise serializers.ValidationError({"calls": ["send at least one call"]})
            if len(calls) > settings.TOOLKEEPER_MAX_BATCH:
                raise serializers.ValidationError({"calls": [f"at most {settings.TOOLKEEPER_MAX_BATCH} calls"]})
        else:
            single = CallSpecSerializer(data={k: v for k, v in self.initial_data.items()
                                              if k not in ("wait", "tools", "tools_mode")})
            single.is_valid(raise_exception=True)
            calls = [single.validated_data]
        return {"calls": [dict(call) for call in calls], "wait": attrs.get("wait", 0)}


_ONE_CALL_KEYS = frozenset({"id", "name", "input", "wait"})


def _plain_text(value) -> bool:
    """What CallSpecSerializer takes as an id or a name: a string that is not blank, not too long, with no
    NUL and no lone surrogate."""
    return (isinstance(value, str) and 0 < len(value) <= CALL_TEXT_MAX and not value.isspace()
            and "\x00" not in value and (value.isascii() or not any(0xD800 <= ord(c) <= 0xDFFF for c in value)))


def one_call_validated(data) -> dict | None:
    """`CallBatchSerializer(data=data).validated_data` for the common body, one well-formed call, without
    building the serializers; None for anything else (a batch, a mistake), which the serializer then
    handles, errors and all. A test holds the two equal."""
    if not isinstance(data, dict) or "name" not in data or not _ONE_CALL_KEYS.issuperset(data):
        return None
    name, call_input, wait = data["name"], data.get("input", {}), data.get("wait", 0)
    if not _plain_text(name) or ("id" in data and not _plain_text(data["id"])) or not isinstance(call_input, dict):
        return None
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= WAIT_MAX_S:
        return None  # NaN fails the comparison too
    try:
        json.dumps(call_input, allow_nan=False)  # as the JSON field checks it (1e999 parses as infinity)
    except ValueError:
        return None
    call = {"name": name, "input": call_input}
    if "id" in data:
        call["id"] = data["id"]
    return {"calls": [call], "wait": float(wait) if "wait" in data else 0}


class DecisionSerializer(serializers.Serializer):
    behavior = serializers.ChoiceField(choices=["allow", "deny", "ask", "confirm"])
    rule = serializers.IntegerField(allow_null=True, help_text="the deciding rule's id; null for a default")
    reason = serializers.CharField()
    grant = serializers.IntegerField(required=False, help_text="present when a grant allowed what the rule asks about")


class ContentPartSerializer(serializers.Serializer):
    type = serializers.CharField(help_text="`text`")
    text = serializers.CharField(required=False)


class CallResultSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=["success", "error", "interrupted"])
    content = ContentPartSerializer(many=True)
    structured = serializers.JSONField(required=False, allow_null=True)


class CallErrorSerializer(serializers.Serializer):
    errorType = serializers.CharField()  # noqa: N815 (the name of docs/api.md)
    error = serializers.CharField()
    tool = serializers.CharField()
    callId = serializers.CharField()  # noqa: N815


class VoteSerializer(serializers.Serializer):
    reviewer = serializers.CharField()
    decision = serializers.ChoiceField(choices=["approve", "edit", "reject", "respond"])
    message = serializers.CharField(allow_blank=True)
    input = serializers.JSONField(allow_null=True)
    at = serializers.DateTimeField()


class CallApprovalSerializer(serializers.Serializer):
    """The approval request of a call that asked (added by the approvals app)."""

    id = serializers.IntegerField()
    queue = serializers.CharField(allow_null=True)
    status = serializers.CharField()
    expires_at = serializers.DateTimeField(allow_null=True)
    votes = VoteSerializer(many=True)


class CallQuestionSerializer(serializers.Serializer):
    """What the session's own user is asked while the call is `awaiting_user` (docs/api.md)."""

    kind = serializers.ChoiceField(choices=["confirm", "tool"], help_text="a confirm rule's, or the running tool's")
    message = serializers.CharField(help_text="the question, in plain words")
    tool = serializers.CharField()
    input = serializers.DictField(required=False, help_text="confirm: the input it runs with, bound values left out")
    fixed = serializers.ListField(child=serializers.CharField(), required=False,
                                  help_text="confirm: the names of the arguments the server sets")
    description = serializers.CharField(required=False, help_text="confirm: what the tool does")
    reason = serializers.CharField(required=False, help_text="confirm: the rule that asks")
    requestedSchema = serializers.DictField(help_text="the form: an elicitation `requestedSchema`")  # noqa: N815
    expires_at = serializers.DateTimeField()


class CallAnswerSerializer(strict.Serializer):
    """The session's user answers the call's question."""

    action = serializers.ChoiceField(choices=["accept", "decline", "cancel"])
    content = serializers.DictField(required=False, allow_null=True, default=None,
                                    help_text="the form's fields, with accept")


# The document's forms of a call submission (CallBatchSerializer checks them): `tools_mode` says how the
# request's `tools` apply, so it comes with them or not at all.
SUBMIT_RULES = [only_with("tools_mode", "tools")]


class CallSubmitOneSerializer(CallSpecSerializer):
    """One call."""

    schema_rules = SUBMIT_RULES
    wait = wait_field()
    tools = declared_tools_field("tools declared for this call only")
    tools_mode = tools_mode_field(required=False, default="add", only_with_tools=True)


class CallSubmitBatchSerializer(serializers.Serializer):
    """A batch of calls, answered in request order."""

    schema_rules = SUBMIT_RULES
    calls = CallSpecSerializer(many=True, min_length=1, max_length=settings.TOOLKEEPER_MAX_BATCH)
    wait = wait_field()
    tools = declared_tools_field("tools declared for the calls of this request only")
    tools_mode = tools_mode_field(required=False, default="add", only_with_tools=True)


CALL_SUBMIT_REQUEST = PolymorphicProxySerializer(component_name="CallSubmit", resource_type_field_name=None,
                                                 serializers=[CallSubmitOneSerializer, CallSubmitBatchSerializer])


class CallSerializer(serializers.ModelSerializer):
    tool = serializers.CharField(source="tool_name")
    approval = serializers.SerializerMethodField()
    question = serializers.SerializerMethodField()
    # Declared for the OpenAPI document; to_representation below builds the values.
    input = serializers.DictField(help_text="as the model sent it; bound values are never echoed")
    decision = DecisionSerializer(allow_null=True)
    result = CallResultSerializer(allow_null=True)
    error = CallErrorSerializer(allow_null=True)
    trace_id = serializers.CharField(allow_null=True, min_length=32, max_length=32, help_text=(
        "the call's trace (32 hex digits) when tracing is on and sampled it, else null; a `traceparent` sent with the "
        "call makes it the app's trace"))

    class Meta:
        model = ToolCall
        fields = ["id", "call_id", "session", "tool", "input", "status", "decision", "result", "error",
                  "approval", "question", "trace_id", "created_at", "finished_at"]

    @extend_schema_field(CallQuestionSerializer(allow_null=True))
    def get_question(self, call) -> dict | None:
        return public_question(call)

    @extend_schema_field(CallApprovalSerializer(allow_null=True))
    def get_approval(self, call) -> dict | None:
        return self.context.get("extras", {}).get(call.pk, {}).get("approval")

    def to_representation(self, call) -> dict:
        return call_json(call, self.context.get("extras", {}))


def call_json(call, extras: dict) -> dict:
    """A call as CallSerializer declares it, built by hand: the hottest representation of the API."""
    return {
        "id": str(call.pk), "call_id": call.call_id, "session": str(call.session_id), "tool": call.tool_name,
        "input": call.input, "status": call.status, "decision": call.decision, "result": call.result,
        "error": call.error, "approval": extras.get(call.pk, {}).get("approval"), "question": public_question(call),
        "trace_id": call.trace_id or None,
        "created_at": _timestamp(call.created_at), "finished_at": _timestamp(call.finished_at),
    }


def _timestamp(value) -> str | None:
    """As DRF's DateTimeField renders UTC times."""
    if value is None:
        return None
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def calls_data(calls) -> list[dict]:
    """Calls as the API shows them, with what other apps add (approval requests) in one query each."""
    calls = list(calls)
    extras = annotate_calls(calls)
    return [call_json(call, extras) for call in calls]


def calls_data_offline(calls) -> bool:
    """Whether `calls_data` reads nothing but the calls themselves (so it may run on the event loop)."""
    return not calls_annotated(calls)


def call_data(call) -> dict:
    return calls_data([call])[0]


class CallEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = CallEvent
        fields = ["seq", "kind", "data", "at"]


class CallListSerializer(serializers.Serializer):
    calls = CallSerializer(many=True, help_text="in request order")


class EventListSerializer(serializers.Serializer):
    events = CallEventSerializer(many=True)


class PromptSerializer(serializers.Serializer):
    text = serializers.CharField(allow_blank=True, help_text="a system-prompt fragment: group notes, skills")


class OpenAIFunctionSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField(allow_blank=True)
    parameters = serializers.DictField(help_text="JSON Schema; bound argument names never appear")


class OpenAIToolSerializer(serializers.Serializer):
    type = serializers.ChoiceField(choices=["function"])
    function = OpenAIFunctionSerializer()


class AnthropicToolSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField(allow_blank=True)
    input_schema = serializers.DictField()


class McpToolSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField(allow_blank=True)
    inputSchema = serializers.DictField()  # noqa: N815 (MCP's name)
    annotations = serializers.DictField()
    outputSchema = serializers.DictField(  # noqa: N815 (MCP's name)
        required=False, help_text="the JSON Schema of the tool's structured result, for a tool that declares one")


@extend_schema_field(PolymorphicProxySerializer(
    component_name="SessionTool", resource_type_field_name=None,
    serializers=[OpenAIToolSerializer, AnthropicToolSerializer, McpToolSerializer]))
class SessionToolField(serializers.DictField):
    """A tool in the requested format."""


class ToolListSerializer(serializers.Serializer):
    tools = serializers.ListField(child=SessionToolField())


class WaitQuerySerializer(serializers.Serializer):
    wait = serializers.FloatField(required=False, default=0, min_value=0, max_value=60)


class EventsQuerySerializer(serializers.Serializer):
    after = serializers.IntegerField(required=False, default=0, min_value=0, max_value=2**31 - 1)


class ToolSerializer(strict.ModelSerializer):
    class Meta:
        model = Tool
        fields = ["id", "name", "description", "input_schema", "output_schema", "source", "source_ref",
                  "read_only", "destructive", "idempotent", "concurrency_safe", "timeout_s", "enabled",
                  "retry_max", "retry_backoff_s", "max_result_chars"]
        read_only_fields = ["name", "input_schema", "output_schema", "source", "source_ref", "read_only",
                            "destructive", "idempotent", "concurrency_safe", "description"]
        extra_kwargs = {"timeout_s": {"min_value": 0.1, "max_value": 86400},
                        "retry_max": {"min_value": 0, "max_value": 10,
                                      "help_text": "runs again after a transient error; above 0 only for a tool "
                                                   "that is `idempotent` (400 naming retry_max otherwise)"},
                        "retry_backoff_s": {"min_value": 0, "max_value": 300,
                                            "help_text": "seconds before the first retry, doubled for each next one"},
                        "max_result_chars": {"min_value": 100, "max_value": 10_000_000,
                                             "help_text": "result text cut beyond this; null: the platform's cap"}}


class ExternalToolSerializer(strict.Serializer):
    name = serializers.CharField(max_length=64, validators=[
        RegexValidator(r"^[a-zA-Z0-9_-]+\Z", "1-64 letters, digits, '_' or '-'")])
    description = serializers.CharField(allow_blank=True, default="", max_length=4000)
    input_schema = serializers.DictField()
    read_only = serializers.BooleanField(default=False)
    destructive = serializers.BooleanField(default=False)
    idempotent = serializers.BooleanField(default=False)
    timeout_s = serializers.FloatField(default=30, min_value=0.1, max_value=86400)


class TenantToolField(serializers.SlugRelatedField):
    """Tools named by name, looked up in the request's tenant only."""

    def __init__(self, **kwargs):
        super().__init__(slug_field="name", **kwargs)

    def get_queryset(self):
        return Tool.objects.for_tenant(self.context["tenant"])


# The pattern is stated in the OpenAPI document; a blank skill (none) is taken before validators run.
SKILL_NAME = RegexValidator(r"^[a-z0-9-]+\Z", "a skill's name: lowercase letters, digits and hyphens")


class GroupSerializer(strict.ModelSerializer):
    tools = TenantToolField(many=True, required=False)
    skill = serializers.CharField(
        source="skill_ref", required=False, allow_blank=True, max_length=64, validators=[SKILL_NAME],
        help_text="the name of the skill whose loading switches the group on, for that session; empty: none")
    agents = serializers.ListField(
        child=serializers.CharField(max_length=100), required=False, max_length=100,
        help_text="the agents that see the group; empty: every agent (basic is always open to every agent)")

    class Meta:
        model = ToolGroup
        fields = ["id", "name", "description", "notes", "default_active", "switchable", "tools", "skill",
                  "agents", "created_at"]


class BindingSerializer(strict.ModelSerializer):
    tool = TenantToolField()
    value = BoundValueField(help_text="null (and value_hidden true) for reviewers and viewers")
    value_hidden = serializers.SerializerMethodField()

    class Meta:
        model = BoundArgument
        fields = ["id", "tool", "agent", "name", "value", "value_hidden", "created_at"]
        # binding_set replaces an existing binding; DRF's generated uniqueness check would also
        # query without the tenant.
        validators = []

    def get_value_hidden(self, binding) -> bool:
        return not self.context.get("sees_secrets", False)

    def to_representation(self, binding) -> dict:
        data = super().to_representation(binding)
        if data["value_hidden"]:
            data["value"] = None
        return data


# --- MCP servers -------------------------------------------------------------------------------

@extend_schema_field({"type": "object", "additionalProperties": {"type": "string"}, "writeOnly": True})
class CredentialsField(serializers.JSONField):
    """Names and values of credentials (headers, environment): written, never read back. The service checks
    them whole (types, names, sizes), without echoing a value in its messages."""

    def __init__(self, **kwargs):
        super().__init__(write_only=True, required=False, **kwargs)


class McpServerToolSerializer(serializers.ModelSerializer):
    upstream_name = serializers.CharField(source="source_ref", help_text="the tool's name on the server")
    offered = serializers.SerializerMethodField(help_text="false when the server no longer offers it (it is then "
                                                "disabled and taken back, enabled, when offered again)")

    review = serializers.SerializerMethodField(help_text="\"new\" or \"changed\": the server offers it with a "
                                               "definition no operator has accepted, and it is withheld from every "
                                               "session until one does; null otherwise")

    class Meta:
        model = Tool
        fields = ["id", "name", "upstream_name", "enabled", "offered", "review"]
        read_only_fields = fields

    def get_offered(self, tool) -> bool:
        return tool.mcp_server_id is not None

    def get_review(self, tool) -> str | None:
        if not tool.proposed_hash:
            return None
        return "changed" if tool.pinned_hash else "new"


class McpDefinitionChangeSerializer(serializers.Serializer):
    tool = serializers.CharField(help_text="the tool's name in the catalog")
    review = serializers.ChoiceField(choices=["new", "changed"])
    hash = serializers.CharField(help_text="the proposed definition's SHA-256: send it back to accept this one")
    since = serializers.DateTimeField()
    pinned = serializers.JSONField(help_text="the accepted definition (null for a new tool): name, description, "
                                   "input_schema, output_schema, annotations")
    proposed = serializers.JSONField(help_text="the definition the server offers now")


class McpDefinitionAcceptSerializer(strict.Serializer):
    tool = serializers.CharField(max_length=128, help_text="the tool's name in the catalog")
    hash = serializers.CharField(max_length=64, help_text="the proposed definition's hash, as the review showed it")


def upstream_names_field(help_text: str) -> serializers.ListField:
    return serializers.ListField(
        child=serializers.CharField(trim_whitespace=False, max_length=NAME_LENGTH_MAX), max_length=NAMES_MAX,
        required=False, help_text=help_text)


class McpServerSerializer(strict.ModelSerializer):
    name = serializers.CharField(max_length=24, validators=[RegexValidator(
        r"^(?:" + SERVER_NAME.pattern + r")\Z", SERVER_NAME_RULE)],
        help_text="the `{server}` of its tools' names `mcp__{server}__{tool}`; cannot change")
    transport = serializers.ChoiceField(choices=McpTransport.values)
    url = serializers.CharField(max_length=2000, required=False, allow_blank=True,
                                help_text="HTTP transports: the server's URL (public addresses only, unless the "
                                          "platform admin allows the host)")
    headers = CredentialsField(help_text="HTTP transports: headers sent with every request, e.g. Authorization. "
                               "Write-only: left out, the stored ones stay; `{}` removes them. Changing the URL "
                               f"to another host needs them sent again. At most {HEADERS_MAX}.")
    header_names = serializers.SerializerMethodField(help_text="the names of the stored headers (never their values)")
    command = serializers.CharField(max_length=64, required=False, allow_blank=True,
                                    help_text="stdio: a name from the platform admin's allow-list of servers")
    env = CredentialsField(help_text="stdio: values of the environment variables that server lets tenants set. "
                           "Write-only, like headers.")
    env_names = serializers.SerializerMethodField(help_text="the names of the stored variables (never their values)")
    timeout_s = serializers.FloatField(min_value=TIMEOUT_RANGE[0], max_value=TIMEOUT_RANGE[1], required=False,
                                       help_text="the limit of each call of its tools, and of a sync")
    include = upstream_names_field("upstream tool names to take; empty: every tool")
    exclude = upstream_names_field("upstream tool names to leave out")
    trusted = serializers.BooleanField(required=False, help_text="its tools' annotations (readOnlyHint, "
                                       "destructiveHint, idempotentHint) become their flags")
    accept_changes = serializers.BooleanField(
        required=False, help_text="false (the default): a tool whose definition the server changes, or a new tool "
                                  "after the first sync, is withheld until an operator accepts it; true: each sync "
                                  "applies the server's definitions itself (audited)")
    accounts = serializers.ChoiceField(
        choices=SERVER_ACCOUNT_MODES, required=False,
        help_text="`tenant`: every call uses the server's own credentials (headers); `person`: each call carries "
                  "its verified person's own OAuth token, which they connect on the console's accounts page")
    oauth_client = CredentialsField(help_text="`person` servers: a client registered at the server's authorization "
                                    "server, `{\"client_id\", \"client_secret\"?}`. Without one, Toolkeeper "
                                    "registers itself there. Write-only, like headers.")
    oauth_client_set = serializers.SerializerMethodField(help_text="whether an OAuth client is stored (an "
                                                         "operator's or Toolkeeper's own registration)")
    oauth_scopes = serializers.CharField(max_length=500, required=False, allow_blank=True,
                                         help_text="`person` servers: the scopes to ask for; empty: those the "
                                                   "server names")
    tools = serializers.SerializerMethodField()

    class Meta:
        model = McpServer
        fields = ["id", "name", "transport", "url", "headers", "header_names", "command", "env", "env_names",
                  "enabled", "timeout_s", "include", "exclude", "trusted", "accept_changes", "accounts", "oauth_client",
                  "oauth_client_set", "oauth_scopes", "status", "last_error", "last_synced_at",
                  "tools", "created_at", "updated_at"]
        read_only_fields = ["status", "last_error", "last_synced_at", "created_at", "updated_at"]
        extra_kwargs = {"last_error": {"help_text": "why the last sync failed, in plain words"}}
        validators = []  # the service checks the name's uniqueness in the tenant

    def get_header_names(self, server) -> list[str]:
        return secret_names(server, "headers")

    def get_env_names(self, server) -> list[str]:
        return secret_names(server, "env")

    def get_oauth_client_set(self, server) -> bool:
        return bool(secret_names(server, "oauth_client"))

    @extend_schema_field(McpServerToolSerializer(many=True))
    def get_tools(self, server) -> list[dict]:
        tools = self.context.get("tools_by_server", {}).get(server.pk)
        return McpServerToolSerializer(tools or [], many=True).data


class McpSkippedSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="the upstream name")
    reason = serializers.CharField()


class McpPromptSyncSerializer(serializers.Serializer):
    added = serializers.IntegerField()
    updated = serializers.IntegerField()
    removed = serializers.IntegerField(help_text="prompts the server no longer offers")
    skipped = McpSkippedSerializer(many=True, help_text="prompts left out, with the reason")


class McpSyncSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=["ok", "error"])
    error = serializers.CharField(allow_blank=True, help_text="why the server could not be synced, in plain words")
    added = serializers.IntegerField()
    updated = serializers.IntegerField()
    disabled = serializers.IntegerField(help_text="tools the server no longer offers")
    held = serializers.IntegerField(help_text="tools whose new or changed definition this sync withheld for review")
    skipped = McpSkippedSerializer(many=True, help_text="tools left out, with the reason")
    prompts = McpPromptSyncSerializer(help_text="what became of the server's prompts")


class McpSyncResultSerializer(serializers.Serializer):
    server = McpServerSerializer()
    sync = McpSyncSerializer()


class McpTestResultSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    info = serializers.DictField(help_text="what the server says of itself")
