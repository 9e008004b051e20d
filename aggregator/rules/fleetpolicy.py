"""Fleet and policy rules: silent agents, resources advertised as zero, selectors that match
nothing, nodes selected by several policies, and rails that differ between peers.

Pure. "Adapter i" of a node is its i-th compute adapter by PCI address (fleetfacts); its
subnet is the GID prefix on InfiniBand and the IPv4 /24 of its RoCE GIDs on Ethernet.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections import Counter
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Final, cast

from aggregator.cluster import policies_by_node
from aggregator.fleet.servable import Unusable, unusable
from aggregator.fleet.state import NodeRecord
from aggregator.rules.descriptor import SNAPSHOT, Rule, RuleInput
from aggregator.rules.finding import Evidence, Finding
from aggregator.rules.fleetfacts import is_active, majority_of, node_compute_adapters
from aggregator.rules.peers import Facts, Peer, PeerRule, Vote
from aggregator.rules.selection import matching_adapters
from aggregator.rules.settings import Thresholds
from proto.dpconfig import resource_full_name
from proto.inventory import Device
from proto.policy import Policy


def check_agent_stale(given: RuleInput) -> list[Finding]:
    """Silence counts from the last receive time, or from when this process could first
    have heard the node (`heard_since`) when that is later: a record loaded from KV carries
    an earlier process's receive time, and a restart is not the agent's silence."""
    limit = given.thresholds.param("agent-stale", "staleAfter")
    heard_since = given.heard_since
    found: list[Finding] = []
    for node in sorted(given.fleet):
        last_seen = given.fleet[node].last_seen
        heard = heard_since.get(node)
        silent_since = last_seen if heard is None else max(last_seen, heard)
        age = given.now - silent_since
        if age <= limit:
            continue
        evidence: Evidence = {"last_seen": last_seen, "age_s": round(age, 3)}
        if silent_since > last_seen:
            evidence["heard_since"] = silent_since  # why age_s is less than now - last_seen
        found.append(
            Finding(
                rule="agent-stale",
                severity="critical",
                node=node,
                subject="agent",
                message=f"No message from the agent on {node} for {age:.0f}s (limit "
                f"{limit:g}s): check the nicfleet-agent pod and its NATS connection; its "
                "data here is out of date.",
                evidence=evidence,
            )
        )
    return found


def agent_stale_from(record: NodeRecord, thresholds: Thresholds) -> float:
    """When agent-stale may start reporting `record`: never at an earlier `now`. A lower
    bound: `heard_since` (not in the record) only moves it later, and the engine re-runs
    the rule for a due node on every evaluation, where the check applies it."""
    return record.last_seen + thresholds.param("agent-stale", "staleAfter")


_WHY: Final[Mapping[Unusable, str]] = {
    "not-served": "is not served",
    "advertises-0": "advertises 0 devices",
    "no-healthy": "has no healthy device",
}


def check_resource_zero(given: RuleInput) -> list[Finding]:
    by_node = policies_by_node(given.policies, given.fleet, given.cluster)
    found: list[Finding] = []
    for node in sorted(given.fleet):
        status = given.fleet[node].device_plugin
        if status is None:
            continue  # nothing reported yet (offline check): no verdict either way
        advertised = {r.name: r for r in status.resources}
        wanted = {
            resource_full_name(r)
            for p in by_node.get(node, ())
            if p.spec.rdma_shared_device_plugin is not None
            for r in p.spec.rdma_shared_device_plugin.config_list
        }
        for name in sorted(wanted | set(advertised)):
            r = advertised.get(name)
            # One definition with `nicfleetctl resources` ZERO/UNHEALTHY (fleet.servable);
            # an invalid entry is resource-config-invalid's (rules/pluginconfig).
            reason = unusable(status, name)
            if reason is None:
                continue
            why = _WHY[reason]
            reasons = {} if r is None else {**r.unmatched, **r.excluded, **r.unhealthy}
            found.append(
                Finding(
                    rule="resource-zero",
                    severity="critical",
                    node=node,
                    subject=name,
                    message=f"{name} {why} on {node}, so pods requesting it cannot be "
                    "scheduled there; see the evidence for which adapter failed which check "
                    "(nicfleetctl trace).",
                    evidence={
                        "advertised": None if r is None else r.advertised,
                        "healthy": None if r is None else r.healthy,
                        "registration": None if r is None else r.registration,
                        **{f"adapter:{k}": v for k, v in sorted(reasons.items())[:8]},
                    },
                )
            )
    return found


def _selector_tally(peer: Peer) -> Iterator[Vote]:
    """A vote (policy index, resource index) -> matched per resource of every policy
    selecting the node, when the node can be judged (status, else its snapshot)."""
    record = peer.record
    status = record.device_plugin
    for pi, policy in enumerate(peer.policies):
        config = policy.spec.rdma_shared_device_plugin
        if config is None or not any(p is policy for p in peer.selecting):
            continue
        for ri, resource in enumerate(config.config_list):
            name = resource_full_name(resource)
            served = next((r for r in status.resources if r.name == name), None) if (
                status is not None) else None  # fmt: skip
            if served is not None:
                yield (pi, ri), bool(served.devices)
            elif record.snapshot is not None:
                yield (pi, ri), bool(matching_adapters(resource, record.snapshot))


def _selector_settle(counts: Mapping[Hashable, int]) -> Hashable:
    return sum(counts.values()), counts.get(True, 0) > 0  # (nodes judged, any matched)


def _selector_conclude(policies: tuple[Policy, ...], facts: Facts) -> list[Finding]:
    found: list[Finding] = []
    for pi, policy in sorted(enumerate(policies), key=lambda ip: ip[1].metadata.name):
        config = policy.spec.rdma_shared_device_plugin
        if config is None:
            continue
        for ri, resource in enumerate(config.config_list):
            judged, matched = cast(tuple[int, bool], facts.get((pi, ri), (0, False)))
            if matched or judged == 0:
                continue
            name = resource_full_name(resource)
            found.append(
                Finding(
                    rule="selector-matches-nothing",
                    severity="warning",
                    node=None,
                    subject=f"{policy.metadata.name}/{name}",
                    message=f"Policy {policy.metadata.name}'s resource {name} selects no "
                    f"adapter on any of its {judged} nodes; fix its selectors (vendors, "
                    "deviceIDs, ifNames, linkTypes...) to match the hardware.",
                    evidence={"policy": policy.metadata.name, "nodes_checked": judged},
                )
            )
    return found


SELECTOR_MATCHES_NOTHING: Final = PeerRule(
    "selector-matches-nothing", _selector_tally, _selector_settle, conclude=_selector_conclude
)


def check_policy_conflict(given: RuleInput) -> list[Finding]:
    found: list[Finding] = []
    by_node = policies_by_node(given.policies, given.fleet, given.cluster)
    for node, selecting in sorted(by_node.items()):
        if len(selecting) < 2 or node not in given.fleet:
            continue
        names = sorted(p.metadata.name for p in selecting)
        found.append(
            Finding(
                rule="policy-conflict",
                severity="warning",
                node=node,
                subject="policy",
                message=f"{node} is selected by {len(names)} policies ({', '.join(names)}); "
                f"only {names[0]} applies — narrow their nodeSelectors so one policy "
                "selects each node.",
                evidence={"policies": ",".join(names), "applied": names[0]},
            )
        )
    return found


def _subnet(device: Device) -> str | None:
    for port in device.ports:
        infiniband = port.link_layer == "InfiniBand"
        for gid in port.gids:
            found = _gid_subnet(gid.gid, infiniband)
            if found is not None:
                return found
    return None


# How sysfs writes a GID: eight groups of four hex digits (parsed without `ipaddress`).
_SYSFS_GID: Final = re.compile(r"[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){7}")


def _gid_subnet(gid: str, infiniband: bool) -> str | None:
    """The subnet a GID names (IPv4-mapped: its /24; InfiniBand: the GID prefix), or None
    when it names none (not an address, or a link-local RoCE GID)."""
    if not _SYSFS_GID.fullmatch(gid):
        return _parsed_gid_subnet(gid, infiniband)
    groups = gid.split(":")
    if groups[5].lower() == "ffff" and groups[:5] == _ZEROS:  # ::ffff:a.b.c.d
        high, low = int(groups[6], 16), int(groups[7], 16)
        return f"{high >> 8}.{high & 0xFF}.{low >> 8}.0/24"
    return ":".join(groups[:4]) if infiniband else None


_ZEROS: Final = ["0000"] * 5


@functools.lru_cache(maxsize=4096)
def _parsed_gid_subnet(gid: str, infiniband: bool) -> str | None:
    """`_gid_subnet` of any other spelling, through `ipaddress` (slow, so cached)."""
    try:
        address = ipaddress.IPv6Address(gid)
    except ValueError:
        return None
    if address.ipv4_mapped is not None:
        return str(ipaddress.IPv4Network(f"{address.ipv4_mapped}/24", strict=False))
    if infiniband:
        return ":".join(gid.split(":")[:4])
    return None


RAIL_KEYS: Final = ("subnet", "rate_gbps", "link_layer")
Rail = tuple[str | None, float | None, str | None]  # RAIL_KEYS of one adapter


def _rail(device: Device) -> Rail:
    port = device.ports[0] if device.ports else None
    return (
        _subnet(device),
        port.rate_gbps if port is not None and is_active(port) else None,
        port.link_layer if port is not None else None,
    )


def _rails(peer: Peer) -> Iterator[tuple[int, Device]]:
    snap = peer.record.snapshot
    if snap is not None:
        yield from enumerate(node_compute_adapters(peer.name, snap, peer.expect))


def _rail_group(peer: Peer, i: int, rail: Rail) -> Hashable:
    """Rail i of the nodes of one pool: the same applying policy and compute link layer
    (an InfiniBand node and a RoCE node have no rail in common)."""
    policy = min((p.metadata.name for p in peer.selecting), default=None)
    return ("rail", policy, rail[2], i)


def _rail_tally(peer: Peer) -> Iterator[Vote]:
    for i, device in _rails(peer):
        rail = _rail(device)
        yield _rail_group(peer, i, rail), rail


@dataclass(frozen=True, slots=True)
class RailFact:
    """Rail i of a pool: at least two members, and the majority of each RAIL_KEYS value
    among those known (None: unknown, or no majority) — what `judge` reads and equality
    sees. `seen` (per key, its known values with counts, most first) rides along for the
    pool's fleet-wide finding: counts moving must not re-judge every member."""

    several: bool
    usuals: tuple[object, ...]
    seen: tuple[tuple[tuple[object, int], ...], ...] = field(compare=False, default=())


