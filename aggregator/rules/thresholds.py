"""Rule settings from a policy's `alerts` section: enabled, `for`, `resolveAfter` and
numeric thresholds per rule id, validated against the catalogue.

Pure. `parse_alerts` raises ThresholdError naming the key path; `thresholds_for` merges
every policy and turns a bad section into a `data-quality` finding instead of failing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final

from aggregator.errors import AggregatorError
from aggregator.rules.catalog import RULES
from aggregator.rules.finding import Finding
from aggregator.rules.settings import RuleSettings, Thresholds
from proto.policy import Policy

__all__ = [
    "DEFAULT_THRESHOLDS",
    "RuleSettings",
    "ThresholdError",
    "Thresholds",
    "parse_alerts",
    "parse_duration",
    "thresholds_for",
]

_DURATION: Final = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?"
                              r"(?:(\d+(?:\.\d+)?)s)?(?:(\d+(?:\.\d+)?)ms)?\Z")  # fmt: skip
_KEYS: Final = frozenset({"enabled", "for", "resolveAfter", "thresholds"})


class ThresholdError(AggregatorError, ValueError):
    """An invalid `alerts` entry; `path` is the key path inside the policy."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


# Every rule's defaults, from its descriptor (where a policy is silent).
DEFAULT_THRESHOLDS: Final = Thresholds(
    rules=MappingProxyType({rule_id: rule.defaults for rule_id, rule in RULES.items()})
)


def parse_duration(value: object, path: str) -> float:
    """Seconds from a number or "500ms" / "30s" / "2m" / "1h30m"; never negative or NaN."""
    if isinstance(value, bool):
        raise ThresholdError(path, f"must be a duration like 30s, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value and (m := _DURATION.fullmatch(value.strip())):
        h, mi, s, ms = (float(g) if g else 0.0 for g in m.groups())
        if not any(m.groups()):
            raise ThresholdError(path, f"must be a duration like 30s, got {value!r}")
        seconds = h * 3600 + mi * 60 + s + ms / 1000
    else:
        raise ThresholdError(path, f"must be a duration like 30s, got {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ThresholdError(path, f"must be a finite duration >= 0, got {value!r}")
    return seconds


def parse_alerts(raw: Mapping[str, Any], base: Thresholds = DEFAULT_THRESHOLDS) -> Thresholds:
    """`base` with the policy's `alerts` applied; raises ThresholdError on any bad key."""
    if not isinstance(raw, Mapping):
        raise ThresholdError("alerts", "must be a mapping of rule id -> settings")
    rules = dict(base.rules)
    for rule_id, entry in raw.items():
        path = f"alerts.{rule_id}"
        if rule_id not in RULES:
            raise ThresholdError(path, f"unknown rule id {rule_id!r} (see docs/rules.md)")
        if not isinstance(entry, Mapping):
            raise ThresholdError(path, "must be a mapping with enabled/for/resolveAfter/thresholds")
        unknown = sorted(set(map(str, entry)) - _KEYS)
        if unknown:
            raise ThresholdError(f"{path}.{unknown[0]}", f"unknown key; allowed: {sorted(_KEYS)}")
        current = rules[rule_id]
        enabled = entry.get("enabled", current.enabled)
        if not isinstance(enabled, bool):
            raise ThresholdError(f"{path}.enabled", f"must be true or false, got {enabled!r}")
        for_s = current.for_s
        if "for" in entry:
            for_s = parse_duration(entry["for"], f"{path}.for")
        resolve_s = current.resolve_s
        if "resolveAfter" in entry:
            resolve_s = parse_duration(entry["resolveAfter"], f"{path}.resolveAfter")
        params = dict(current.params)
        params.update(_params(rule_id, entry.get("thresholds", {}), f"{path}.thresholds"))
        rules[rule_id] = RuleSettings(
            enabled=enabled, for_s=for_s, resolve_s=resolve_s, params=MappingProxyType(params)
        )
    return Thresholds(rules=MappingProxyType(rules))


def _params(rule_id: str, raw: object, path: str) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        raise ThresholdError(path, "must be a mapping of name -> number")
    known = RULES[rule_id].params
    result: dict[str, float] = {}
    for name, value in raw.items():
        if name not in known:
            allowed = sorted(known) or "none"
            raise ThresholdError(f"{path}.{name}", f"unknown threshold; allowed: {allowed}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ThresholdError(f"{path}.{name}", f"must be a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise ThresholdError(f"{path}.{name}", f"must be a finite number >= 0, got {value!r}")
        result[str(name)] = float(value)
    return result


def thresholds_for(policies: Iterable[Policy]) -> tuple[Thresholds, tuple[Finding, ...]]:
    """All policies' `alerts` applied in policy-name order (a later name wins a clash); a
    policy whose section is invalid is skipped and reported as a `data-quality` finding."""
    thresholds = DEFAULT_THRESHOLDS
    problems: list[Finding] = []
    for policy in sorted(policies, key=lambda p: p.metadata.name):
        try:
            thresholds = parse_alerts(policy.spec.alerts, thresholds)
        except ThresholdError as exc:
            problems.append(
                Finding(
                    rule="data-quality",
                    severity="warning",
                    node=None,
                    subject=f"policy/{policy.metadata.name}",
                    message=f"Policy {policy.metadata.name} has an invalid spec.{exc.path} "
                    f"({exc.reason}); fix it — its alert settings are ignored until then.",
                    evidence={"path": f"spec.{exc.path}", "reason": exc.reason},
                )
            )
    return thresholds, tuple(problems)
