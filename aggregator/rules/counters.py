"""Counter rules on the latest counter batch of each node: error rates per counter family,
transport retries exceeded and ignored congestion notifications.

Pure. Rates come from the agent (agent/counters/rates.py): a counter that saturated or reset has no
rate this round and is reported by `data-quality`, as is a rate that is NaN or negative.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from aggregator.cluster import ClusterView
from aggregator.fleet.state import NodeRecord
from aggregator.rules.catalog import CNP_IGNORED, COUNTER_FAMILIES, RETRY_COUNTERS
from aggregator.rules.counterbase import quiet
from aggregator.rules.finding import Finding
from aggregator.rules.fleetfacts import finite
from aggregator.rules.thresholds import Thresholds
from proto.messages.counters import PortCounters
from proto.policy import Policy

Fleet = Mapping[str, NodeRecord]


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


def check_counter_errors(
    fleet: Fleet, policies: tuple[Policy, ...], cluster: ClusterView, now: float,
    thresholds: Thresholds,
) -> list[Finding]:  # fmt: skip
    limits = thresholds.of("counter-errors").params
    families = [(family, keys, limits.get(family, 0.0)) for family, keys in _FAMILIES]
    isfinite = math.isfinite
    found: list[Finding] = []
    for node, pc in _batches(fleet, COUNTER_ERRORS_KEYS):
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


def check_retries_exceeded(
    fleet: Fleet, policies: tuple[Policy, ...], cluster: ClusterView, now: float,
    thresholds: Thresholds,
) -> list[Finding]:  # fmt: skip
    limit = thresholds.param("retries-exceeded", "rate")
    found: list[Finding] = []
    for node, pc in _batches(fleet, RETRIES_EXCEEDED_KEYS):
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


def check_cc_misconfigured(
    fleet: Fleet, policies: tuple[Policy, ...], cluster: ClusterView, now: float,
    thresholds: Thresholds,
) -> list[Finding]:  # fmt: skip
    limit = thresholds.param("cc-misconfigured", "rate")
    found: list[Finding] = []
    for node, pc in _batches(fleet, _CNP_IGNORED):
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
