"""aggregator.api.labelselect: parsing `label` selectors and matching node labels."""

from __future__ import annotations

import re

import pytest

from aggregator.api.labelselect import (
    MAX_SELECTOR_LENGTH,
    SELECTOR_PATTERN,
    Requirement,
    parse_selector,
    selected,
)

LABELS = {"rack": "r1", "nicfleet.io/rail": "3", "gpu": "", "kubernetes.io/os": "linux"}


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        pytest.param("rack=r1", (Requirement("rack", "=", "r1"),), id="equals"),
        pytest.param("rack==r1", (Requirement("rack", "=", "r1"),), id="double-equals"),
        pytest.param("rack!=r1", (Requirement("rack", "!=", "r1"),), id="not-equals"),
        pytest.param("gpu", (Requirement("gpu", "exists"),), id="exists"),
        pytest.param("!cordoned", (Requirement("cordoned", "absent"),), id="absent"),
        pytest.param("gpu=", (Requirement("gpu", "=", ""),), id="empty-value"),
        pytest.param(
            "nicfleet.io/rail=3,!x",
            (Requirement("nicfleet.io/rail", "=", "3"), Requirement("x", "absent")),
            id="prefixed-key-and-list",
        ),
    ],
)
def test_parse(raw: str, parsed: tuple[Requirement, ...]) -> None:
    assert parse_selector(raw) == parsed
    assert re.fullmatch(SELECTOR_PATTERN[1:-1], raw)  # the served pattern says the same


@pytest.mark.parametrize(
    "raw",
    ["", ",", "a,", "!a=b", "a b", "a=b c", "a in (b)", "=b", "A.B/c=d", "a=-b", "a=b=c",
     "x" * (MAX_SELECTOR_LENGTH + 1), "a\n"],
    ids=["empty", "comma", "trailing-comma", "absent-with-value", "space", "space-in-value",
         "set-based", "no-key", "upper-prefix", "value-starts-with-dash", "two-equals",
         "too-long", "newline"],
)  # fmt: skip
def test_bad_selectors_raise(raw: str) -> None:
    with pytest.raises(ValueError, match="label"):
        parse_selector(raw)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        pytest.param("rack=r1", True, id="equal"),
        pytest.param("rack=r2", False, id="other-value"),
        pytest.param("rack!=r2", True, id="not-equal"),
        pytest.param("zone!=a", True, id="not-equal-holds-without-the-label"),
        pytest.param("gpu", True, id="exists-empty-value"),
        pytest.param("gpu=", True, id="equals-empty"),
        pytest.param("zone", False, id="exists-missing"),
        pytest.param("!zone", True, id="absent"),
        pytest.param("!rack", False, id="absent-but-present"),
        pytest.param("rack=r1,nicfleet.io/rail=3,!zone", True, id="all-hold"),
        pytest.param("rack=r1,nicfleet.io/rail=4", False, id="one-fails"),
    ],
)
def test_selected(raw: str, match: bool) -> None:
    assert selected(parse_selector(raw), LABELS) is match


def test_a_node_without_labels() -> None:
    assert selected(parse_selector("!rack,zone!=a"), {})
    assert not selected(parse_selector("rack"), {})
