"""The `clock-skew` rule: an agent whose clock runs off the aggregator's by more than the
tolerance. Skewed clocks break traces and logs, and every time the agent reports is off.

Pure. Reads the offset the fleet estimates per agent process (aggregator.fleet.clockoffset:
the least delayed of its recent messages' stamp minus arrival), never a clock.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

from aggregator.rules.descriptor import Rule, RuleInput
from aggregator.rules.finding import Finding

RULE: Final = "clock-skew"


def check_clock_skew(given: RuleInput) -> list[Finding]:
    tolerance = given.thresholds.param(RULE, "toleranceS")
    found: list[Finding] = []
    for node in sorted(given.fleet):
        clock = given.fleet[node].clock
        if clock is None or abs(clock.offset_s) <= tolerance:
            continue
        offset = clock.offset_s
        direction = "ahead of" if offset > 0 else "behind"
        found.append(
            Finding(
                rule=RULE,
                severity="warning",
                node=node,
                subject="clock",
                message=f"The clock on {node} is {abs(offset):.1f}s {direction} the "
                f"aggregator's (tolerance {tolerance:g}s): fix its time sync (chrony/NTP); "
                "the times it reports, its logs and traces are off by as much.",
                evidence={
                    "offset_s": round(offset, 3),
                    "direction": "ahead" if offset > 0 else "behind",
                    "tolerance_s": tolerance,
                },
            )
        )
    return found


RULES: Final[tuple[Rule, ...]] = (
    Rule(id=RULE, family="data", severity="warning", check=check_clock_skew,
         reads=frozenset({"clock"}), params=MappingProxyType({"toleranceS": 5.0})),
)  # fmt: skip
