"""Counter rules on the latest counter batch of each node: error rates per counter family,
transport retries exceeded and ignored congestion notifications.

Pure. Rates come from the agent (agent/counters/rates.py): a counter that saturated or reset has no
rate this round and is reported by `data-quality`, as is a rate that is NaN or negative.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from aggregator.fleet.state import NodeRecord
from aggregator.rules.counterbase import quiet
from aggregator.rules.descriptor import COUNTERS, Rule, RuleInput
from aggregator.rules.finding import Finding
from aggregator.rules.fleetfacts import finite
from proto.messages.counters import PortCounters

Fleet = Mapping[str, NodeRecord]

# The counters of each family counter-errors judges (their rates summed), and its default
# per-second limit for each family (policy alerts.counter-errors.thresholds.<family>).
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
_FAMILY_LIMITS: Final[Mapping[str, float]] = MappingProxyType(
    {
        "physical_errors": 1.0,
        "port_rcv_errors": 1.0,
        "discards": 10.0,
        "local_ack_timeout_err": 1.0,
        "out_of_sequence": 100.0,
        "packet_seq_err": 1.0,
        "roce_adp_retrans": 10.0,
        "rx_icrc_encapsulated": 1.0,
    }
)
RETRY_COUNTERS: Final = (
    "hw_counters/req_transport_retries_exceeded",
    "hw_counters/req_rnr_retries_exceeded",
)
CNP_IGNORED: Final = "hw_counters/rp_cnp_ignored"
_FAMILIES: Final = tuple(COUNTER_FAMILIES.items())
# The counter/rate keys (rate-key spelling) each rule reads of a port, besides its
# device/port: aggregator.rules.engine.incremental reuses a node's findings over a counter delta
# that changed none of them.
COUNTER_ERRORS_KEYS: Final = frozenset(k for keys in COUNTER_FAMILIES.values() for k in keys)
RETRIES_EXCEEDED_KEYS: Final = frozenset(RETRY_COUNTERS)
CC_MISCONFIGURED_KEYS: Final = frozenset({CNP_IGNORED, "hw_counters/rp_cnp_handled"})
_CNP_IGNORED: Final = frozenset({CNP_IGNORED})  # what cc-misconfigured fires on


def _batches(fleet: Fleet, keys: frozenset[str]) -> list[tuple[str, PortCounters]]:
    """The ports of every node with a rate > 0 under `keys` (or not known not to have one):
    the rules below fire only on such a rate above a limit >= 0 (Thresholds enforce it)."""
    result: list[tuple[str, PortCounters]] = []
    # Findings are sorted by the caller: the fleet's order is fine (no per-call sort).
    for node, record in fleet.items():
        if quiet(record, keys):
            continue  # no batch merged for it
        batch = record.counters
        if batch is not None:
            result.extend((node, pc) for pc in batch.ports)
    return result


def _rate(pc: PortCounters, key: str) -> float | None:
    value = pc.rates.get(key)
    return value if finite(value) else None


def check_counter_errors(given: RuleInput) -> list[Finding]:
    limits = given.thresholds.of("counter-errors").params
    families = [(family, keys, limits.get(family, 0.0)) for family, keys in _FAMILIES]
    isfinite = math.isfinite
    found: list[Finding] = []
    for node, pc in _batches(given.fleet, COUNTER_ERRORS_KEYS):
        over: dict[str, float] = {}
        rates = pc.rates
        for family, keys, limit in families:  # `_rate` inlined: this runs per port
            rated = [r for key in keys if (r := rates.get(key)) is not None and isfinite(r)
                     and r >= 0]  # fmt: skip
            total = sum(rated) if rated else 0
            if total > limit:
                over[family] = total
        if not over:
            continue
        where = f"{pc.device}/{pc.port}"
        worst = max(over, key=lambda f: over[f] / max(limits.get(f, 0.0), 1e-9))
        found.append(
            Finding(
                rule="counter-errors",
                severity="warning",
                node=node,
                subject=where,
                message=f"{where} counts {worst} at {over[worst]:.3g}/s (limit "
                f"{limits.get(worst, 0.0):g}/s){_hint(worst)}",
                evidence={
                    **{f"{f}_per_s": round(v, 6) for f, v in sorted(over.items())},
                    **{f"{f}_limit": limits.get(f, 0.0) for f in sorted(over)},
                },
            )
        )
    return found


def _hint(family: str) -> str:
    if family in ("physical_errors", "port_rcv_errors", "rx_icrc_encapsulated"):
        return "; check or replace the cable/transceiver and the switch port."
    if family == "discards":
        return "; the fabric is congested or the peer is not draining — check the switch."
    return "; look for packet loss on the path (PFC/ECN on RoCE, the peer's errors on IB)."


def check_retries_exceeded(given: RuleInput) -> list[Finding]:
    limit = given.thresholds.param("retries-exceeded", "rate")
    found: list[Finding] = []
    for node, pc in _batches(given.fleet, RETRIES_EXCEEDED_KEYS):
        moving = {
            key: rate for key in RETRY_COUNTERS
            if (rate := _rate(pc, key)) is not None and rate > limit
        }  # fmt: skip
        if not moving:
            continue
        where = f"{pc.device}/{pc.port}"
        found.append(
            Finding(
                rule="retries-exceeded",
                severity="critical",
                node=node,
                subject=where,
                message=f"{where}: RDMA requests exhaust their retries "
                f"({', '.join(k.split('/')[1] for k in sorted(moving))}), so jobs using it "
                "are failing; find the unreachable or overloaded peer and check the path.",
                evidence={f"{k.split('/')[1]}_per_s": v for k, v in sorted(moving.items())},
            )
        )
    return found


def check_cc_misconfigured(given: RuleInput) -> list[Finding]:
    limit = given.thresholds.param("cc-misconfigured", "rate")
    found: list[Finding] = []
    for node, pc in _batches(given.fleet, _CNP_IGNORED):
        rate = _rate(pc, CNP_IGNORED)
        if rate is None or rate <= limit:
            continue
        where = f"{pc.device}/{pc.port}"
        found.append(
            Finding(
                rule="cc-misconfigured",
                severity="warning",
                node=node,
                subject=where,
                message=f"{where} ignores congestion notifications (rp_cnp_ignored "
                f"{rate:.3g}/s): enable DCQCN for the traffic's priority "
                "(mlxconfig/sysfs roce_rp_enable) so the sender slows down.",
                evidence={
                    "rp_cnp_ignored_per_s": rate,
                    "rp_cnp_handled_per_s": _rate(pc, "hw_counters/rp_cnp_handled"),
                },
            )
        )
    return found


RULES: Final[tuple[Rule, ...]] = (
    Rule(id="counter-errors", family="counters", severity="warning",
         check=check_counter_errors, reads=COUNTERS, counter_keys=COUNTER_ERRORS_KEYS,
         for_s=10.0, resolve_s=60.0, params=_FAMILY_LIMITS),
    Rule(id="retries-exceeded", family="counters", severity="critical",
         check=check_retries_exceeded, reads=COUNTERS, counter_keys=RETRIES_EXCEEDED_KEYS,
         resolve_s=60.0, params=MappingProxyType({"rate": 0.0})),
    Rule(id="cc-misconfigured", family="counters", severity="warning",
         check=check_cc_misconfigured, reads=COUNTERS, counter_keys=CC_MISCONFIGURED_KEYS,
         for_s=30.0, resolve_s=60.0, params=MappingProxyType({"rate": 0.0})),
)  # fmt: skip
