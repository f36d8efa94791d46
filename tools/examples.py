"""Example Python tools shipped for the demo tenant and for trying the platform out."""
import ast
import operator

from .decorators import ToolContext, ToolError, tool

_OPERATORS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
    ast.USub: operator.neg, ast.UAdd: operator.pos,
}


def _evaluate(node):
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 100:
            raise ToolError("exponent too large", error_type="InvalidInput")
        return _OPERATORS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    raise ToolError("only numbers and + - * / // % ** ( ) are allowed", error_type="InvalidInput")


@tool(read_only=True, idempotent=True, timeout=5, groups=("math",))
def calculate(expression: str) -> dict:
    """Evaluate an arithmetic expression exactly as written.

    Args:
        expression: Numbers and the operators + - * / // % ** with parentheses, e.g. "(2 + 3) * 4".
    """
    if len(expression) > 500:
        raise ToolError("expression longer than 500 characters", error_type="InvalidInput")
    try:
        tree = ast.parse(expression, mode="eval")
        value = _evaluate(tree)
    except SyntaxError as exc:
        raise ToolError(f"not an arithmetic expression: {exc.msg}", error_type="InvalidInput") from exc
    except ZeroDivisionError as exc:
        raise ToolError("division by zero", error_type="InvalidInput") from exc
    return {"expression": expression, "value": value}


@tool(read_only=True, idempotent=True, timeout=120, groups=("ops",))
def countdown(seconds: int = 5, ctx: ToolContext = None) -> str:
    """Count down, reporting progress every second. Useful to watch a call stream live.

    Args:
        seconds: How many seconds to count, 1 to 60.
    """
    if not 1 <= seconds <= 60:
        raise ToolError("seconds must be between 1 and 60", error_type="InvalidInput")
    for done in range(seconds):
        ctx.emit(f"{seconds - done} s left", progress=done / seconds)
        ctx.sleep(1)
    ctx.emit("done", progress=1.0)
    return f"counted down {seconds} seconds"


@tool(idempotent=False, concurrency_safe=False, timeout=120, groups=("ops",))
def slow_write(text: str, seconds: int = 5, ctx: ToolContext = None) -> dict:
    """Append a note to the session's notes after a slow write, reporting progress. Not idempotent: running it
    twice appends twice, so the platform never retries it on its own.

    Args:
        text: The note to append.
        seconds: How long the write takes, 1 to 60.
    """
    from .services import session_note_append

    if not 1 <= seconds <= 60:
        raise ToolError("seconds must be between 1 and 60", error_type="InvalidInput")
    for done in range(seconds):
        ctx.emit(f"writing… {done}/{seconds} s", progress=done / seconds)
        ctx.sleep(1)
    notes = session_note_append(session=ctx.session, text=text)
    ctx.emit("written", progress=1.0)
    return {"notes": len(notes), "appended": text}
