"""The `data-quality` rule: input the other rules cannot judge — no snapshot, unreadable
files, unknown port states, absurd values, NaN/negative rates, saturated or reset counters.

Pure in effect. Such input never passes silently as "all clear": it becomes one warning per
node and subject, listing every problem found there. Over a counter delta whose base was
seen, only the delta's keys are read (NodeRecord.counters_delta; the rest is the base's).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from itertools import chain
from operator import attrgetter, itemgetter
from typing import Any, Final, cast

from aggregator.cluster import ClusterView
from aggregator.fleet import NodeRecord
from aggregator.rules.catalog import CNP_IGNORED, COUNTER_FAMILIES, FLAP_COUNTERS, RETRY_COUNTERS
from aggregator.rules.counterbase import base_of
from aggregator.rules.finding import Finding
from aggregator.rules.fleetfacts import ports, subject
from aggregator.rules.nodememo import LIMIT, NodeMemo
from aggregator.rules.thresholds import Thresholds
from aggregator.rules.versions import parse_version
from proto.inventory import NodeSnapshot
from proto.messages import CounterBatch, PortCounters
from proto.policy import Policy

Fleet = Mapping[str, NodeRecord]
MAX_LISTED: Final = 5
# Counters whose rates the rules judge: losing their rate hides a fault.
WATCHED: Final = frozenset(
    {k for keys in COUNTER_FAMILIES.values() for k in keys}
    | set(RETRY_COUNTERS) | set(FLAP_COUNTERS) | {CNP_IGNORED}
)  # fmt: skip


def check_data_quality(
    fleet: Fleet, policies: tuple[Policy, ...], cluster: ClusterView, now: float,
    thresholds: Thresholds,
) -> list[Finding]:  # fmt: skip
    problems: dict[tuple[str, str], list[str]] = {}
    for node in sorted(fleet):
        record = fleet[node]
        if record.snapshot is None:
            problems.setdefault((node, "snapshot"), []).append("no inventory snapshot received yet")
        else:
            snap = record.snapshot
            known = _SNAPSHOT.get(node, snap, None, functools.partial(_of_snapshot, node, snap))
            for key, found_there in known:
                problems.setdefault(key, []).extend(found_there)
        if record.counters is not None:
            _counter_problems(node, record, record.counters, problems)
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
_RATES: Final = attrgetter("rates")
_COUNTERS: Final = attrgetter("counters")
# A node's delta base: (base seq, keys not covered, per port the problems of the others).
# And whether all of those are _NO_PROBLEMS.
Base = tuple[int, frozenset[str], tuple[PortBad, ...], bool]
_BASES: Final[dict[str, Base]] = {}


def _port_bad(pc: PortCounters) -> PortBad:
    isfinite = math.isfinite
    rates: tuple[tuple[str, float], ...] = ()
    if not all(isfinite(rate) and rate >= 0 for rate in pc.rates.values()):
        rates = tuple((k, r) for k, r in sorted(pc.rates.items()) if not isfinite(r) or r < 0)
    negative: tuple[tuple[str, int], ...] = ()
    if pc.counters and min(pc.counters.values()) < 0:
        negative = tuple((k, v) for k, v in sorted(pc.counters.items()) if v < 0)
    return (rates, negative) if rates or negative else _NO_PROBLEMS


def _port_bad_over(pc: PortCounters, known: PortBad, keys: frozenset[str]) -> PortBad:
    """`_port_bad(pc)` from `known` (the problems outside `keys`) and `pc`'s `keys`."""
    rate_keys, counter_keys, _, _ = _split(keys)
    isfinite, rates, counters = math.isfinite, pc.rates, pc.counters
    bad = [(k, r) for k in rate_keys
           if (r := rates.get(k)) is not None and (not isfinite(r) or r < 0)]  # fmt: skip
    negative = [(n, v) for k, n in counter_keys if (v := counters.get(n)) is not None and v < 0]
    if not known[0] and not known[1]:  # the usual case: a base without problems
        return (tuple(bad), tuple(negative)) if bad or negative else _NO_PROBLEMS
    bad.extend((k, r) for k, r in known[0] if k not in keys)
    negative.extend((k, v) for k, v in known[1] if f"counters/{k}" not in keys)
    return tuple(sorted(bad)), tuple(sorted(negative))


