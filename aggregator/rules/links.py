"""Link rules: port state, link rate, link layer, netdev MTU and link flaps.

Pure functions of the fleet view. A port whose state is UNKNOWN (unreadable) is left to
`data-quality` rather than called down; rates of ports that are not up are not compared
(mlx5 reports 40 Gb/s for an Ethernet port without link).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Final, cast

from aggregator.fleet.state import NodeRecord
from aggregator.rules.counterbase import quiet
from aggregator.rules.descriptor import COUNTERS, SNAPSHOT, Rule, RuleInput
from aggregator.rules.finding import Finding, Severity
from aggregator.rules.fleetfacts import (
    finite,
    is_active,
    majority_of,
    model_label,
    model_of,
    node_compute_adapters,
    ports,
    snapshots,
    subject,
)
from aggregator.rules.peers import Facts, Peer, PeerRule, Vote
from proto.inventory import Device, NodeSnapshot, Port

# The counters whose increase is a link flap (link-flap fires on their rates).
FLAP_COUNTERS: Final = ("counters/link_downed", "counters/link_error_recovery")


def check_port_down(given: RuleInput) -> list[Finding]:
    found: list[Finding] = []
    for node, snap in snapshots(given.fleet):
        for device, port in ports(snap):
            netdev_down = _netdev_down(device, port) if is_active(port) else None
            if netdev_down is not None:
                found.append(
                    Finding(
                        rule="port-down",
                        severity="critical",
                        node=node,
                        subject=subject(device, port),
                        message=f"{subject(device, port)} has its netdev {netdev_down} down: "
                        "RoCE traffic cannot flow — check the cable, the switch port and "
                        "`ip link` on the node.",
                        evidence={
                            "state": port.state,
                            "phys_state": port.phys_state,
                            "link_layer": port.link_layer,
                            "netdev": netdev_down,
                            "netdev_operstate": "down",
                        },
                    )
                )
                continue
            if port.state == "UNKNOWN" or is_active(port):
                continue
            found.append(
                Finding(
                    rule="port-down",
                    severity="critical",
                    node=node,
                    subject=subject(device, port),
                    message=f"{subject(device, port)} is {port.state} "
                    f"(physical state {port.phys_state or 'unknown'}): check the cable, the "
                    "switch port and, on InfiniBand, the subnet manager.",
                    evidence={
                        "state": port.state,
                        "phys_state": port.phys_state,
                        "link_layer": port.link_layer,
                        "netdevs": ",".join(device.netdevs) or None,
                    },
                )
            )
    return found


def _netdev_down(device: Device, port: Port) -> str | None:
    """The RoCE netdev of `port` when it is down: the RDMA port state in sysfs may lag
    the netdev (netlink tells first), and without it RoCE carries nothing."""
    if port.link_layer != "Ethernet":
        return None
    for interface in device.interfaces:
        if interface.port in (port.port, None) and interface.operstate == "down":
            return interface.name
    return None


def _active_rates(peer: Peer) -> Iterator[tuple[Device, Port, float]]:
    snap = peer.record.snapshot
    for device, port in ports(snap) if snap is not None else ():
        rate = port.rate_gbps
        if is_active(port) and rate is not None and finite(rate):
            yield device, port, rate


def _rate_tally(peer: Peer) -> Iterator[Vote]:
    for device, _, rate in _active_rates(peer):
        yield model_of(device), rate


def _rate_settle(counts: Mapping[Hashable, int]) -> Hashable:
    # The fleet's mode per model; a tie goes to the highest rate (the others are "below").
    top = max(counts.values())
    return max(cast(float, rate) for rate, n in counts.items() if n == top)


def _rate_judge(peer: Peer, votes: Sequence[Vote], modes: Facts) -> list[Finding]:
    minimum = peer.expect.min_rate_gbps
    found: list[Finding] = []
    for device, port, rate in _active_rates(peer):
        mode = cast(float | None, modes.get(model_of(device)))
        below_min = minimum is not None and rate < minimum
        below_mode = mode is not None and rate < mode
        if not (below_min or below_mode):
            continue
        why = f"policy minimum {minimum:g}" if below_min else (
            f"the fleet's usual {mode:g} Gb/s for {model_label(device)}"
        )  # fmt: skip
        found.append(
            Finding(
                rule="rate-mismatch",
                severity="warning",
                node=peer.name,
                subject=subject(device, port),
                message=f"{subject(device, port)} runs at {rate:g} Gb/s, below {why}; "
                "check the cable/transceiver and the switch port speed.",
                evidence={
                    "rate_gbps": rate,
                    "min_rate_gbps": minimum,
                    "fleet_mode_gbps": mode,
                    "model": model_of(device),
                },
            )
        )
    return found


RATE_MISMATCH: Final = PeerRule("rate-mismatch", _rate_tally, _rate_settle, _rate_judge)


def rate_unjudged(
    record: NodeRecord | None, subject_: str, evidence: Mapping[str, str]
) -> str | None:
    """Why rate-mismatch can no longer judge the port its alert named, or None when it can:
    only an ACTIVE port has a rate to compare, so a port gone down (or gone) is unknown."""
    place = _place(record, subject_)
    if isinstance(place, str):
        return place
    _, port = place
    if port is None:
        return f"{subject_} is no longer in the node's inventory"
    if not is_active(port):
        return (f"{subject_} is {port.state}/{port.phys_state or '?'}: a port that is not "
                "ACTIVE has no rate to compare")  # fmt: skip
    return None


def _place(record: NodeRecord | None, subject_: str) -> tuple[Device, Port | None] | str:
    """The adapter and port `adapter/port` names in the record's snapshot, or why not."""
    snap = record.snapshot if record is not None else None
    if snap is None:
        return "no inventory snapshot of the node"
    name, _, number = subject_.rpartition("/")
    device = next((d for d in snap.devices if d.name == name), None)
    if device is None:
        return f"{name} is no longer in the node's inventory"
    port = next((p for p in device.ports if str(p.port) == number), None)
    return device, port


