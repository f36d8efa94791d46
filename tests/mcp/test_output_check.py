"""The endpoint's last check of a succeeded call against its tool's declared output schema (docs/mcp.md): a
structured result that does not match, or is missing, becomes an error result saying why, so no MCP client that
checks results (the SDK's does) is handed one it must refuse."""
from tools.catalog.selectors import format_tool
from tools.catalog.snapshot import ExposedTool
from tools.gateway.protocol import call_tool_result
from tools.models import CallStatus, Tool, ToolCall

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def exposed(output_schema) -> ExposedTool:
    tool = Tool(name="count", description="Counts.", input_schema={"type": "object"}, output_schema=output_schema)
    return ExposedTool(name="count", description="Counts.", schema={"type": "object"}, tool=tool)


def succeeded(structured) -> ToolCall:
    return ToolCall(call_id="call_7", tool_name="count", status=CallStatus.SUCCEEDED,
                    result={"state": "success", "content": [{"type": "text", "text": "7"}], "structured": structured})


def test_a_matching_structured_result_passes_through():
    result = call_tool_result(succeeded({"n": 7}), exposed(SCHEMA))
    assert result.is_error is False and result.structured_content == {"n": 7}
    assert format_tool(exposed(SCHEMA), "mcp")["outputSchema"] == SCHEMA


def test_a_result_that_breaks_the_schema_or_has_no_structure_is_an_error_result():
    for structured in ({"n": "seven"}, {}, None, ["not", "an", "object"]):
        result = call_tool_result(succeeded(structured), exposed(SCHEMA))
        assert result.is_error is True, structured
        assert result.structured_content["errorType"] == "InvalidOutput"
        assert result.structured_content["callId"] == "call_7"
        assert result.content[0].text == "7"  # the tool's own content stays, the reason follows
        assert "output schema" in result.content[-1].text


def test_a_schema_mcp_cannot_carry_is_neither_listed_nor_checked():
    for schema in (None, {"type": "array"}, {"properties": {"n": {}}}, ["no"]):
        assert "outputSchema" not in format_tool(exposed(schema), "mcp")
        assert call_tool_result(succeeded(None), exposed(schema)).is_error is False
    assert "outputSchema" not in str(format_tool(exposed(SCHEMA), "openai"))
    assert "outputSchema" not in str(format_tool(exposed(SCHEMA), "anthropic"))
