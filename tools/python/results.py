"""The shapes a model receives (docs/calls.md): results and structured errors, never a trace."""
import json
from typing import Any

from pydantic import BaseModel


def tool_result(value: Any) -> dict:
    """A tool's return value as a result: text for the model, structure when there is one."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, dict) and value.get("state") in ("success", "error") and "content" in value:
        return value  # already a result
    if value is None:
        return {"state": "success", "content": [], "structured": None}
    if isinstance(value, str):
        return {"state": "success", "content": [{"type": "text", "text": value}], "structured": None}
    text = json.dumps(value, ensure_ascii=False, default=str)
    return {"state": "success", "content": [{"type": "text", "text": text}], "structured": json.loads(text)}


def result_text(result: dict) -> str:
    """A result's text blocks, joined."""
    return "\n".join(block["text"] for block in result.get("content") or []
                     if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str))


def interrupted_result(reason: str) -> dict:
    return {"state": "interrupted", "content": [{"type": "text", "text": reason}], "structured": None}


def call_error(*, error_type: str, message: str, tool: str, call_id: str) -> dict:
    return {"errorType": error_type, "error": message, "tool": tool, "callId": call_id}


def error_result(error: dict) -> dict:
    return {"state": "error", "content": [{"type": "text", "text": f"{error['errorType']}: {error['error']}"}],
            "structured": None}
