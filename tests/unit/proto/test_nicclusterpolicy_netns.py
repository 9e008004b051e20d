"""The audit per node for the RDMA netns mode: upstream's ValidateRdmaSystemMode exits in
exclusive mode (and says what nicfleet does instead), passes in shared mode and on kernels
before 5.2, and cannot be judged when the snapshot does not tell; the findings and the
text nicfleetctl prints."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from aggregator.ctl.audit import render_text
from proto import rsdpupstream as upstream
from proto.inventory import NodeSnapshot, Platform, RdmaNetnsMode
from proto.nicclusterpolicy import AuditReport, audit_policy
from tests.support.builders import nic, snapshot

CONFIG = {
    "configList": [
        {"resourceName": "hca_shared_devices_a", "rdmaHcaMax": 63, "devices": ["ib0"]},
    ]
}


def ncp(config: Any = CONFIG) -> dict[str, Any]:
    return {
        "kind": "NicClusterPolicy",
        "metadata": {"name": "nic-cluster-policy"},
        "spec": {"rdmaSharedDevicePlugin": {"config": json.dumps(config)}},
    }


def node(
    name: str, mode: RdmaNetnsMode | None, release: str | None = "6.8.0-45-generic"
) -> NodeSnapshot:
    snap = snapshot(name, devices=(nic("mlx5_0", netdevs=("ib0",)),))
    platform = Platform(rdma_netns_mode=mode, kernel_release=release)
    return msgspec.structs.replace(snap, platform=platform)


@pytest.mark.parametrize(
    ("mode", "release", "outcome", "words"),
    [
        pytest.param("exclusive", None, "exits", "incorrect RDMA subsystem", id="exclusive"),
        pytest.param("shared", None, "starts", "shared netns mode", id="shared"),
        pytest.param(None, "4.18.0-553.el8_10.x86_64", "starts", "too old kernel", id="el8"),
        pytest.param(None, "6.8.0-45-generic", "unknown", "cannot be judged", id="not-read"),
        pytest.param(None, None, "unknown", "cannot be judged", id="nothing-known"),
    ],
)
def test_netns_check(
    mode: RdmaNetnsMode | None, release: str | None, outcome: str, words: str
) -> None:
    check = upstream.netns_check(Platform(rdma_netns_mode=mode, kernel_release=release))
    assert check.outcome == outcome
    assert words in check.reason


def test_audit_predicts_per_node() -> None:
    modes: dict[str, RdmaNetnsMode | None] = {"ex": "exclusive", "sh": "shared", "un": None}
    snaps = {n: node(n, m) for n, m in modes.items()}
    report = audit_policy(ncp(), snaps)
    by_node = {v.node: v for v in report.nodes}

    exclusive = by_node["ex"]
    assert exclusive.verdict == "would-not-start"
    assert exclusive.reason is not None and "exclusive netns mode" in exclusive.reason
    assert exclusive.resources == ()
    instead = exclusive.nicfleet_instead or ""
    assert "would advertise rdma/hca_shared_devices_a 63 (all Unhealthy)" in instead
    assert "EPERM" in instead and "hostNetwork" in instead
    assert exclusive.sentence.startswith("upstream would not start: RDMA subsystem in exclusive")

    shared = by_node["sh"]
    assert shared.verdict == "advertises" and shared.netns_caveat is None
    assert [r.advertised for r in shared.resources] == [63]

    unknown = by_node["un"]
    assert unknown.verdict == "advertises"  # the selectors are judged; the start is not
    assert [r.advertised for r in unknown.resources] == [63]
    assert unknown.netns_caveat is not None and "cannot be judged" in unknown.netns_caveat
    assert unknown.sentence.endswith(unknown.netns_caveat)

    # Critical for the exclusive node alone (the webhook notes on the image are set aside).
    bare = msgspec.structs.replace(report, notes=())
    assert AuditReport(policies=(bare,)).worst == "critical"
    shared_only = msgspec.structs.replace(bare, nodes=(shared,))
    assert AuditReport(policies=(shared_only,)).worst is None
    text = render_text(AuditReport(policies=(report,)))
    assert "  ex: upstream would not start: RDMA subsystem in exclusive netns mode" in text
    assert f"  un: {unknown.netns_caveat}" in text
    assert "  sh: upstream advertises 63 for rdma/hca_shared_devices_a" in text
