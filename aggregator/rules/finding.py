"""The Finding: what a rule says about one subject on one node.

Stable API: `rule` ids are documented in docs/rules.md and used by alert fingerprints,
policy thresholds and API filters.
"""

from __future__ import annotations

from typing import Literal

import msgspec

Severity = Literal["critical", "warning", "info"]
Evidence = dict[str, str | int | float | bool | None]


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    rule: str  # stable id, e.g. "port-down"
    severity: Severity
    node: str | None  # None for fleet-wide findings
    subject: str  # adapter, "adapter/port", GPU or bridge PCI address, resource, policy
    message: str  # one sentence a human can act on
    evidence: Evidence = msgspec.field(default_factory=dict)

    @property
    def fingerprint(self) -> tuple[str, str | None, str]:
        return (self.rule, self.node, self.subject)