def _layer_tally(peer: Peer) -> Iterator[Vote]:
    snap = peer.record.snapshot
    for device, port in ports(snap) if snap is not None else ():
        if port.link_layer != "Unknown":
            yield model_of(device), port.link_layer


def _layer_settle(counts: Mapping[Hashable, int]) -> Hashable:
    return majority_of(counts), frozenset(counts)  # (usual layer, layers seen)


def _layer_judge(peer: Peer, votes: Sequence[Vote], facts: Facts) -> list[Finding]:
    snap = peer.record.snapshot
    if snap is None:
        return []
    wanted = peer.expect.link_layer
    has_wanted = any(p.link_layer == wanted for _, p in ports(snap))
    found: list[Finding] = []
    for device, port in ports(snap):
        if port.link_layer == "Unknown":
            continue
        usual, seen = cast(tuple[str | None, frozenset[str]], facts[model_of(device)])
        if wanted is not None:
            # Only adapters that can run the wanted layer (the same model does so
            # elsewhere), unless the node has no port on that layer at all.
            if port.link_layer == wanted or (wanted not in seen and has_wanted):
                continue
            reference: str = wanted
            severity: Severity = "critical"
            source = "the policy's linkLayer"
        else:
            if usual is None or usual == port.link_layer:
                continue
            reference, severity = usual, "warning"
            source = f"the rest of the fleet's {model_label(device)} adapters"
        found.append(
            Finding(
                rule="link-layer-mismatch",
                severity=severity,
                node=peer.name,
                subject=subject(device, port),
                message=f"{subject(device, port)} runs {port.link_layer} but {source} "
                f"use {reference}; set the port type with mlxconfig "
                "(LINK_TYPE_P<n>) and reset the adapter.",
                evidence={
                    "link_layer": port.link_layer,
                    "expected": reference,
                    "model": model_of(device),
                },
            )
        )
    return found


LINK_LAYER_MISMATCH: Final = PeerRule(
    "link-layer-mismatch", _layer_tally, _layer_settle, _layer_judge
)


def _mtu_places(snap: NodeSnapshot) -> Iterator[tuple[Device, int, str, str, int]]:
    """Every netdev with an MTU: (adapter, port, the port's link layer, netdev, MTU)."""
    for device in snap.devices:
        layers = {p.port: p.link_layer for p in device.ports}
        for iface in device.interfaces:
            if iface.mtu is None or iface.mtu <= 0:
                continue
            port = iface.port or 1
            yield device, port, layers.get(port, "Unknown"), iface.name, iface.mtu


def _mtu_tally(peer: Peer) -> Iterator[Vote]:
    """Fabric = link layer x role (compute adapter or not), fleet-wide."""
    snap = peer.record.snapshot
    if snap is None:
        return
    compute = {d.name for d in node_compute_adapters(peer.name, snap, peer.expect)}
    for device, _, layer, _, mtu in _mtu_places(snap):
        yield (layer, device.name in compute), mtu


