"""The rule catalogue: every stable rule id with its family, severity and default settings.

Pure data. Rule modules, threshold parsing and docs/rules.md all follow this table; a rule
id is API (alert fingerprints, policy `alerts` keys, API filters) and is never renamed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from aggregator.rules.finding import Severity


@dataclass(frozen=True, slots=True)
class RuleInfo:
    id: str
    family: str
    severity: Severity  # the usual severity; a few rules escalate (see docs/rules.md)
    for_s: float = 0.0  # default `for`: how long a finding must hold before it alerts
    resolve_s: float = 0.0  # default hysteresis: how long it must be gone before resolving
    # Numeric parameters a policy may override under alerts.<rule>.thresholds.
    params: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


def _p(**values: float) -> Mapping[str, float]:
    return MappingProxyType(dict(values))


# Per-second rates above which counter-errors fires, by counter family.
COUNTER_FAMILIES: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "physical_errors": (
            "counters/symbol_error",
            "counters/local_link_integrity_errors",
            "counters/excessive_buffer_overrun_errors",
        ),
        "port_rcv_errors": (
            "counters/port_rcv_errors",
            "counters/port_rcv_remote_physical_errors",
        ),
        "discards": ("counters/port_xmit_discards",),
        "local_ack_timeout_err": ("hw_counters/local_ack_timeout_err",),
        "out_of_sequence": ("hw_counters/out_of_sequence",),
        "packet_seq_err": ("hw_counters/packet_seq_err",),
        "roce_adp_retrans": ("hw_counters/roce_adp_retrans",),
        "rx_icrc_encapsulated": ("hw_counters/rx_icrc_encapsulated",),
    }
)
RETRY_COUNTERS: Final = (
    "hw_counters/req_transport_retries_exceeded",
    "hw_counters/req_rnr_retries_exceeded",
)
FLAP_COUNTERS: Final = ("counters/link_downed", "counters/link_error_recovery")
CNP_IGNORED: Final = "hw_counters/rp_cnp_ignored"

_RULES: Final[tuple[RuleInfo, ...]] = (
    # topology
    RuleInfo(id="gpu-nic-affinity", family="topology", severity="warning"),
    RuleInfo(id="pcie-degraded", family="topology", severity="warning", for_s=30.0),
    RuleInfo(id="acs-enabled", family="topology", severity="warning"),
    RuleInfo(id="peermem-missing", family="topology", severity="warning"),
    RuleInfo(id="iommu-translated", family="topology", severity="warning"),
    RuleInfo(id="numa-unknown", family="topology", severity="warning"),
    # links
    RuleInfo(id="port-down", family="links", severity="critical"),
    RuleInfo(id="rate-mismatch", family="links", severity="warning", for_s=30.0),
    RuleInfo(id="link-layer-mismatch", family="links", severity="critical"),
    RuleInfo(id="mtu-mismatch", family="links", severity="warning", for_s=30.0),
    RuleInfo(id="link-flap", family="links", severity="warning", resolve_s=300.0),
    # counters
    RuleInfo(
        id="counter-errors",
        family="counters",
        severity="warning",
        for_s=10.0,
        resolve_s=60.0,
        params=_p(
            physical_errors=1.0,
            port_rcv_errors=1.0,
            discards=10.0,
            local_ack_timeout_err=1.0,
            out_of_sequence=100.0,
            packet_seq_err=1.0,
            roce_adp_retrans=10.0,
            rx_icrc_encapsulated=1.0,
        ),
    ),
    RuleInfo(
        id="retries-exceeded",
        family="counters",
        severity="critical",
        resolve_s=60.0,
        params=_p(rate=0.0),
    ),
    RuleInfo(
        id="cc-misconfigured",
        family="counters",
        severity="warning",
        for_s=30.0,
        resolve_s=60.0,
        params=_p(rate=0.0),
    ),
    # versions
    RuleInfo(id="fw-skew", family="versions", severity="warning"),
    RuleInfo(id="fw-below-minimum", family="versions", severity="critical"),
    RuleInfo(id="driver-skew", family="versions", severity="warning"),
    # fleet / policy
    RuleInfo(id="agent-stale", family="fleet", severity="critical", params=_p(staleAfter=30.0)),
    RuleInfo(id="resource-zero", family="fleet", severity="critical", for_s=10.0),
    RuleInfo(id="selector-matches-nothing", family="fleet", severity="warning"),
    RuleInfo(id="policy-conflict", family="fleet", severity="warning"),
    RuleInfo(id="rail-mismatch", family="fleet", severity="warning"),
    # input quality
    RuleInfo(id="data-quality", family="data", severity="warning"),
)

RULES: Final[Mapping[str, RuleInfo]] = MappingProxyType({r.id: r for r in _RULES})
RULE_IDS: Final[tuple[str, ...]] = tuple(r.id for r in _RULES)
SEVERITY_ORDER: Final[Mapping[str, int]] = MappingProxyType(
    {"critical": 0, "warning": 1, "info": 2}
)
