"""Version rules: firmware skew within a group of like adapters (one model and PSID) in the
node or the fleet, firmware below the policy's minimum, and driver stacks (versions with
versions, inbox builds with builds) differing across the fleet.

Skew reads as one story: one fleet-wide finding per group running several versions, with
the count of each; a per-node finding only for the odd ones out of a majority.

Pure. Versions compare numerically by dotted parts ("28.41.1000" > "28.9.2000").
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
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
from proto.policy import Policy

_VERSION: Final = re.compile(r"^\d+(\.\d+)*\Z")


@functools.lru_cache(maxsize=4096)  # a fleet runs a few versions on many adapters
def parse_version(text: str | None) -> tuple[int, ...] | None:
    """(28, 41, 1000) from "28.41.1000"; None when not purely dotted numbers."""
    if text is None or not _VERSION.fullmatch(text.strip()):
        return None
    return tuple(int(part) for part in text.strip().split("."))


def _fw_group(device: Device) -> Hashable:
    """Adapters whose firmware must agree: one model (PCI device id) and one PSID (the
    board id: OEM variants of a model ship their own firmware streams)."""
    return ("fw", model_of(device), device.board_id)


def _fw_tally(peer: Peer) -> Iterator[Vote]:
    snap = peer.record.snapshot
    for d in snap.devices if snap is not None else ():
        if d.fw_ver:
            yield _fw_group(d), d.fw_ver


@dataclass(frozen=True, slots=True)
class Spread:
    """A group's settled fact: its majority value (None: none has more than half) and
    whether it holds more than one value — what `judge` reads, and all that equality and
    hashing see. `counts` (value, count; most first) rides along for `conclude`: a count
    that moves with every joining node must not re-judge every member of the group."""

    usual: str | None
    mixed: bool
    counts: tuple[tuple[str, int], ...] = field(compare=False, default=())

    @property
    def total(self) -> int:
        return sum(n for _, n in self.counts)


def settle_spread(counts: Mapping[Hashable, int]) -> Hashable:
    return Spread(
        usual=cast(str | None, majority_of(counts)),
        mixed=len(counts) > 1,
        counts=tuple(sorted(((cast(str, v), n) for v, n in counts.items()), key=_most_first)),
    )


def _most_first(value_count: tuple[str, int]) -> tuple[int, int, tuple[int, ...], str]:
    """Most adapters/nodes first; of equals, the newest dotted version, then by text."""
    value, n = value_count
    parsed = parse_version(value)
    return -n, parsed is None, tuple(-part for part in parsed or ()), value


def _others(n: int, noun: str) -> str:
    """Like "the other adapter carries" or "the 3 other adapters each carry"."""
    return f"the other {noun} carries" if n == 1 else f"the {n} other {noun}s each carry"


def shown_counts(spread: Spread, noun: str, shown: Callable[[str], str] = str) -> str:
    """Like "28.41.1000 on 97 adapters, 28.39.1002 on 3"."""
    parts = [f"{shown(v)} on {n}" for v, n in spread.counts]
    first_n = spread.counts[0][1] if spread.counts else 0
    if parts:
        parts[0] += f" {noun}{'' if first_n == 1 else 's'}"
    return ", ".join(parts)


def _fw_judge(peer: Peer, votes: Sequence[Vote], facts: Facts) -> list[Finding]:
    """Per adapter: off its node's majority for the model (when the node has one), else
    off the fleet's majority (when there is one). Without a fleet majority the fleet-wide
    finding (`_fw_conclude`) tells the story once; no adapter is "the odd one out"."""
    snap = peer.record.snapshot
    if snap is None:
        return []
    # The node's adapters with a firmware version, by group (its votes, in device order).
    node_fw: dict[Hashable, list[str]] = {}
    for group, fw in votes:
        node_fw.setdefault(group, []).append(cast(str, fw))
    in_node: dict[Hashable, str | None] = {}
    found: list[Finding] = []
    for d in snap.devices:
        if not d.fw_ver:
            continue
        group = _fw_group(d)
        spread = cast(Spread, facts[group])
        mine = node_fw[group]
        if not spread.mixed and len(set(mine)) == 1:
            continue  # as the fleet and every adapter of its group in the node: no skew
        if group not in in_node:
            in_node[group] = majority(mine)
        node_usual = in_node[group]
        usual: str | None
        if node_usual is not None and d.fw_ver != node_usual and len(mine) > 1:
            scope, usual = "node", node_usual
        elif spread.usual is not None and d.fw_ver != spread.usual:
            scope, usual = "fleet", spread.usual
        else:
            continue
        where = "the node's other adapters of its model" if scope == "node" else (
            "the fleet's majority of its model")  # fmt: skip
        found.append(
            Finding(
                rule="fw-skew",
                severity="warning",
                node=peer.name,
                subject=d.name,
                message=f"{d.name} ({_fw_label(group)}) runs firmware {d.fw_ver}, unlike "
                f"{where} ({usual}); flash {usual} (mlxfwmanager) so all adapters of a "
                "model behave alike.",
                evidence={
                    "fw_ver": d.fw_ver,
                    "majority_fw": usual,
                    "scope": scope,
                    "model": model_of(d),
                    "psid": d.board_id,
                },
            )
        )
    return found


def _fw_label(group: Hashable) -> str:
    """Like "ConnectX-7 (0x1021), PSID MT_0000000838"."""
    _, model, psid = cast(tuple[str, str | None, str | None], group)
    name = MODEL_NAMES.get(model or "")
    label = "unknown model" if model is None else f"{name} ({model})" if name else model
    return f"{label}, PSID {psid}" if psid else label


def _fw_subject(group: Hashable) -> str:
    _, model, psid = cast(tuple[str, str | None, str | None], group)
    label = MODEL_NAMES.get(model or "") or model or "unknown-model"
    return f"{label}/{psid}" if psid else label


def _fw_conclude(policies: tuple[Policy, ...], facts: Facts) -> list[Finding]:
    """One fleet-wide finding per adapter group running more than one version."""
    found: list[Finding] = []
    for group, fact in facts.items():
        spread = cast(Spread, fact)
        if not spread.mixed:
            continue
        _, model, psid = cast(tuple[str, str | None, str | None], group)
        counts = shown_counts(spread, "adapter")
        if spread.usual is None:
            key = MODEL_NAMES.get(model or "") or model
            advice = (
                f"no version has a majority, so no adapter is the odd one out: choose one and "
                f'pin it in a NicFleetPolicy (expect.minFirmware: {{"{key}": "<version>"}}); '
                "fw-below-minimum then names every adapter to flash."
            )
        else:
            odd = spread.total - dict(spread.counts)[spread.usual]
            advice = (
                f"{spread.usual} is the majority; {_others(odd, 'adapter')} a fw-skew "
                f"finding on its node — flash {'it' if odd == 1 else 'them'} to "
                f"{spread.usual} (mlxfwmanager)."
            )
        found.append(
            Finding(
                rule="fw-skew",
                severity="warning",
                node=None,
                subject=_fw_subject(group),
                message=f"Firmware of {_fw_label(group)} differs across the fleet "
                f"({counts}): {advice}",
                evidence={
                    "model": model,
                    "psid": psid,
                    "majority_fw": spread.usual,
                    "adapters": spread.total,
                    "versions": ", ".join(f"{v}={n}" for v, n in spread.counts),
                    "versions_seen": ",".join(sorted(v for v, _ in spread.counts)),
                },
            )
        )
    return sorted(found, key=lambda f: f.subject)


FW_SKEW: Final = PeerRule("fw-skew", _fw_tally, settle_spread, _fw_judge, _fw_conclude)


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


# The driver stacks of the RDMA path: the modules of one stack ship (and are upgraded)
# together, so a node's stack is one version set. The first module names the stack.
DRIVER_STACKS: Final[tuple[tuple[str, ...], ...]] = (
    ("mlx5_core", "mlx5_ib", "ib_core", "ib_uverbs"),  # DOCA/MLNX_OFED, or the kernel's
    ("nvidia", "nvidia_peermem"),  # the NVIDIA GPU driver
    ("nv_peer_mem",),  # the legacy Mellanox peer-memory module
)
# The modules of the RDMA path whose versions must agree across the fleet.
DRIVER_MODULES: Final = tuple(m for stack in DRIVER_STACKS for m in stack)
VERSIONED, BUILD = "version", "srcversion"
_SRC_SHOWN: Final = 8  # hex digits of a srcversion shown in messages


def _stack_vote(peer: Peer, stack: tuple[str, ...]) -> Vote | None:
    """(("driver", stack, kind), value): kind `version` when every loaded module of the
    stack has a version (DOCA/MLNX_OFED, the NVIDIA driver), else `srcversion` (inbox
    modules: only the build hash identifies them). Kinds are never compared with each
    other: a version string and a build hash cannot be "older" or "newer"."""
    snap = peer.record.snapshot
    if snap is None:
        return None
    loaded = [(m, snap.modules[m]) for m in stack if m in snap.modules]
    if not loaded:
        return None
    if all(info.version for _, info in loaded):
        versions = sorted({cast(str, info.version) for _, info in loaded})
        value = versions[0] if len(versions) == 1 else ", ".join(
            f"{m} {info.version}" for m, info in loaded)  # fmt: skip
        return ("driver", stack[0], VERSIONED), value
    return ("driver", stack[0], BUILD), "/".join(
        f"{m}={info.srcversion or 'none'}" for m, info in loaded
    )


def _driver_tally(peer: Peer) -> Iterator[Vote]:
    for stack in DRIVER_STACKS:
        vote = _stack_vote(peer, stack)
        if vote is not None:
            yield vote


def _shown_driver(value: str) -> str:
    if "=" not in value:
        return value
    return "build " + "/".join(part.split("=", 1)[1][:_SRC_SHOWN] for part in value.split("/"))


def _stack_name(group: Hashable) -> str:
    _, lead, kind = cast(tuple[str, str, str], group)
    stack = next(s for s in DRIVER_STACKS if s[0] == lead)
    modules = "/".join(stack)
    return f"{modules} ({'inbox, by srcversion' if kind == BUILD else 'by version'})"


def _driver_judge(peer: Peer, votes: Sequence[Vote], facts: Facts) -> list[Finding]:
    """A node off its stack's fleet majority (same kind); none without a majority."""
    found: list[Finding] = []
    for group, value in votes:
        spread = cast(Spread, facts[group])
        if not spread.mixed or spread.usual is None or value == spread.usual:
            continue
        _, lead, kind = cast(tuple[str, str, str], group)
        here, usual = _shown_driver(cast(str, value)), _shown_driver(spread.usual)
        found.append(
            Finding(
                rule="driver-skew",
                severity="warning",
                node=peer.name,
                subject=lead,
                message=f"Driver stack {_stack_name(group)} is {here} here but {usual} on "
                f"most of the fleet (the fleet-wide driver-skew finding counts each version); "
                f"install {usual} (DOCA/MLNX_OFED, NVIDIA driver or kernel) on this node.",
                evidence={
                    "module": lead,
                    "kind": kind,
                    "version": cast(str, value),
                    "fleet_version": spread.usual,
                },
            )
        )
    return found


