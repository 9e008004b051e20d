"""The `data-quality` rule: input the other rules cannot judge — unreadable files, unknown
port states, absurd values, NaN/negative rates, saturated or reset counters; and
`snapshot-missing`: a node heard from that never sent its inventory (only after a grace:
a first contact often starts with a status or counter batch).

Pure in effect. Such input never passes silently as "all clear": it becomes one warning per
node and subject, listing every problem found there. A counter batch the fleet found clean
at ingest (aggregator.fleet.heldcounters: C-level scans of the delta, the base's verdict) is not
read: a held delta is merged only when it may have something to list.
"""

from __future__ import annotations

import functools
import math
from types import MappingProxyType
from typing import Final

from aggregator.fleet.state import NodeRecord
from aggregator.rules.counters import CNP_IGNORED, COUNTER_FAMILIES, RETRY_COUNTERS
from aggregator.rules.descriptor import COUNTERS, SNAPSHOT, Rule, RuleInput
from aggregator.rules.finding import Finding
from aggregator.rules.fleetfacts import ports, subject
from aggregator.rules.links import FLAP_COUNTERS
from aggregator.rules.nodememo import NodeMemo
from aggregator.rules.settings import Thresholds
from aggregator.rules.versions import parse_version
from proto.inventory import NodeSnapshot
from proto.messages.counters import CounterBatch, PortCounters

MAX_LISTED: Final = 5
# Counters whose rates the rules judge: losing their rate hides a fault.
WATCHED: Final = frozenset(
    {k for keys in COUNTER_FAMILIES.values() for k in keys}
    | set(RETRY_COUNTERS) | set(FLAP_COUNTERS) | {CNP_IGNORED}
)  # fmt: skip


def check_data_quality(given: RuleInput) -> list[Finding]:
    problems: dict[tuple[str, str], list[str]] = {}
    for node in sorted(given.fleet):
        record = given.fleet[node]
        # No snapshot yet is not bad data: it is state this process has not observed (a
        # status or counter batch often arrives first). snapshot-missing reports it late.
        snap = record.snapshot
        if snap is not None:
            known = _SNAPSHOT.get(node, snap, None, functools.partial(_of_snapshot, node, snap))
            for key, found_there in known:
                problems.setdefault(key, []).extend(found_there)
        held = record.counters_held
        if held is not None and not held.clean:  # clean: decided at ingest, nothing to list
            _counter_problems(node, held.batch, problems)
    found: list[Finding] = []
    for (node, where), listed in sorted(problems.items()):
        shown = "; ".join(listed[:MAX_LISTED]) + (
            f"; and {len(listed) - MAX_LISTED} more" if len(listed) > MAX_LISTED else ""
        )
        found.append(
            Finding(
                rule="data-quality",
                severity="warning",
                node=node,
                subject=where,
                message=f"The data for {where} on {node} cannot be fully judged ({shown}); "
                "fix the agent's access to these files or values — findings may be missing.",
                evidence={"problems": len(listed), "first": listed[0]},
            )
        )
    return found


# A node's snapshot problems, kept while its snapshot is the same object: a counter batch
# (every second per node) re-runs this rule for the node without re-reading the snapshot.
_SNAPSHOT: Final[NodeMemo[tuple[tuple[tuple[str, str], tuple[str, ...]], ...]]] = NodeMemo()


def _of_snapshot(
    node: str, snap: NodeSnapshot
) -> tuple[tuple[tuple[str, str], tuple[str, ...]], ...]:
    problems: dict[tuple[str, str], list[str]] = {}
    _snapshot_problems(node, snap, problems)
    return tuple((key, tuple(listed)) for key, listed in problems.items())


def _snapshot_problems(
    node: str, snap: NodeSnapshot, problems: dict[tuple[str, str], list[str]]
) -> None:
    # Lists are created only for subjects with a problem: this runs for every node and
    # port of the fleet, almost all of them fine.
    host: list[str] = []
    if not math.isfinite(snap.collected_at):
        host.append(f"collected_at is {snap.collected_at}")
    host.extend(f"{e.path}: {e.error}" for e in snap.errors)
    if snap.devices and snap.gpus:
        topo_gpus = {r.gpu for r in snap.gpu_nic_topology}
        host.extend(
            f"no GPU<->NIC topology for GPU {g.pci_address}"
            for g in snap.gpus
            if g.pci_address not in topo_gpus
        )
    if host:
        problems.setdefault((node, "snapshot"), []).extend(host)
    for device in snap.devices:
        own = [f"{e.path}: {e.error}" for e in device.errors]
        if device.fw_ver is not None and parse_version(device.fw_ver) is None:
            own.append(f"firmware version {device.fw_ver!r} is not dotted numbers")
        own.extend(
            f"{iface.name} MTU {iface.mtu}"
            for iface in device.interfaces
            if iface.mtu is not None and iface.mtu <= 0
        )
        if own:
            problems.setdefault((node, device.name), []).extend(own)
    for device, port in ports(snap):
        where: list[str] = []
        if port.state == "UNKNOWN":
            where.append("port state unknown")
        rate = port.rate_gbps
        if rate is not None and (not math.isfinite(rate) or rate < 0):
            where.append(f"rate_gbps {rate}")
        for group, values in (("counters", port.counters), ("hw_counters", port.hw_counters)):
            if values and min(values.values()) < 0:
                where.extend(
                    f"{group}/{k} is negative ({v})" for k, v in sorted(values.items()) if v < 0
                )
        if where:
            problems.setdefault((node, subject(device, port)), []).extend(where)


