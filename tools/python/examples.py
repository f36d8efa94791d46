"""Example Python tools shipped for the demo tenant and for trying the platform out."""
import ast
import math
import operator

from tools.catalog.services import session_note_append
from tools.python.decorators import ToolContext, ToolError, tool

_OPERATORS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
    ast.USub: operator.neg, ast.UAdd: operator.pos,
}
# Big integers are computed in one C call that holds the GIL for its whole length, so sizes are checked
# before the operation, not after. The bound stays below Python's limit for turning an int into text.
MAX_DIGITS = 4000
_LIMIT = 10**MAX_DIGITS
_MAX_BITS = _LIMIT.bit_length()


def _invalid(message: str) -> ToolError:
    return ToolError(message, error_type="InvalidInput")


def _too_large() -> ToolError:
    return _invalid(f"the result would have more than {MAX_DIGITS} digits")


def _checked_operands(op: ast.operator, left, right) -> None:
    if not (isinstance(left, int) and isinstance(right, int)):
        return  # floats: constant-time operations; overflow is caught on the result
    # Lower bounds of the result's size (|n| >= 2**(bits - 1)): refused only when certainly too large.
    if isinstance(op, ast.Pow) and right > 0 and (abs(left).bit_length() - 1) * right > _MAX_BITS:
        raise _too_large()
    if isinstance(op, ast.Mult) and left.bit_length() + right.bit_length() - 2 > _MAX_BITS:
        raise _too_large()


def _checked(value):
    if isinstance(value, complex):
        raise _invalid("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise _invalid("the result is out of the range of floating-point numbers")
    if isinstance(value, int) and abs(value) >= _LIMIT:
        raise _too_large()
    return value


def _evaluate(node):
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return _checked(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        _checked_operands(node.op, left, right)
        return _checked(_OPERATORS[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    raise _invalid("only numbers and + - * / // % ** ( ) are allowed")


@tool(read_only=True, idempotent=True, timeout=5, groups=("math",))
def calculate(expression: str) -> dict:
    """Evaluate an arithmetic expression exactly as written.

    Integers are exact up to 4000 digits; larger results are refused.

    Args:
        expression: Numbers and the operators + - * / // % ** with parentheses, e.g. "(2 + 3) * 4".
    """
    if len(expression) > 500:
        raise _invalid("expression longer than 500 characters")
    try:
        tree = ast.parse(expression, mode="eval")
        value = _evaluate(tree)
    except SyntaxError as exc:
        raise _invalid(f"not an arithmetic expression: {exc.msg}") from exc
    except ZeroDivisionError as exc:
        raise _invalid("division by zero") from exc
    except OverflowError as exc:
        raise _invalid("the result is out of the range of floating-point numbers") from exc
    except (RecursionError, MemoryError) as exc:
        raise _invalid("the expression is nested too deeply") from exc
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
    if not 1 <= seconds <= 60:
        raise ToolError("seconds must be between 1 and 60", error_type="InvalidInput")
    for done in range(seconds):
        ctx.emit(f"writing… {done}/{seconds} s", progress=done / seconds)
        ctx.sleep(1)
    notes = session_note_append(session=ctx.session, text=text)
    ctx.emit("written", progress=1.0)
    return {"notes": len(notes), "appended": text}
