"""docs/rules.md is the rules reference: every rule id of the catalogue, and every id the
NicClusterPolicy audit's findings carry (aggregator.reconcile.nvidia.AUDIT_RULES), has exactly
one row in a table with a severity, what fires it, a likely cause and a fix, and no row names
a rule neither knows."""

from __future__ import annotations

import re

import pytest

from aggregator.reconcile.nvidia import AUDIT_RULES
from aggregator.rules.catalog import RULE_IDS, RULES
from tests.support.paths import REPO

DOC = REPO / "docs" / "rules.md"
_ROW = re.compile(r"^\|\s*`([a-z0-9-]+)`\s*\|")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def rule_rows(text: str) -> dict[str, list[dict[str, str]]]:
    """rule id → its rows in the tables whose header has rule, severity, cause and fix."""
    rows: dict[str, list[dict[str, str]]] = {}
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = [c.lower() for c in cells]
            continue
        wanted = header[0] == "rule" and any("cause" in h for h in header)
        match = _ROW.match(line)
        if wanted and match and any(h == "fix" for h in header):
            rows.setdefault(match.group(1), []).append(dict(zip(header, cells, strict=True)))
    return rows


ROWS = rule_rows(DOC.read_text(encoding="utf-8"))


def _one_row(rule: str) -> dict[str, str]:
    found = ROWS.get(rule, [])
    assert len(found) == 1, f"docs/rules.md needs exactly one table row for `{rule}`"
    row = found[0]
    cause = next(v for k, v in row.items() if "cause" in k)
    assert cause and row["fix"], f"`{rule}`: fill in the likely cause and the fix"
    assert row[next(k for k in row if k.startswith("fires when"))], f"`{rule}`: when it fires"
    return row


@pytest.mark.parametrize("rule", RULE_IDS)
def test_every_rule_has_one_row_with_cause_and_fix(rule: str) -> None:
    row = _one_row(rule)
    assert RULES[rule].severity in row["severity"], f"`{rule}`: severity differs from catalog"


@pytest.mark.parametrize(("rule", "severities"), sorted(AUDIT_RULES.items()))
def test_every_audit_finding_has_one_row_with_its_severities(
    rule: str, severities: tuple[str, ...]
) -> None:
    row = _one_row(rule)
    for severity in severities:
        assert severity in row["severity"], f"`{rule}`: the audit can say {severity}"


def test_no_row_names_an_unknown_rule() -> None:
    assert set(ROWS) <= {*RULE_IDS, *AUDIT_RULES}


def test_the_parser_sees_a_broken_table() -> None:
    text = "| rule | severity | fires when | likely cause | fix |\n|---|---|---|---|---|\n"
    row = "| `port-down` | critical | down | cable |  |\n"
    rows = rule_rows(text + row + "\nnot a table\n")
    assert rows == {
        "port-down": [
            {
                "rule": "`port-down`",
                "severity": "critical",
                "fires when": "down",
                "likely cause": "cable",
                "fix": "",
            }
        ]
    }
    assert rule_rows((text + row).replace("| fix |", "| what |")) == {}