# Per port of a counter batch: its bad rates and negative counters, each sorted by key.
PortBad = tuple[tuple[tuple[str, float], ...], tuple[tuple[str, int], ...]]
_NO_PROBLEMS: Final[PortBad] = ((), ())  # the one object for a port without problems


def _port_bad(pc: PortCounters) -> PortBad:
    isfinite = math.isfinite
    rates: tuple[tuple[str, float], ...] = ()
    if not all(isfinite(rate) and rate >= 0 for rate in pc.rates.values()):
        rates = tuple((k, r) for k, r in sorted(pc.rates.items()) if not isfinite(r) or r < 0)
    negative: tuple[tuple[str, int], ...] = ()
    if pc.counters and min(pc.counters.values()) < 0:
        negative = tuple((k, v) for k, v in sorted(pc.counters.items()) if v < 0)
    return (rates, negative) if rates or negative else _NO_PROBLEMS


def _counter_problems(
    node: str, batch: CounterBatch, problems: dict[tuple[str, str], list[str]]
) -> None:
    if batch.errors:
        problems.setdefault((node, "counters"), []).extend(
            f"{e.path}: {e.error}" for e in batch.errors
        )
    for pc in batch.ports:
        bad_rates, negative = _port_bad(pc)
        if not bad_rates and not negative and not pc.saturated and not pc.resets:
            continue
        listed = [f"rate of {key} is {rate}" for key, rate in bad_rates]
        if pc.saturated:
            listed.extend(f"{k} saturated (clear it: perfquery -x -R)" for k in pc.saturated
                          if k in WATCHED)  # fmt: skip
        if pc.resets:
            listed.extend(f"{k} went backwards (reset), no rate this round" for k in pc.resets
                          if k in WATCHED)  # fmt: skip
        listed.extend(f"counters/{k} is negative ({v})" for k, v in negative)
        if listed:
            problems.setdefault((node, f"{pc.device}/{pc.port}"), []).extend(listed)


def check_snapshot_missing(given: RuleInput) -> list[Finding]:
    """A node heard from (status, counters, events) but without an inventory snapshot
    `missingAfter` seconds after this process first heard it: the agent publishes one at
    start and on every resync request, so by then its snapshots are being lost."""
    limit = given.thresholds.param("snapshot-missing", "missingAfter")
    found: list[Finding] = []
    for node in sorted(given.fleet):
        record = given.fleet[node]
        age = given.now - record.first_seen
        if record.snapshot is not None or age <= limit:
            continue
        found.append(
            Finding(
                rule="snapshot-missing",
                severity="warning",
                node=node,
                subject="snapshot",
                message=f"{node} has sent messages for {age:.0f}s but no inventory snapshot "
                f"(limit {limit:g}s), so none of its adapters can be judged; read the "
                "agent's log for snapshot publish errors (a snapshot above the NATS "
                "max_payload, a permission error on its subject).",
                evidence={"first_seen": record.first_seen, "age_s": round(age, 3)},
            )
        )
    return found


def snapshot_missing_from(record: NodeRecord, thresholds: Thresholds) -> float:
    """When snapshot-missing may report `record`: never once it has a snapshot."""
    if record.snapshot is not None:
        return math.inf
    return record.first_seen + thresholds.param("snapshot-missing", "missingAfter")


RULES: Final[tuple[Rule, ...]] = (
    Rule(id="data-quality", family="data", severity="warning", check=check_data_quality,
         reads=SNAPSHOT | COUNTERS),
    Rule(id="snapshot-missing", family="data", severity="warning",
         check=check_snapshot_missing, reads=frozenset({"snapshot", "first_seen"}),
         due=snapshot_missing_from, params=MappingProxyType({"missingAfter": 30.0})),
)  # fmt: skip