def _rail_settle(counts: Mapping[Hashable, int]) -> Hashable:
    usuals, seen = [], []
    for k in range(len(RAIL_KEYS)):
        known: Counter[object] = Counter()
        for rail, n in counts.items():
            value = cast(Rail, rail)[k]
            if value is not None:
                known[value] += n
        usuals.append(majority_of(known))
        seen.append(tuple(sorted(known.items(), key=lambda vn: (-vn[1], str(vn[0])))))
    return RailFact(sum(counts.values()) >= 2, tuple(usuals), tuple(seen))


def _rail_judge(peer: Peer, votes: Sequence[Vote], facts: Facts) -> list[Finding]:
    """An adapter off its rail's majority; a value without a majority is no one's fault
    (the pool's fleet-wide finding, `_rail_conclude`, says so once)."""
    found: list[Finding] = []
    for (i, device), (group, rail) in zip(_rails(peer), votes, strict=True):
        fact = cast(RailFact, facts[group])
        if not fact.several:
            continue
        values = cast(Rail, rail)
        differs: dict[str, object] = {
            key: usual
            for key, value, usual in zip(RAIL_KEYS, values, fact.usuals, strict=True)
            if value is not None and usual is not None and value != usual
        }
        if not differs:
            continue
        attrs = dict(zip(RAIL_KEYS, values, strict=True))
        what = ", ".join(f"{k} {attrs[k]} (peers: {v})" for k, v in differs.items())
        found.append(
            Finding(
                rule="rail-mismatch",
                severity="warning",
                node=peer.name,
                subject=device.name,
                message=f"{device.name}, adapter {i} of {peer.name}, differs from adapter {i} "
                f"of its peers in {what}; recable or readdress it so rail {i} is one "
                "subnet at one speed.",
                evidence={
                    "rail": i,
                    **{k: v for k, v in attrs.items() if isinstance(v, str | float | int)},
                    **{
                        f"peers_{k}": v
                        for k, v in differs.items()
                        if isinstance(v, str | float | int)
                    },
                },
            )
        )
    return found


