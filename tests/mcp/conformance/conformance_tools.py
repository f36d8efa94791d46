"""Test-only tools of the MCP conformance run (settings `tests.mcp.conformance.settings`): the fixture tools
the official suite's server scenarios call by name, as Python tools in the `basic` group (always active, so
every session the suite opens sees them; read-only, so no rule asks for them)."""
import base64
import io
import json
import struct
import wave
import zlib

from pydantic import BaseModel

from tools.catalog.registry import OfferedPrompt, register_prompt_provider, register_resource_provider
from tools.python.decorators import ToolContext, ToolError, tool

GROUPS = ("basic",)


def _png_1x1_red() -> str:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1x1, 8 bits, RGB
    pixels = zlib.compress(b"\x00\xff\x00\x00")  # filter byte, then one red pixel
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    return base64.b64encode(png).decode()


def _wav_silence() -> str:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as audio:
        audio.setnchannels(1)
        audio.setsampwidth(2)
        audio.setframerate(8000)
        audio.writeframes(b"\x00\x00" * 80)  # 10 ms
    return base64.b64encode(buffer.getvalue()).decode()


PNG = _png_1x1_red()
WAV = _wav_silence()


def _content(*blocks: dict) -> dict:
    """A result with these MCP content blocks as they are (tools.python.results.tool_result passes it through)."""
    return {"state": "success", "content": list(blocks), "structured": None}


@tool(read_only=True, idempotent=True, groups=GROUPS)
def test_simple_text() -> str:
    """Return a simple text (conformance: tools-call-simple-text)."""
    return "This is a simple text response for testing."


@tool(read_only=True, idempotent=True, groups=GROUPS)
def test_image_content() -> dict:
    """Return a 1x1 red PNG image (conformance: tools-call-image)."""
    return _content({"type": "image", "data": PNG, "mimeType": "image/png"})


@tool(read_only=True, idempotent=True, groups=GROUPS)
def test_audio_content() -> dict:
    """Return 10 ms of WAV silence (conformance: tools-call-audio)."""
    return _content({"type": "audio", "data": WAV, "mimeType": "audio/wav"})


@tool(read_only=True, idempotent=True, groups=GROUPS)
def test_embedded_resource() -> dict:
    """Return an embedded text resource (conformance: tools-call-embedded-resource)."""
    return _content({"type": "resource", "resource": {
        "uri": "test://embedded-resource", "mimeType": "text/plain", "text": "This is an embedded resource content."}})


@tool(read_only=True, idempotent=True, groups=GROUPS)
def test_multiple_content_types() -> dict:
    """Return text, an image and a resource (conformance: tools-call-mixed-content)."""
    return _content(
        {"type": "text", "text": "Multiple content types test:"},
        {"type": "image", "data": PNG, "mimeType": "image/png"},
        {"type": "resource", "resource": {"uri": "test://mixed-content-resource", "mimeType": "application/json",
                                          "text": '{"test":"data","value":123}'}},
    )


@tool(read_only=True, idempotent=True, groups=GROUPS)
def test_error_handling() -> str:
    """Always fail (conformance: tools-call-error)."""
    raise ToolError("This tool intentionally returns an error for testing")


@tool(read_only=True, idempotent=True, groups=GROUPS)
def test_tool_with_progress(ctx: ToolContext) -> str:
    """Report progress 0, 50 and 100 of 100, 50 ms apart (conformance: tools-call-with-progress)."""
    for step, done in enumerate((0, 50, 100)):
        if step:
            ctx.sleep(0.05)
        ctx.progress(done, 100, f"{done}/100")
    return "Progress test completed"


def _asked(ctx: ToolContext, message: str, properties: dict) -> str:
    answer = ctx.ask_user(message, {"type": "object", "properties": properties, "required": []}, timeout_s=20)
    return f"User response: action={answer['action']}, content={json.dumps(answer['content'])}"


