"""The tool-call environment: a calculator, a unit converter and a lookup table, with answer checks.

Each task's answer is a number that needs one or two tool calls to get; the final reply is
checked by its last number, within a tolerance. The tools run in-process: they are pure
functions of their arguments, so there is nothing to sandbox.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from dataclasses import dataclass
from typing import Any

from .base import Outcome, StepResult, check_arguments, function_tool

CALCULATOR = function_tool(
    "calculator", "Evaluate an arithmetic expression: numbers, + - * / // % **, parentheses.",
    {"expression": {"type": "string", "description": "e.g. (17 * 23) + 4"}}, ["expression"])

_LENGTH_M = {"m": 1.0, "km": 1000.0, "cm": 0.01, "mm": 0.001, "mi": 1609.344, "ft": 0.3048, "in": 0.0254}
_MASS_KG = {"kg": 1.0, "g": 0.001, "lb": 0.45359237, "oz": 0.028349523125}
_TEMPS = ("C", "F", "K")
UNITS = (*_LENGTH_M, *_MASS_KG, *_TEMPS)

CONVERT = function_tool(
    "convert_units", "Convert a quantity between units of length (m km cm mm mi ft in), mass (kg g lb oz) or temperature (C F K).",
    {"value": {"type": "number"}, "from_unit": {"type": "string", "enum": list(UNITS)},
     "to_unit": {"type": "string", "enum": list(UNITS)}}, ["value", "from_unit", "to_unit"])

TABLES: dict[str, dict[str, float]] = {
    "atomic_number": {"hydrogen": 1, "carbon": 6, "nitrogen": 7, "oxygen": 8, "sodium": 11, "iron": 26, "copper": 29, "gold": 79},
    "boiling_point_c": {"water": 100.0, "ethanol": 78.37, "nitrogen": -195.8, "mercury": 356.7},
    "planet_moons": {"mercury": 0, "venus": 0, "earth": 1, "mars": 2},
}

LOOKUP = function_tool(
    "lookup", "Look up a value in a reference table: atomic_number (elements), boiling_point_c (substances), planet_moons (planets).",
    {"table": {"type": "string", "enum": list(TABLES)}, "key": {"type": "string", "description": "lower-case name, e.g. iron"}},
    ["table", "key"])

TOOLS = (CALCULATOR, CONVERT, LOOKUP)
_BY_NAME = {t["function"]["name"]: t for t in TOOLS}

_OPS: dict[type, Any] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
                         ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
                         ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(expression: str) -> float:
    """Evaluates arithmetic only (no names, calls or attributes), with bounds that keep it cheap."""
    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 1e6):
                raise ValueError("power too large")  # 9**9**9 would hold the worker for minutes
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"unsupported element {type(node).__name__}")

    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an expression ({e.msg})") from None
    try:
        return ev(tree.body)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None


def convert(value: float, from_unit: str, to_unit: str) -> float:
    for table in (_LENGTH_M, _MASS_KG):
        if from_unit in table and to_unit in table:
            return value * table[from_unit] / table[to_unit]
    if from_unit in _TEMPS and to_unit in _TEMPS:
        k = {"C": value + 273.15, "F": (value - 32) * 5 / 9 + 273.15, "K": value}[from_unit]
        return {"C": k - 273.15, "F": (k - 273.15) * 9 / 5 + 32, "K": k}[to_unit]
    raise ValueError(f"cannot convert {from_unit} to {to_unit}: different kinds of quantity")


def lookup(table: str, key: str) -> float:
    rows = TABLES[table]
    k = key.strip().lower()
    if k not in rows:
        raise ValueError(f"{key!r} is not in {table} (it has {', '.join(rows)})")
    return rows[k]


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:.6g}"


@dataclass(frozen=True)
class ToolTask:
    id: str
    prompt: str
    answer: float
    tolerance: float  # absolute


TASKS: tuple[ToolTask, ...] = (
    ToolTask("arith", "What is 17 * 23 + 4?", 395, 1e-9),
    ToolTask("miles-to-km", "How many kilometres are 26.2 miles? Round to two decimals.", 42.16, 0.01),
    ToolTask("fahrenheit", "What is 98.6 degrees Fahrenheit in Celsius?", 37.0, 0.05),
    ToolTask("atomic-sum", "What is the atomic number of iron plus the atomic number of oxygen?", 34, 1e-9),
    ToolTask("moons-times-boil", "Multiply the number of moons of Mars by the boiling point of water in Celsius.", 200, 1e-9),
)
TASKS_BY_ID = {t.id: t for t in TASKS}

_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def last_number(text: str | None) -> float | None:
    found = _NUMBER.findall(text or "")
    return float(found[-1].replace(",", "")) if found else None


class ToolCallEnv:
    name = "toolcall"

    def __init__(self, tasks: tuple[ToolTask, ...] = TASKS) -> None:
        self._tasks = {t.id: t for t in tasks}
        self._task: ToolTask | None = None
        self.calls = 0

    def task_ids(self) -> list[str]:
        return list(self._tasks)

    def tools(self) -> list[dict[str, Any]]:
        return list(TOOLS)

    def reset(self, task_id: str) -> list[dict[str, Any]]:
        if task_id not in self._tasks:
            raise ValueError(f"toolcall: unknown task {task_id!r} (known: {', '.join(self._tasks)})")
        self._task = self._tasks[task_id]
        self.calls = 0
        return [{"role": "system", "content": "Answer the question. Use the tools for every calculation, conversion and fact; "
                                              "end with a reply that states the final number, without a tool call."},
                {"role": "user", "content": self._task.prompt}]

    def step(self, name: str, arguments: dict[str, Any]) -> StepResult:
        if self._task is None:
            raise RuntimeError("toolcall: step before reset")
        tool = _BY_NAME.get(name)
        if tool is None:
            return StepResult(f"error: unknown tool {name!r}; the tools are {', '.join(_BY_NAME)}", ok=False)
        problem = check_arguments(tool, arguments)
        if problem is not None:
            return StepResult(f"error: {problem}", ok=False)
        self.calls += 1
        try:
            if name == "calculator":
                value = calculate(arguments["expression"])
            elif name == "convert_units":
                value = convert(float(arguments["value"]), arguments["from_unit"], arguments["to_unit"])
            else:
                value = lookup(arguments["table"], arguments["key"])
        except (ValueError, OverflowError) as e:
            return StepResult(f"error: {e}", ok=False)
        if isinstance(value, float) and not math.isfinite(value):
            return StepResult("error: the result is not a finite number", ok=False)
        return StepResult(_fmt(value), ok=True)

    def finish(self, final_text: str | None) -> Outcome:
        if self._task is None:
            raise RuntimeError("toolcall: finish before reset")
        got = last_number(final_text)
        want = self._task.answer
        if got is None:
            return Outcome(False, f"the final reply names no number (expected {_fmt(want)})")
        if abs(got - want) <= self._task.tolerance:
            return Outcome(True, f"answered {_fmt(got)}")
        return Outcome(False, f"answered {_fmt(got)}, expected {_fmt(want)}")

    def info(self) -> dict[str, Any]:
        return {"env": self.name, "task": self._task.id if self._task else None, "calls": self.calls}

    def close(self) -> None:
        self._task = None