Values = Callable[[Mapping[str, Any]], tuple[Any, ...]]
# Sorted keys, the counters' (key, name)s, and a getter of a port's rates and counters of
# them (all of them in C; KeyError when one is missing).
Split = tuple[tuple[str, ...], tuple[tuple[str, str], ...], Values, Values]
_SPLITS: Final[dict[frozenset[str], Split]] = {}


def _values(keys: tuple[str, ...]) -> Values:
    if len(keys) == 1:
        key = keys[0]
        return lambda values: (values[key],)
    return cast(Values, itemgetter(*keys)) if keys else lambda values: ()


def _split(keys: frozenset[str]) -> Split:
    """Delta keys (shared sets: one entry per layout) as `_ports_bad` reads them."""
    found = _SPLITS.get(keys)
    if found is None:
        ordered = tuple(sorted(keys))
        counters = tuple((k, k[9:]) for k in ordered if k.startswith("counters/"))
        found = ordered, counters, _values(ordered), _values(tuple(n for _, n in counters))
        if len(_SPLITS) >= 4096:
            _SPLITS.clear()
        _SPLITS[keys] = found
    return found


def _ports_bad(node: str, record: NodeRecord, batch: CounterBatch) -> tuple[PortBad, ...]:
    """Every port's problems; over a delta, only its keys are read when the base's
    problems are known (the others have the base's values)."""
    merged = base_of(record)
    if merged is None:
        found = tuple(map(_port_bad, batch.ports))
        if record.counters_delta == frozenset() and record.counters_base_seq == batch.seq:
            _remember(node, batch.seq, frozenset(), found)  # a full batch: a delta base
        return found
    seq, delta = merged
    known = _BASES.get(node)
    if known is None or known[0] != seq or len(known[2]) != len(batch.ports):
        found = tuple(map(_port_bad, batch.ports))
        _remember(node, seq, delta, tuple(_outside(bad, delta) for bad in found))
        return found
    keys = known[1] | delta if known[1] else delta
    _, _, rates_of, counters_of = _split(keys)
    if known[3]:
        # Fast path, in C, over all ports at once: every key present, none negative, no
        # rate NaN or infinite (their sum is finite); else `_port_bad_over` sorts it out.
        ports = batch.ports
        try:
            rates = list(chain.from_iterable(map(rates_of, map(_RATES, ports))))
            counters = list(chain.from_iterable(map(counters_of, map(_COUNTERS, ports))))
        except KeyError:
            pass
        else:
            fine = not rates or (min(rates) >= 0 and math.isfinite(sum(rates)))
            if fine and (not counters or min(counters) >= 0):
                return known[2]
    return tuple(
        _port_bad_over(pc, bad, keys) for pc, bad in zip(batch.ports, known[2], strict=True)
    )


def _outside(bad: PortBad, keys: frozenset[str]) -> PortBad:
    rates = tuple((k, r) for k, r in bad[0] if k not in keys)
    negative = tuple((k, v) for k, v in bad[1] if f"counters/{k}" not in keys)
    return (rates, negative) if rates or negative else _NO_PROBLEMS


def _remember(node: str, seq: int, outside: frozenset[str], ports: tuple[PortBad, ...]) -> None:
    if len(_BASES) >= LIMIT and node not in _BASES:
        _BASES.clear()
    _BASES[node] = (seq, outside, ports, all(bad is _NO_PROBLEMS for bad in ports))


def _counter_problems(
    node: str,
    record: NodeRecord,
    batch: CounterBatch,
    problems: dict[tuple[str, str], list[str]],
) -> None:
    if batch.errors:
        problems.setdefault((node, "counters"), []).extend(
            f"{e.path}: {e.error}" for e in batch.errors
        )
    for pc, bad in zip(batch.ports, _ports_bad(node, record, batch), strict=True):
        if bad is _NO_PROBLEMS and not pc.saturated and not pc.resets:
            continue  # almost every port
        bad_rates, negative = bad
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
