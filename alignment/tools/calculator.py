"""The built-in `calculator` tool: arithmetic parsed with Python's own grammar (ast) and computed by walking the
tree, never evaluated. Integers stay exact; sizes are bounded so that no expression can hang or exhaust memory."""

import ast
import math
import operator

from alignment.tools.registry import register_tool

MAX_CHARS = 200  # also bounds the parser's recursion
MAX_EXPONENT = 64
MAX_DIGITS = 100  # largest integer magnitude kept, in decimal digits

BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    pass


def calculate(expression: str):
    """'(12+7)*2' -> 38; raises CalculatorError saying what is not arithmetic or out of range."""
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/"), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"not an arithmetic expression: {expression!r}") from None
    return _value(tree.body)


def _value(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is larger than {MAX_EXPONENT}")
        try:
            result = BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("the result is too large") from None
        if isinstance(result, complex):
            raise CalculatorError("the result is not a real number")
        return _bounded(result)
    raise CalculatorError(f"only numbers, + - * / // % ** and parentheses are allowed, not {ast.unparse(node)!r}")


def _bounded(value):
    """A number the calculator may hold: an integer of fewer than MAX_DIGITS digits, a finite float (a literal like
    1e999 is read as infinity)."""
    if isinstance(value, int) and abs(value) >= 10**MAX_DIGITS or isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the number is too large")
    return value


def format_number(value) -> str:
    """Whole results as integers (6/2 -> '3'), others with 12 significant digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return str(value) if isinstance(value, int) else f"{value:.12g}"


@register_tool("calculator", in_process=True)
def calculator(expression: str) -> str:
    """Computes an arithmetic expression: numbers, + - * / // % ** and parentheses.

    Args:
        expression: the arithmetic to compute, for example "(12+7)*2"
    """
    return format_number(calculate(expression))