_RAILS_SHOWN: Final = 4


def _rail_conclude(policies: tuple[Policy, ...], facts: Facts) -> list[Finding]:
    """One fleet-wide finding per pool (policy, link layer) whose rails hold values with
    no majority: nobody is the odd one out, so no node is blamed."""
    pools: dict[tuple[str | None, str | None], list[tuple[int, str]]] = {}
    for group, fact in facts.items():
        rail = cast(RailFact, fact)
        if not rail.several:
            continue
        _, policy, layer, i = cast(tuple[str, str | None, str | None, int], group)
        split = [
            f"{key} " + ", ".join(f"{v} on {n} node{'' if n == 1 else 's'}" for v, n in seen)
            for key, usual, seen in zip(RAIL_KEYS, rail.usuals, rail.seen, strict=True)
            if usual is None and len(seen) > 1
        ]
        if split:
            pools.setdefault((policy, layer), []).append((i, "; ".join(split)))
    found: list[Finding] = []
    for (policy, layer), rails in sorted(
        pools.items(), key=lambda kv: (kv[0][0] or "", str(kv[0][1]))
    ):
        rails.sort()
        shown = "; ".join(f"rail {i}: {split}" for i, split in rails[:_RAILS_SHOWN])
        if len(rails) > _RAILS_SHOWN:
            shown += f"; and {len(rails) - _RAILS_SHOWN} more rails"
        pool = f"policy {policy}" if policy else "nodes without a policy"
        found.append(
            Finding(
                rule="rail-mismatch",
                severity="warning",
                node=None,
                subject=f"pool/{policy or '-'}/{layer}",
                message=f"The {layer} rails of {pool} differ with no majority ({shown}), "
                "so no adapter is the odd one out: if these are different machine "
                "types, select each type with its own NicFleetPolicy (rails are compared "
                "per policy); else recable or readdress to one plan.",
                evidence={
                    "policy": policy,
                    "link_layer": layer,
                    "rails": ",".join(str(i) for i, _ in rails),
                },
            )
        )
    return found


