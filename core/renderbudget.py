"""A render budget counted in work, not seconds: the same template fails the same way
on any machine.

The render worker (``core/render.py``) counts what JSON-e does and stops a render
that needs more than its budget of *steps*:

* one step for every template node rendered (``renderValue``) and every expression
  node evaluated (``Interpreter.visit``);
* the size of every value built: a rendered list, object or string costs its length,
  so does a builtin's result (``range``, ``split``, ``join``), an operator's (``+`` on
  strings, a slice), and a comparison or ``in`` costs the size of its operands;
* ``range`` is charged its length *before* it is built, and integer ``*`` and ``**``
  their result's size in bits before it is computed, so one step can never be the
  expensive one.

Every count is a pure function of the template and its context, so a render that
fails fails identically everywhere, with ``render-budget`` steps named in its
message. The wall-clock timeout in the parent stays only as a last-resort net.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# An integer result wider than this is refused before it is computed (msgpack carries
# 64 bits; JSON numbers are doubles).
MAX_INT_BITS = 4096


class BudgetExceeded(Exception):
    """The render needed more steps than its budget."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"it needs more than {limit} render steps (the render budget)")
        self.limit = limit


class Budget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def __repr__(self) -> str:
        return f"<Budget {self.used}/{self.limit}>"

    def reset(self, limit: int) -> None:
        self.limit, self.used = limit, 0

    def charge(self, steps: int) -> None:
        self.used += steps
        if self.used > self.limit:
            raise BudgetExceeded(self.limit)


def size(value: Any) -> int:
    """What holding ``value`` costs: its length for a container or string, else 0."""
    if isinstance(value, (str, list, dict)):
        return len(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value.bit_length() // 64
    return 0


_COMPARE = frozenset(("==", "!=", "<", ">", "<=", ">=", "in"))


def install(budget: Budget) -> None:
    """Instrument the imported ``jsone`` so every render charges ``budget``. Once per
    process: the worker does nothing else."""
    import importlib

    import jsone
    import jsone.builtins
    from jsone.AST import BinOp
    from jsone.interpreter import Interpreter

    # ``jsone.render`` is the package's function; the module of that name holds the
    # operators, and they call its ``renderValue`` by name.
    module: Any = importlib.import_module("jsone.render")
    plain_render_value: Callable[[Any, Any], Any] = module.renderValue

    def render_value(template: Any, context: Any) -> Any:
        budget.charge(1)
        value = plain_render_value(template, context)
        budget.charge(size(value))
        return value

    class _Evaluated:
        """An operand already evaluated (and charged), handed to the stock operator."""

        __slots__ = ("value",)

        def __init__(self, value: Any) -> None:
            self.value = value

    class BudgetedInterpreter(Interpreter):  # type: ignore[misc]  # jsone is untyped
        def visit(self, node: Any) -> Any:
            budget.charge(1)
            return super().visit(node)

        def visit__Evaluated(self, node: _Evaluated) -> Any:  # noqa: N802  # jsone's naming
            return node.value

        def visit_BinOp(self, node: Any) -> Any:  # noqa: N802
            kind = node.token.kind
            if kind in ("||", "&&", "."):
                return super().visit_BinOp(node)
            left, right = self.visit(node.left), self.visit(node.right)
            if kind in _COMPARE:
                budget.charge(size(left) + size(right))
            _charge_arithmetic(budget, kind, left, right)
            value = super().visit_BinOp(BinOp(node.token, _Evaluated(left), _Evaluated(right)))
            budget.charge(size(value))
            return value

        def visit_FunctionCall(self, node: Any) -> Any:  # noqa: N802
            value = super().visit_FunctionCall(node)
            budget.charge(size(value))
            return value

        def visit_ValueAccess(self, node: Any) -> Any:  # noqa: N802
            value = super().visit_ValueAccess(node)
            if node.isInterval:
                budget.charge(size(value))
            return value

    plain_build: Callable[[], dict[str, Any]] = jsone.builtins.build

    def build() -> dict[str, Any]:
        builtins = plain_build()
        plain_range = builtins["range"]

        def charged_range(context: Any, *args: Any) -> Any:
            length = 0
            try:
                length = len(range(*args))
            except OverflowError:
                length = budget.limit + 1
            except (TypeError, ValueError):
                pass  # the stock builtin names the error
            budget.charge(length)
            return plain_range(context, *args)

        charged_range._jsone_builtin = True  # type: ignore[attr-defined]
        builtins["range"] = charged_range
        return builtins

    module.renderValue = render_value
    jsone.renderValue = render_value  # jsone.render() calls the package's name
    module.Interpreter = BudgetedInterpreter
    jsone.builtins.build = build


def _charge_arithmetic(budget: Budget, kind: str, left: Any, right: Any) -> None:
    """Integer ``*`` and ``**``: the result's width, before it is computed."""
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (left, right)):
        return
    if kind == "*":
        bits = left.bit_length() + right.bit_length()
    elif kind == "**":  # jsone evaluates ``a ** b`` as ``b ** a``
        base, exponent = right, left
        bits = base.bit_length() * exponent if exponent > 0 and abs(base) > 1 else 0
    else:
        return
    if bits > MAX_INT_BITS:
        budget.charge(budget.limit + 1)
    budget.charge(bits // 64)
