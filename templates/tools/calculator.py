"""A calculator the model may call (``tools: [{function: posttrain.templates.tools.calculator:calculate}]``).

Arithmetic on numbers and nothing else: the expression is parsed, never
evaluated as Python, and a mistake in it (a name, a power, a division by
zero) raises, which the model reads back as the call's error.
"""

import ast
import operator
from typing import Callable, Dict, Type

_OPERATORS: Dict[Type[ast.AST], Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculate(expression: str) -> str:
    """Evaluates an arithmetic expression: numbers, + - * / and parentheses.

    Args:
        expression: The expression to evaluate, e.g. "12 * (3 + 4) - 5 / 2".
    """
    value = _evaluate(ast.parse(expression.strip(), mode="eval").body)
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    raise ValueError(f"not arithmetic: {ast.unparse(node)!r}; use numbers, + - * / and parentheses")