def _driver_conclude(policies: tuple[Policy, ...], facts: Facts) -> list[Finding]:
    """One fleet-wide finding per driver stack and kind running more than one version."""
    found: list[Finding] = []
    for group, fact in facts.items():
        spread = cast(Spread, fact)
        if not spread.mixed:
            continue
        _, lead, kind = cast(tuple[str, str, str], group)
        other = facts.get(("driver", lead, VERSIONED if kind == BUILD else BUILD))
        more = 0 if other is None else cast(Spread, other).total
        aside = "" if not more else (
            f"; {more} more node{'' if more == 1 else 's'} run the "
            f"{'versioned' if kind == BUILD else 'inbox'} modules, compared among themselves"
        )  # fmt: skip
        if spread.usual is None:
            advice = (
                "no version has a majority, so no node is the odd one out: choose the "
                "release to standardise on and roll it out to every node (no policy field "
                "pins a driver version)."
            )
        else:
            odd = spread.total - dict(spread.counts)[spread.usual]
            advice = (
                f"{_shown_driver(spread.usual)} is the majority; {_others(odd, 'node')} a "
                "driver-skew finding — install that version there."
            )
        found.append(
            Finding(
                rule="driver-skew",
                severity="warning",
                node=None,
                subject=f"{lead}/{kind}",
                message=f"Driver stack {_stack_name(group)} differs across the fleet "
                f"({shown_counts(spread, 'node', _shown_driver)}){aside}: {advice}",
                evidence={
                    "module": lead,
                    "kind": kind,
                    "fleet_version": spread.usual,
                    "nodes": spread.total,
                    "versions": ", ".join(f"{v}={n}" for v, n in spread.counts),
                    "versions_seen": ",".join(sorted(v for v, _ in spread.counts)),
                },
            )
        )
    return sorted(found, key=lambda f: f.subject)


DRIVER_SKEW: Final = PeerRule(
    "driver-skew", _driver_tally, settle_spread, _driver_judge, _driver_conclude
)


# A fleet-wide story loses a vote for a moment when a node's partition changes hands
# (sharded) or its agent restarts; skew never needs resolving within a minute.
SKEW_RESOLVE_S: Final = 60.0

RULES: Final[tuple[Rule, ...]] = (
    replace(Rule.of_peers(FW_SKEW, family="versions", severity="warning", reads=SNAPSHOT),
            resolve_s=SKEW_RESOLVE_S),
    Rule(id="fw-below-minimum", family="versions", severity="critical",
         check=check_fw_below_minimum, reads=SNAPSHOT),
    replace(Rule.of_peers(DRIVER_SKEW, family="versions", severity="warning", reads=SNAPSHOT),
            resolve_s=SKEW_RESOLVE_S),
)  # fmt: skip