RAIL_MISMATCH: Final = PeerRule(
    "rail-mismatch", _rail_tally, _rail_settle, _rail_judge, _rail_conclude
)


def rail_unjudged(
    record: NodeRecord | None, subject: str, evidence: Mapping[str, str]
) -> str | None:
    """Why rail-mismatch can no longer judge the adapter its alert named (`evidence`: the
    alert's, `peers_<key>` for each value that differed), or None when it can: a port
    gone down has no rate to compare, an adapter gone has no rail at all."""
    snap = record.snapshot if record is not None else None
    if snap is None:
        return "no inventory snapshot of the node"
    device = next((d for d in snap.devices if d.name == subject), None)
    if device is None:
        return f"{subject} is no longer in the node's inventory"
    values = dict(zip(RAIL_KEYS, _rail(device), strict=True))
    lost = [k for k in RAIL_KEYS if f"peers_{k}" in evidence and values[k] is None]
    if not lost:
        return None
    port = device.ports[0] if device.ports else None
    state = "no port" if port is None else (
        f"port {port.port} {port.state}/{port.phys_state or '?'}")  # fmt: skip
    return f"{subject} has {state}: its {', '.join(lost)} cannot be compared with its rail's"


RULES: Final[tuple[Rule, ...]] = (
    Rule(id="agent-stale", family="fleet", severity="critical", check=check_agent_stale,
         reads=frozenset({"last_seen"}), due=agent_stale_from,
         params=MappingProxyType({"staleAfter": 30.0})),
    Rule(id="resource-zero", family="fleet", severity="critical", check=check_resource_zero,
         reads=frozenset({"device_plugin"}), for_s=10.0),
    # Judged from the agent's device-plugin status, else from the snapshot.
    Rule.of_peers(SELECTOR_MATCHES_NOTHING, family="fleet", severity="warning",
                  reads=frozenset({"snapshot", "device_plugin"})),
    # Reads only whether the node is in the fleet (and its policies).
    Rule(id="policy-conflict", family="fleet", severity="warning",
         check=check_policy_conflict, reads=frozenset()),
    # resolveAfter: as the skew rules' (versions.SKEW_RESOLVE_S), a vote in transit.
    replace(Rule.of_peers(RAIL_MISMATCH, family="fleet", severity="warning", reads=SNAPSHOT),
            resolve_s=60.0),
)  # fmt: skip
