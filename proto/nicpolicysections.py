"""The NicClusterPolicy sections besides the RDMA shared device plugin, against the fleet:
ofedDriver (the webhook's version pattern, then each node's mlx5_core), secondaryNetwork,
nvIpam, the operator's status, NicNodePolicy names and nodeSelector. Pure: the spec and
snapshots in, Notes out; proto.nicclusterpolicy assembles the audit (sriovDevicePlugin is
proto.sriovdp's, the webhook's other refusals proto.operatorwebhook's).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import msgspec

from proto.inventory import NodeSnapshot

Severity = Literal["critical", "warning", "info"]
# isValidOFEDVersion (api/v1alpha1/validator/nicpolicy_webhook.go at b06827e).
_OFED_VERSION: Final = re.compile(
    r"(sha256:[a-fA-F0-9]{64}|doca\d+\.\d+(\.\d+)?-\d+\.\d+-\d+\.\d+\.\d+\.\d+-\d+(-[\w\.\-]+)*"
    r"|\d+\.\d+-\d+(\.\d+)*(-\d+)?(-[\w\.\-]+)*)\Z"
)
# "26.07-0.7.0" of "doca3.5.0-26.07-0.7.0.0-0" or "24.10-1.1.4.0": the MOFED release that
# mlx5_core's modinfo version starts with ("24.10-1.1.4").
_OFED_RELEASE: Final = re.compile(r"(?:doca[\d.]+-)?(\d+\.\d+)-(\d+)\.(\d+)\.(\d+)")
_NODE_POLICY_NAME_MAX: Final = 30  # maxNicNodePolicyNameLength (its message says 50)


class Note(msgspec.Struct, frozen=True, kw_only=True):
    """One finding about a section of the policy (not about one resource on one node)."""

    section: str  # ofedDriver, webhook, secondaryNetwork, nvIpam, sriovDevicePlugin, status, ...
    severity: Severity
    path: str  # spec.ofedDriver.version
    message: str
    node: str | None = None


def ofed_notes(ofed: Mapping[str, Any], snapshots: Mapping[str, NodeSnapshot]) -> list[Note]:
    """spec.ofedDriver.version: the webhook's pattern, then against each node's mlx5_core."""
    if not ofed:
        return []
    path = "spec.ofedDriver.version"
    version = str(ofed.get("version") or "")
    if not _OFED_VERSION.match(version):
        return [
            Note(
                section="ofedDriver",
                severity="critical",
                path=path,
                message=f"the operator's webhook refuses version {version!r}: not an OFED/DOCA"
                " version",
            )
        ]
    release = _OFED_RELEASE.match(version)
    if release is None:  # a sha256 digest: nothing to compare modules with
        return [
            Note(
                section="ofedDriver",
                severity="info",
                path=path,
                message=f"version {version} is an image digest: module versions cannot be compared",
            )
        ]
    want = f"{release.group(1)}-{release.group(2)}.{release.group(3)}.{release.group(4)}"
    notes = []
    for node in sorted(snapshots):
        module = snapshots[node].modules.get("mlx5_core")
        have = module.version if module is not None else None
        if module is None:
            msg = f"mlx5_core is not loaded: the driver container ({want}) has not loaded it yet"
            notes.append(
                Note(section="ofedDriver", severity="warning", path=path, message=msg, node=node)
            )
        elif have is None or not _OFED_RELEASE.match(have):
            msg = (
                f"mlx5_core {have or '(no version)'} is the inbox driver, not OFED {want}:"
                " the driver container has not replaced it"
            )
            notes.append(
                Note(section="ofedDriver", severity="warning", path=path, message=msg, node=node)
            )
        elif not have.startswith(want):
            msg = f"mlx5_core {have} is loaded, the policy asks for {want} ({version})"
            notes.append(
                Note(section="ofedDriver", severity="warning", path=path, message=msg, node=node)
            )
    return notes


def secondary_network_notes(
    spec: Mapping[str, Any], snapshots: Mapping[str, NodeSnapshot]
) -> list[Note]:
    secondary = _map(spec.get("secondaryNetwork"))
    notes = []
    if (
        secondary
        and not _has(secondary, "multus")
        and (_has(secondary, "cniPlugins") or _has(secondary, "ipoib"))
    ):
        notes.append(
            Note(
                section="secondaryNetwork",
                severity="warning",
                path="spec.secondaryNetwork.multus",
                message="CNI plugins without Multus: pods get no secondary network unless another"
                " meta plugin attaches them",
            )
        )
    if _has(secondary, "ipoib"):
        ib = [
            n
            for n, s in snapshots.items()
            if any(p.link_layer == "InfiniBand" for d in s.devices for p in d.ports)
        ]
        if snapshots and not ib:
            notes.append(
                Note(
                    section="secondaryNetwork",
                    severity="warning",
                    path="spec.secondaryNetwork.ipoib",
                    message="ipoib-cni is deployed but no node has an InfiniBand port:"
                    " IPoIBNetworks cannot attach",
                )
            )
    if _has(secondary, "ipoib") and not _has(secondary, "cniPlugins"):
        notes.append(
            Note(
                section="secondaryNetwork",
                severity="info",
                path="spec.secondaryNetwork.cniPlugins",
                message="no cniPlugins: ipoib needs no other plugin, but macvlan/host-device"
                " networks do",
            )
        )
    if _has(spec, "nvIpam") and not _has(secondary, "multus"):
        notes.append(
            Note(
                section="nvIpam",
                severity="warning",
                path="spec.nvIpam",
                message="nv-ipam allocates for secondary networks, and the policy deploys no"
                " Multus",
            )
        )
    if _has(spec, "nvIpam") and _has(secondary, "ipamPlugin"):
        notes.append(
            Note(
                section="nvIpam",
                severity="info",
                path="spec.secondaryNetwork.ipamPlugin",
                message="both nv-ipam and the whereabouts ipamPlugin are deployed: each network"
                " picks one in its ipam type",
            )
        )
    return notes


def status_notes(status: Mapping[str, Any]) -> list[Note]:
    if not status:
        return []
    notes = []
    state = status.get("state")
    if state not in (None, "ready", "ignore"):
        reason = status.get("reason") or ""
        notes.append(
            Note(
                section="status",
                severity="warning",
                path="status.state",
                message=f"the operator reports {state!r}{': ' + str(reason) if reason else ''}",
            )
        )
    for i, applied in enumerate(status.get("appliedStates") or ()):
        one = _map(applied)
        if one.get("state") not in ("ready", "ignore"):
            notes.append(
                Note(
                    section="status",
                    severity="warning",
                    path=f"status.appliedStates[{i}]",
                    message=f"{one.get('name')}: {one.get('state')}"
                    + (f" — {one['message']}" if one.get("message") else ""),
                )
            )
    return notes


def node_policy_notes(
    name: str, spec: Mapping[str, Any], selected: frozenset[str] | None, nodes: Sequence[str]
) -> list[Note]:
    """The webhook's name limit, and which of `nodes` the nodeSelector picks: `selected`
    when the live fleet's labels were read, None when judging from snapshots (no labels)."""
    notes = []
    if len(name) > _NODE_POLICY_NAME_MAX:
        notes.append(
            Note(
                section="webhook",
                severity="critical",
                path="metadata.name",
                message="the operator's webhook refuses NicNodePolicy names over"
                f" {_NODE_POLICY_NAME_MAX} characters",
            )
        )
    if not spec.get("nodeSelector"):
        return notes
    selector = ", ".join(f"{k}={v}" for k, v in _map(spec.get("nodeSelector")).items())
    if selected is None:
        message = (
            f"applies to nodes with {selector}; snapshots carry no node labels (nor does an "
            "aggregator without a cluster), so it is audited against every node given"
        )
        notes.append(Note(section="nicNodePolicy", severity="info", path="spec.nodeSelector",
                          message=message))  # fmt: skip
        return notes
    picked = [n for n in nodes if n in selected]
    if not picked:
        message = f"selects none of the {len(nodes)} nodes audited ({selector}): it deploys nothing"
        notes.append(Note(section="nicNodePolicy", severity="warning", path="spec.nodeSelector",
                          message=message))  # fmt: skip
        return notes
    shown = ", ".join(picked[:8]) + (" …" if len(picked) > 8 else "")
    message = (
        f"applies to {len(picked)} of {len(nodes)} nodes by their labels ({selector}): {shown}; "
        "audited against those"
    )
    notes.append(Note(section="nicNodePolicy", severity="info", path="spec.nodeSelector",
                      message=message))  # fmt: skip
    return notes


def _has(section: Mapping[str, Any], key: str) -> bool:
    # `multus: {}` deploys Multus with the operator's defaults: present is what counts.
    return section.get(key) is not None


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
