"""Per-rule settings as values: `RuleSettings` (enabled, `for`, `resolveAfter`, numeric
thresholds) and `Thresholds`, the settings of every rule id.

Pure data; knows no rule. The defaults come from the rule descriptors
(`aggregator.rules.thresholds.DEFAULT_THRESHOLDS`), parsing from `thresholds.parse_alerts`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Final

NO_PARAMS: Final[Mapping[str, float]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class RuleSettings:
    enabled: bool = True
    for_s: float = 0.0  # a finding must hold this long before its alert fires
    resolve_s: float = 0.0  # and be gone this long before the alert resolves
    params: Mapping[str, float] = field(default_factory=lambda: NO_PARAMS)


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Settings per rule id (`RuleSettings()` for a rule it does not name)."""

    rules: Mapping[str, RuleSettings]

    def of(self, rule: str) -> RuleSettings:
        return self.rules.get(rule) or RuleSettings()

    def param(self, rule: str, name: str) -> float:
        return self.of(rule).params[name]

    def enabled(self, rule: str) -> bool:
        return self.of(rule).enabled

    def with_rule(self, rule: str, **changes: Any) -> Thresholds:
        return Thresholds(
            rules=MappingProxyType({**self.rules, rule: replace(self.of(rule), **changes)})
        )
