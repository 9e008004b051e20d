"""The `label` filter of `/api/v1/nodes`: Kubernetes equality-based label selectors
(`key=value`, `key==value`, `key!=value`, `key`, `!key`, comma-separated, all must hold).

Pure: parses the query value and matches it against a node's labels from the cluster
view. The grammar is one regular expression, served as-is in the OpenAPI document.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final, Literal

import msgspec

_DNS_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_NAME = "[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
KEY: Final = rf"({_DNS_LABEL}(\.{_DNS_LABEL})*/)?{_NAME}"
_REQUIREMENT = rf"!?{KEY}|{KEY}(=|==|!=)({_NAME})?"
SELECTOR_PATTERN: Final = rf"^({_REQUIREMENT})(,({_REQUIREMENT}))*$"
MAX_SELECTOR_LENGTH: Final = 1024
_ONE: Final = re.compile(rf"(?P<absent>!)?(?P<key>{KEY})((?P<op>==|!=|=)(?P<value>({_NAME})?))?")
_WHOLE: Final = re.compile(SELECTOR_PATTERN[1:-1])

Operator = Literal["=", "!=", "exists", "absent"]


class Requirement(msgspec.Struct, frozen=True):
    key: str
    op: Operator
    value: str = ""


def parse_selector(raw: str) -> tuple[Requirement, ...]:
    """ValueError for anything `SELECTOR_PATTERN` (with its length bound) does not match."""
    if len(raw) > MAX_SELECTOR_LENGTH or not _WHOLE.fullmatch(raw):
        raise ValueError(
            "label must be a label selector like 'rack=r1,!cordoned' (key=value, key!=value, "
            f"key, !key; comma-separated; at most {MAX_SELECTOR_LENGTH} characters), got {raw!r}"
        )
    requirements = []
    for part in raw.split(","):  # values and keys hold no commas, so this split is exact
        found = _ONE.fullmatch(part)
        if found is None or (found["absent"] and found["op"]):
            raise ValueError(f"label: {part!r} is not a label requirement")
        op = found["op"]
        if op is None:
            requirements.append(
                Requirement(found["key"], "absent" if found["absent"] else "exists")
            )
        else:
            requirements.append(
                Requirement(found["key"], "!=" if op == "!=" else "=", found["value"])
            )
    return tuple(requirements)


def selected(requirements: tuple[Requirement, ...], labels: Mapping[str, str]) -> bool:
    """Kubernetes semantics: `key!=v` also holds for a node without the label."""
    for r in requirements:
        value = labels.get(r.key)
        if r.op == "exists" and value is None:
            return False
        if r.op == "absent" and value is not None:
            return False
        if r.op == "=" and value != r.value:
            return False
        if r.op == "!=" and value == r.value:
            return False
    return True
