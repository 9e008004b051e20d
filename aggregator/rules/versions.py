"""Version rules: firmware skew against the same model in the node or the fleet, firmware
below the policy's minimum, and kernel module (driver) versions differing across the fleet.

Pure. Versions compare numerically by dotted parts ("28.41.1000" > "28.9.2000").
"""

from __future__ import annotations

import functools
import re
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Final, cast

from aggregator.rules.descriptor import SNAPSHOT, Rule, RuleInput
from aggregator.rules.finding import Finding
from aggregator.rules.fleetfacts import (
    MODEL_NAMES,
    expectations,
    majority,
    majority_of,
    model_label,
    model_of,
    snapshots,
)
from aggregator.rules.peers import Facts, Peer, PeerRule, Vote
from proto.inventory import Device

# The modules of the RDMA path whose versions must agree across the fleet.
DRIVER_MODULES: Final = (
    "mlx5_core", "mlx5_ib", "ib_core", "ib_uverbs", "nvidia", "nvidia_peermem", "nv_peer_mem",
)  # fmt: skip
_VERSION: Final = re.compile(r"^\d+(\.\d+)*\Z")


@functools.lru_cache(maxsize=4096)  # a fleet runs a few versions on many adapters
def parse_version(text: str | None) -> tuple[int, ...] | None:
    """(28, 41, 1000) from "28.41.1000"; None when not purely dotted numbers."""
    if text is None or not _VERSION.fullmatch(text.strip()):
        return None
    return tuple(int(part) for part in text.strip().split("."))


def _fw_tally(peer: Peer) -> Iterator[Vote]:
    snap = peer.record.snapshot
    for d in snap.devices if snap is not None else ():
        if d.fw_ver:
            yield model_of(d), d.fw_ver


def _fw_settle(counts: Mapping[Hashable, int]) -> Hashable:
    # (fleet majority, versions seen, more than one adapter of the model). Not the count
    # itself: a fact that moved with every joining node would re-judge the whole model.
    return (
        majority_of(counts),
        ",".join(sorted(cast(str, v) for v in counts)),
        sum(counts.values()) > 1,
    )


def _fw_judge(peer: Peer, votes: Sequence[Vote], facts: Facts) -> list[Finding]:
    snap = peer.record.snapshot
    if snap is None:
        return []
    # The node's adapters with a firmware version, by model (its votes, in device order).
    node_fw: dict[str | None, list[str]] = {}
    for model, fw in votes:
        node_fw.setdefault(cast(str | None, model), []).append(cast(str, fw))
    in_node: dict[str | None, str | None] = {}
    found: list[Finding] = []
    for d in snap.devices:
        if not d.fw_ver:
            continue
        model = model_of(d)
        in_fleet, seen, several = cast(tuple[str | None, str, bool], facts[model])
        if not several or (d.fw_ver == in_fleet and len(set(node_fw[model])) == 1):
            continue  # as the fleet and every adapter of its model in the node: no skew
        if model not in in_node:
            in_node[model] = majority(node_fw[model])
        node_usual = in_node[model]
        usual: str | None
        if node_usual is not None and d.fw_ver != node_usual and len(node_fw[model]) > 1:
            scope, usual = "node", node_usual
        elif d.fw_ver != in_fleet:
            scope, usual = "fleet", in_fleet
        else:
            continue
        shown = f"the {scope}'s {usual}" if usual else f"the {scope}, which has no majority version"
        found.append(
            Finding(
                rule="fw-skew",
                severity="warning",
                node=peer.name,
                subject=d.name,
                message=f"{d.name} ({model_label(d)}) runs firmware {d.fw_ver}, unlike "
                f"{shown}; flash the fleet's version (mlxfwmanager) so all "
                "adapters of a model behave alike.",
                evidence={
                    "fw_ver": d.fw_ver,
                    "majority_fw": usual,
                    "scope": scope,
                    "model": model_of(d),
                    "versions_seen": seen,
                },
            )
        )
    return found


FW_SKEW: Final = PeerRule("fw-skew", _fw_tally, _fw_settle, _fw_judge)


def _minimum_for(device: Device, minimums: Mapping[str, str]) -> tuple[str, str] | None:
    """The policy key naming this adapter's model (device id, name, HCA type or board id)."""
    model = model_of(device)
    names = {
        n.lower()
        for n in (model, MODEL_NAMES.get(model or ""), device.hca_type, device.board_id)
        if n
    }
    for key, version in sorted(minimums.items()):
        if key.lower() in names:
            return key, version
    return None


def check_fw_below_minimum(given: RuleInput) -> list[Finding]:
    expect = expectations(given.fleet, given.policies, given.cluster)
    found: list[Finding] = []
    for node, snap in snapshots(given.fleet):
        minimums = expect[node].min_firmware
        if not minimums:
            continue
        for d in snap.devices:
            match = _minimum_for(d, minimums)
            if match is None:
                continue
            key, minimum = match
            have, need = parse_version(d.fw_ver), parse_version(minimum)
            if need is None or (have is not None and have >= need):
                continue  # an unparsable version is reported by data-quality
            found.append(
                Finding(
                    rule="fw-below-minimum",
                    severity="critical",
                    node=node,
                    subject=d.name,
                    message=f"{d.name} ({model_label(d)}) runs firmware "
                    f"{d.fw_ver or 'unknown'}, below the policy's minimum {minimum}; flash "
                    "at least that version (mlxfwmanager -u) and reset the adapter.",
                    evidence={"fw_ver": d.fw_ver, "min_firmware": minimum, "policy_key": key},
                )
            )
    return found


def _driver_tally(peer: Peer) -> Iterator[Vote]:
    snap = peer.record.snapshot
    if snap is None:
        return
    for module in DRIVER_MODULES:
        info = snap.modules.get(module)
        if info is not None:
            # Inbox modules have no version; their srcversion identifies the build.
            label = info.version or (f"srcversion {info.srcversion}" if info.srcversion
                                     else "inbox")  # fmt: skip
            yield module, label


def _driver_settle(counts: Mapping[Hashable, int]) -> Hashable:
    return ",".join(sorted(cast(str, v) for v in counts)), majority_of(counts)


def _driver_judge(peer: Peer, votes: Sequence[Vote], facts: Facts) -> list[Finding]:
    found: list[Finding] = []
    for module, label in votes:
        seen, usual = cast(tuple[str, str | None], facts[module])
        if "," not in seen or label == usual:
            continue
        found.append(
            Finding(
                rule="driver-skew",
                severity="warning",
                node=peer.name,
                subject=cast(str, module),
                message=f"Module {module} is {label} here but "
                f"{usual or 'different'} on the rest of the fleet; install the fleet's "
                "driver version (DOCA/MLNX_OFED or kernel) on this node.",
                evidence={
                    "module": cast(str, module),
                    "version": cast(str, label),
                    "fleet_version": usual,
                    "versions_seen": seen,
                },
            )
        )
    return found


DRIVER_SKEW: Final = PeerRule("driver-skew", _driver_tally, _driver_settle, _driver_judge)


RULES: Final[tuple[Rule, ...]] = (
    Rule.of_peers(FW_SKEW, family="versions", severity="warning", reads=SNAPSHOT),
    Rule(id="fw-below-minimum", family="versions", severity="critical",
         check=check_fw_below_minimum, reads=SNAPSHOT),
    Rule.of_peers(DRIVER_SKEW, family="versions", severity="warning", reads=SNAPSHOT),
)  # fmt: skip