@tool(read_only=True, idempotent=True, groups=GROUPS, timeout=30.0)
def test_elicitation(message: str, ctx: ToolContext) -> str:
    """Ask the user for a username and an e-mail address (conformance: tools-call-elicitation).

    Args:
        message: The question shown to the user.
    """
    return _asked(ctx, message, {"username": {"type": "string", "description": "User's response"},
                                 "email": {"type": "string", "description": "User's email address"}})


@tool(read_only=True, idempotent=True, groups=GROUPS, timeout=30.0)
def test_elicitation_sep1034_defaults(ctx: ToolContext) -> str:
    """Ask with a default for each primitive type (conformance: elicitation-sep1034-defaults)."""
    return _asked(ctx, "Please review and update the form fields with defaults", {
        "name": {"type": "string", "description": "User name", "default": "John Doe"},
        "age": {"type": "integer", "description": "User age", "default": 30},
        "score": {"type": "number", "description": "User score", "default": 95.5},
        "status": {"type": "string", "description": "User status", "enum": ["active", "inactive", "pending"],
                   "default": "active"},
        "verified": {"type": "boolean", "description": "Verification status", "default": True},
    })


@tool(read_only=True, idempotent=True, groups=GROUPS, timeout=30.0)
def test_elicitation_sep1330_enums(ctx: ToolContext) -> str:
    """Ask with each enum form (conformance: elicitation-sep1330-enums)."""
    return _asked(ctx, "Please select options from the enum fields", {
        "untitledSingle": {"type": "string", "description": "Select one option",
                           "enum": ["option1", "option2", "option3"]},
        "titledSingle": {"type": "string", "description": "Select one option with titles", "oneOf": [
            {"const": "value1", "title": "First Option"}, {"const": "value2", "title": "Second Option"},
            {"const": "value3", "title": "Third Option"}]},
        "legacyEnum": {"type": "string", "description": "Select one option (legacy)",
                       "enum": ["opt1", "opt2", "opt3"], "enumNames": ["Option One", "Option Two", "Option Three"]},
        "untitledMulti": {"type": "array", "description": "Select multiple options", "minItems": 1,
                          "maxItems": 3, "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
        "titledMulti": {"type": "array", "description": "Select multiple options with titles", "minItems": 1,
                        "maxItems": 3, "items": {"anyOf": [
                            {"const": "value1", "title": "First Choice"}, {"const": "value2", "title": "Second Choice"},
                            {"const": "value3", "title": "Third Choice"}]}},
    })


@tool(read_only=True, idempotent=True, groups=GROUPS)
def test_tool_with_logging(ctx: ToolContext) -> str:
    """Send three log messages at info level, 50 ms apart (conformance: tools-call-with-logging)."""
    for step, text in enumerate(("Tool execution started", "Tool processing data", "Tool execution completed")):
        if step:
            ctx.sleep(0.05)
        ctx.log(text, level="info")
    return "Logging test completed"


@tool(read_only=True, idempotent=True, groups=GROUPS)
def test_reconnection(ctx: ToolContext) -> str:
    """Run past TOOLKEEPER_MCP_POLL_AFTER_S (1 s in this run), so the server ends the call's stream before its
    result and the client resumes it with Last-Event-ID (conformance: server-sse-polling)."""
    ctx.emit("started", progress=0.0)
    ctx.sleep(1.5)
    return "Reconnection test completed"


class Address(BaseModel):
    street: str | None = None
    city: str | None = None


@tool(read_only=True, idempotent=True, groups=GROUPS)
def json_schema_2020_12_tool(name: str | None = None, address: Address | None = None) -> dict:
    """Tool with JSON Schema 2020-12 features (conformance: json-schema-2020-12).

    Args:
        name: A name.
        address: An address.
    """
    return {"name": name, "address": address.model_dump() if address else None}


# The scenario expects this input schema exactly (`$schema`, `$defs.address`, `additionalProperties: false`),
# which pydantic does not write for the function above (it names the definition `Address`, adds `anyOf` with
# null and titles, and no `$schema`): the tool's input model answers it instead; it still validates calls.
JSON_SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {"address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}


class _ExactSchema(json_schema_2020_12_tool.tool.input_model):
    @classmethod
    def model_json_schema(cls, *args, **kwargs) -> dict:
        return JSON_SCHEMA_2020_12


json_schema_2020_12_tool.tool.input_model = _ExactSchema


class ConformanceResources:
    """The fixture resources the suite's resources-* scenarios read by URI, through the same provider hook as
    the skills' files (`tools.catalog.registry.register_resource_provider`)."""

    def resources(self, session) -> list[dict]:
        return [{"uri": "test://static-text", "name": "static-text", "mimeType": "text/plain"},
                {"uri": "test://static-binary", "name": "static-binary", "mimeType": "image/png"},
                {"uri": "test://watched-resource", "name": "watched-resource", "mimeType": "text/plain"}]

    def templates(self, session) -> list[dict]:
        return [{"uriTemplate": "test://template/{id}/data", "name": "template-data", "mimeType": "application/json"}]

    def read(self, session, uri: str) -> list[dict] | None:
        if uri == "test://static-text":
            return [{"uri": uri, "mimeType": "text/plain", "text": "This is the content of the static text resource."}]
        if uri == "test://watched-resource":  # the resources-subscribe scenarios subscribe to it
            return [{"uri": uri, "mimeType": "text/plain", "text": "This resource is watched."}]
        if uri == "test://static-binary":
            return [{"uri": uri, "mimeType": "image/png", "blob": PNG}]
        prefix, suffix = "test://template/", "/data"
        if uri.startswith(prefix) and uri.endswith(suffix) and (ident := uri[len(prefix):-len(suffix)]).isalnum():
            return [{"uri": uri, "mimeType": "application/json", "text": f'{{"id": "{ident}"}}'}]
        return None


register_resource_provider(ConformanceResources())


def _user(content: dict) -> dict:
    return {"role": "user", "content": content}


def _text(text: str) -> dict:
    return {"type": "text", "text": text}


class ConformancePrompts:
    """The fixture prompts the suite's prompts-* scenarios get by name, through the same provider hook as the
    tenants' MCP servers' prompts (`tools.catalog.registry.register_prompt_provider`); /mcp/ governs them as
    it governs those (listing, exposure filters, argument checks, audit)."""

    PROMPTS = {
        "test_simple_prompt": ("A simple prompt without arguments.", ()),
        "test_prompt_with_arguments": ("A prompt with two arguments.", (
            {"name": "arg1", "description": "First test argument", "required": True},
            {"name": "arg2", "description": "Second test argument", "required": True})),
        "test_prompt_with_embedded_resource": ("A prompt with an embedded resource.", (
            {"name": "resourceUri", "description": "URI of the resource to embed", "required": True},)),
        "test_prompt_with_image": ("A prompt with an image.", ()),
    }

    def _offered(self, name: str, fetch=None) -> OfferedPrompt:
        description, arguments = self.PROMPTS[name]
        return OfferedPrompt(name=name, description=description, arguments=arguments, target="conformance",
                             fetch=fetch)

    def prompts(self, session) -> list[OfferedPrompt]:
        return [self._offered(name) for name in self.PROMPTS]

    def prompt(self, session, name: str) -> OfferedPrompt | None:
        if name not in self.PROMPTS:
            return None
        return self._offered(name, lambda arguments: self.messages(name, arguments))

    @staticmethod
    def messages(name: str, arguments: dict) -> dict:
        if name == "test_simple_prompt":
            return {"messages": [_user(_text("This is a simple prompt for testing."))]}
        if name == "test_prompt_with_arguments":
            return {"messages": [_user(_text(
                f"Prompt with arguments: arg1='{arguments['arg1']}', arg2='{arguments['arg2']}'"))]}
        if name == "test_prompt_with_embedded_resource":
            return {"messages": [
                _user({"type": "resource", "resource": {"uri": arguments["resourceUri"], "mimeType": "text/plain",
                                                        "text": "Embedded resource content for testing."}}),
                _user(_text("Please process the embedded resource above."))]}
        return {"messages": [_user({"type": "image", "data": PNG, "mimeType": "image/png"}),
                             _user(_text("Please analyze the image above."))]}


register_prompt_provider(ConformancePrompts())
