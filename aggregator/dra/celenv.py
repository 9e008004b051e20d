"""DRA's CEL environment over the `cel` package (common-expression-language): the
`device` variable Kubernetes gives selectors (`device.driver`,
`device.attributes["domain"].name`, `device.capacity["domain"].name`,
`device.allowMultipleAllocations`) and the quantity helpers selectors use.

Differences from the API server, kept small on purpose: quantities are plain numbers
(`quantity("1Gi")` is 1073741824, so `compareTo`/`isGreaterThan`/`isLessThan` and plain
comparisons work), version attributes are strings, and there is no cost limit in this
library — the caller bounds the time (aggregator.ctl.claim runs it in a child process).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any, Final

import cel

from aggregator.dra.objects import Device, Selector
from aggregator.errors import AggregatorError

_QUANTITY: Final = re.compile(
    r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$"
)
_SUFFIX: Final[dict[str | None, int | Fraction]] = {
    None: 1,
    "m": Fraction(1, 1000),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
# A missing domain reads as an empty map in Kubernetes; this library raises KeyError, so
# the evaluator adds the missing domain and retries, at most this often.
_MAX_RETRIES: Final = 8


class CelCompileError(AggregatorError, ValueError):
    """A selector that does not compile: names where it came from and the expression."""


class CelRuntimeError(AggregatorError, ValueError):
    """A selector that failed on a device (the scheduler then fails the whole claim)."""


def parse_quantity(text: str) -> int | float:
    """A Kubernetes quantity string as a number (integers stay exact)."""
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a quantity")
    try:
        value = Fraction(Decimal(match[1])) * _SUFFIX[match[2]]
    except InvalidOperation as exc:
        raise ValueError(f"{text!r} is not a quantity") from exc
    return int(value) if value.denominator == 1 else float(value)


def _compare(a: Any, b: Any) -> int:
    return int(a > b) - int(a < b)


_FUNCTIONS: Final[dict[str, Callable[..., Any]]] = {
    "quantity": parse_quantity,
    "isQuantity": lambda s: _QUANTITY.match(str(s)) is not None,
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: a > b,
    "isLessThan": lambda a, b: a < b,
    "asInteger": int,
    "asApproximateFloat": float,
}


@dataclass(frozen=True)
class Compiled:
    selector: Selector
    program: cel.Program


def compile_selector(selector: Selector) -> Compiled:
    try:
        return Compiled(selector, cel.compile(selector.expression))
    except (ValueError, TypeError, RuntimeError) as exc:
        raise CelCompileError(
            f"{selector.where}: CEL expression {selector.expression!r} does not compile: {exc}"
        ) from exc


def _domains(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        domain, _, short = name.rpartition("/")
        out.setdefault(domain, {})[short] = value
    return out


def device_variable(device: Device, extra_domains: Iterable[str] = ()) -> dict[str, Any]:
    """The `device` variable for one device; `extra_domains` are empty maps."""
    attributes = _domains(dict(device.attributes))
    capacity: dict[str, dict[str, Any]] = {}
    for name, text in device.capacity.items():
        domain, _, short = name.rpartition("/")
        try:
            capacity.setdefault(domain, {})[short] = parse_quantity(text)
        except ValueError:
            capacity.setdefault(domain, {})[short] = text
    for domain in extra_domains:
        attributes.setdefault(domain, {})
        capacity.setdefault(domain, {})
    return {
        "driver": device.driver,
        "allowMultipleAllocations": False,
        "attributes": attributes,
        "capacity": capacity,
    }


def matches(compiled: Compiled, device: Device) -> bool:
    """Whether the selector accepts the device; CelRuntimeError when it fails on it."""
    extra: list[str] = []
    for _ in range(_MAX_RETRIES):
        variable = device_variable(device, extra)
        try:
            result = compiled.program.execute(
                cel.Context(variables={"device": variable}, functions=_FUNCTIONS)
            )
        except KeyError as exc:
            key = str(exc.args[0]) if exc.args else ""
            if key in variable["attributes"] or key in extra or "." not in key:
                # a missing attribute inside a domain: an error in Kubernetes too
                raise _runtime(compiled, device, f"no such key: {key}") from exc
            extra.append(key)
            continue
        except (ValueError, TypeError, RuntimeError) as exc:
            raise _runtime(compiled, device, str(exc)) from exc
        if not isinstance(result, bool):
            raise _runtime(compiled, device, f"returned {type(result).__name__}, not bool")
        return result
    raise _runtime(compiled, device, "too many unknown domains")


def _runtime(compiled: Compiled, device: Device, reason: str) -> CelRuntimeError:
    sel = compiled.selector
    return CelRuntimeError(f"{sel.where}: CEL {sel.expression!r} on {device.name}: {reason}")