def _mtu_settle(counts: Mapping[Hashable, int]) -> Hashable:
    return majority_of(counts), sum(counts.values()) > 1  # (usual MTU, several ports)


def _mtu_judge(peer: Peer, votes: Sequence[Vote], facts: Facts) -> list[Finding]:
    snap = peer.record.snapshot
    if snap is None:
        return []
    expected = peer.expect.mtu
    found: list[Finding] = []
    places = zip(_mtu_places(snap), votes, strict=True)
    for (device, port, _, netdev, mtu), (fabric, _) in places:
        layer, is_compute = cast(tuple[str, bool], fabric)
        usual, several = cast(tuple[int | None, bool], facts[fabric])
        wanted = expected if is_compute else None
        if wanted is not None and mtu != wanted:
            why = f"the policy's {wanted}"
        elif wanted is None and several and usual != mtu:
            why = f"the {usual} used across its {layer} fabric"
            if usual is None:
                why = f"the rest of its {layer} fabric, which has no majority MTU"
        else:
            continue
        where = f"{device.name}/{port}"
        found.append(
            Finding(
                rule="mtu-mismatch",
                severity="warning",
                node=peer.name,
                subject=where,
                message=f"{netdev} ({where}) has MTU {mtu}, unlike {why}; set the same "
                "MTU on every port of the fabric (and on its switch ports).",
                evidence={
                    "netdev": netdev,
                    "mtu": mtu,
                    "expected_mtu": wanted,
                    "fabric_mtu": usual,
                    "link_layer": layer,
                },
            )
        )
    return found


MTU_MISMATCH: Final = PeerRule("mtu-mismatch", _mtu_tally, _mtu_settle, _mtu_judge)


def mtu_unjudged(
    record: NodeRecord | None, subject_: str, evidence: Mapping[str, str]
) -> str | None:
    """Why mtu-mismatch can no longer judge the netdev its alert named: the adapter or the
    netdev went away (an MTU is judged whatever the port state), else None."""
    place = _place(record, subject_)
    if isinstance(place, str):
        return place
    device, _ = place
    netdev = evidence.get("netdev")
    if netdev is not None and all(i.name != netdev for i in device.interfaces):
        return f"{netdev} ({subject_}) is no longer a netdev of {device.name}"
    return None


# The counter/rate keys link-flap reads of a port (the rates and, as evidence, the counters).
LINK_FLAP_KEYS: Final = frozenset(FLAP_COUNTERS)


def check_link_flap(given: RuleInput) -> list[Finding]:
    found: list[Finding] = []
    for node in sorted(given.fleet):
        record = given.fleet[node]
        if quiet(record, LINK_FLAP_KEYS):  # fires only on a flap counter's rate > 0
            continue
        batch = record.counters
        if batch is None:
            continue
        for pc in batch.ports:
            moving = {
                key: rate for key in FLAP_COUNTERS
                if finite(rate := pc.rates.get(key)) and (rate or 0.0) > 0
            }  # fmt: skip
            if not moving:
                continue
            where = f"{pc.device}/{pc.port}"
            found.append(
                Finding(
                    rule="link-flap",
                    severity="warning",
                    node=node,
                    subject=where,
                    message=f"{where} is flapping ({', '.join(sorted(moving))} increasing): "
                    "replace or reseat the cable/transceiver and check the switch port.",
                    evidence={
                        **{f"{k}_per_s": v for k, v in moving.items()},
                        "link_downed": pc.counters.get("link_downed"),
                        "link_error_recovery": pc.counters.get("link_error_recovery"),
                    },
                )
            )
    return found


RULES: Final[tuple[Rule, ...]] = (
    Rule(id="port-down", family="links", severity="critical",
         check=check_port_down, reads=SNAPSHOT),
    Rule.of_peers(RATE_MISMATCH, family="links", severity="warning", reads=SNAPSHOT,
                  for_s=30.0),
    # Critical against the policy's linkLayer, a warning against the fleet's majority.
    Rule.of_peers(LINK_LAYER_MISMATCH, family="links", severity="critical", reads=SNAPSHOT),
    Rule.of_peers(MTU_MISMATCH, family="links", severity="warning", reads=SNAPSHOT,
                  for_s=30.0),
    Rule(id="link-flap", family="links", severity="warning", check=check_link_flap,
         reads=COUNTERS, counter_keys=LINK_FLAP_KEYS, resolve_s=300.0),
)  # fmt: skip
