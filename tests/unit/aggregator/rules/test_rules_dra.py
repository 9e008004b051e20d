"""The DRA rules (pure): dra-claim-unhealthy-device (a port down, a device gone, a silent
agent, the kubelet's Unhealthy) and dra-claim-root-mismatch (a NIC of ours and a GPU under
different PCIe roots) — and that incremental evaluation re-runs them when the claims,
the node or only the clock moved (the node going stale)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from msgspec.structs import replace as sr

from aggregator.cluster import (
    ClaimHealth,
    ClusterView,
    DraClaim,
    DraDevice,
    DraResult,
    PodClaim,
    PodRequest,
)
from aggregator.fleet.state import Fleet, NodeRecord
from aggregator.rules import dra
from aggregator.rules.descriptor import Rule, RuleInput
from aggregator.rules.engine.incremental import IncrementalRules
from aggregator.rules.engine.registry import BEFORE_DUE, CLUSTER_RULES, TIME_RULES, evaluate
from aggregator.rules.finding import Finding
from aggregator.rules.thresholds import DEFAULT_THRESHOLDS
from proto.inventory import DataDirectFunction, Device, NodeSnapshot
from proto.messages.status import DevicePluginStatus, DraPluginStatus, DraSliceConfig
from tests.support.builders import port_event
from tests.support.rules_cases import T0, adapter, node

N = "gpu-01"
GPU = "gpu.nvidia.com"
ROOT = "resource.kubernetes.io/pcieRoot"
OURS = frozenset({dra.UNHEALTHY, dra.ROOT_MISMATCH})


def nic(name: str = "mlx5_0", root: str = "pci0000:9a", **kw: Any) -> Device:
    index = int(name.rsplit("_", 1)[-1])
    d = adapter(name, f"0000:{0x9B + index:02x}:00.0", **kw)
    return sr(d, pci_path=(root, "0000:9a:01.0", d.pci_address))


def records(
    *devices: Device,
    name: str = N,
    at: float = T0,
    dra_status: DraPluginStatus | None = None,
    snap: NodeSnapshot | None = None,
) -> dict[str, NodeRecord]:
    fleet = Fleet()
    fleet.apply_snapshot(snap or node(name, *(devices or (nic(),)), collected_at=at), at)
    if dra_status is not None:
        status = DevicePluginStatus(node=name, observed_at=at, dra=dra_status)
        fleet.apply_status(status, at)
    return dict(fleet.view())


def claim(*results: DraResult, name: str = "train-0-nic", **kw: Any) -> DraClaim:
    fields: dict[str, Any] = {
        "namespace": "ml", "name": name, "uid": f"uid-{name}", "allocated": True,
        "results": results, "node": N, "reserved_for": ("ml/train-0",),
    }  # fmt: skip
    return DraClaim(**(fields | kw))


def ours(device: str = "mlx5-0", pool: str = N, request: str = "nic") -> DraResult:
    return DraResult(request=request, driver=dra.DRIVER, pool=pool, device=device)


def gpu(device: str = "gpu-0", request: str = "gpu") -> DraResult:
    return DraResult(request=request, driver=GPU, pool=N, device=device)


def gpu_slice(root: str = "pci0000:3a", device: str = "gpu-0", on: str = N) -> DraDevice:
    return DraDevice(driver=GPU, pool=N, node=on, name=device, slice=f"{N}-gpu",
                     attributes={ROOT: root, "gpu.nvidia.com/index": 0})  # fmt: skip


def view(*claims: DraClaim, **kw: Any) -> ClusterView:
    return ClusterView(present=True, dra_present=True, claims=claims, **kw)


def run(
    rule: str,
    fleet: Mapping[str, NodeRecord],
    cluster: ClusterView,
    now: float = T0 + 1,
    heard_since: Mapping[str, float] | None = None,
) -> list[Finding]:
    given = RuleInput(fleet, (), cluster, now, DEFAULT_THRESHOLDS, heard_since or {})
    return dra.RULES[0 if rule == dra.UNHEALTHY else 1].check(given)


# -- dra-claim-unhealthy-device -----------------------------------------------------------


def test_a_claim_on_a_port_that_is_down_names_device_reason_pods_and_fix() -> None:
    (f,) = run(dra.UNHEALTHY, records(nic(state="DOWN")), view(claim(ours())))
    assert (f.rule, f.severity, f.node, f.subject) == (
        dra.UNHEALTHY, "critical", N, "claim/ml/train-0-nic/mlx5-0",
    )  # fmt: skip
    assert f.evidence == {
        "claim": "ml/train-0-nic", "device": "mlx5-0", "rdma_device": "mlx5_0",
        "reason": "port DOWN", "pods": "ml/train-0", "kubelet_unhealthy": "", "request": "nic",
    }  # fmt: skip
    for text in ("ResourceClaim ml/train-0-nic", "mlx5-0 (RDMA device mlx5_0)", "port DOWN",
                 "Reserved by ml/train-0", "delete the pods", "deploy/dra/examples/rdma-nic.yaml",
                 "DeviceClasses select portState"):  # fmt: skip
        assert text in f.message


@pytest.mark.parametrize(
    ("fleet", "cluster"),
    [
        pytest.param(records(nic()), view(claim(ours())), id="healthy"),
        pytest.param(
            records(nic(state="DOWN")),
            view(claim(DraResult(request="gpu", driver=GPU, pool=N, device="mlx5-0"))),
            id="other-driver-only",
        ),
        pytest.param(
            records(nic(state="DOWN")), view(claim(ours(), allocated=False)), id="pending"
        ),
        pytest.param(records(nic(state="DOWN")), view(claim(ours(), deleting=True)), id="deleting"),
        pytest.param(
            records(nic(state="DOWN")), view(claim(ours(pool="gpu-99"))), id="node-not-in-fleet"
        ),
        pytest.param(records(nic(state="DOWN")), view(), id="no-claims"),
    ],
)
def test_unhealthy_device_stays_quiet(fleet: dict[str, NodeRecord], cluster: ClusterView) -> None:
    assert run(dra.UNHEALTHY, fleet, cluster) == []


def test_a_device_gone_from_the_node_points_at_the_lost_adapter() -> None:
    (f,) = run(dra.UNHEALTHY, records(nic()), view(claim(ours("mlx5-3"))))
    assert str(f.evidence["reason"]).startswith("not on the node")
    assert f.evidence["rdma_device"] == "mlx5_3"  # from the name: nothing publishes it
    assert "no longer published" in f.message and "adapter-lost" in f.message


def test_a_silent_agent_makes_every_claimed_device_unhealthy_from_staleafter_on() -> None:
    fleet, cluster = records(nic()), view(claim(ours()))
    assert run(dra.UNHEALTHY, fleet, cluster, now=T0 + 30) == []  # staleAfter 30 s: not yet
    (f,) = run(dra.UNHEALTHY, fleet, cluster, now=T0 + 31)
    assert f.evidence["reason"] == "the node's agent is silent: port state not known"
    assert "agent-stale" in f.message
    # A record loaded from KV: silence counts from when this process could hear the node.
    assert run(dra.UNHEALTHY, fleet, cluster, now=T0 + 31, heard_since={N: T0 + 20}) == []


def test_the_kubelets_unhealthy_counts_for_pods_reserving_the_claim() -> None:
    plugin = DraPluginStatus(state="registered", unhealthy={"mlx5-0": "uverbs0 missing"})
    fleet = records(nic(), dra_status=plugin)
    health = ClaimHealth(container="c", entry="nic", resource_id=f"{dra.DRIVER}/{N}/mlx5-0",
                         health="Unhealthy")  # fmt: skip
    pod = PodRequest(namespace="ml", name="train-0", node=N, phase="Running",
                     claims=(PodClaim(name="nic", claim="train-0-nic"),),
                     claim_health=(health,))  # fmt: skip
    (f,) = run(dra.UNHEALTHY, fleet, view(claim(ours()), pods=(pod,)))
    assert f.evidence["kubelet_unhealthy"] == "ml/train-0"
    assert f.evidence["reason"] == "the kubelet reports it Unhealthy (uverbs0 missing)"
    # Another pod's health, a Healthy device, or an entry of another claim: nothing.
    other = sr(pod, name="train-1")
    healthy = sr(pod, claim_health=(sr(health, health="Healthy"),))
    elsewhere = sr(pod, claims=(*pod.claims, PodClaim(name="x", claim="other")),
                   claim_health=(sr(health, entry="x"),))  # fmt: skip
    for p in (other, healthy, elsewhere):
        assert run(dra.UNHEALTHY, fleet, view(claim(ours()), pods=(p,))) == []


def test_share_copies_and_two_devices_of_one_claim_are_one_finding_each() -> None:
    copies = DraPluginStatus(slices=DraSliceConfig(sharing="copies", share=2))
    fleet = records(nic(state="DOWN"), nic("mlx5_1", state="DOWN"), dra_status=copies)
    found = run(
        dra.UNHEALTHY, fleet, view(claim(ours("mlx5-0-s1"), ours("mlx5-1-s0", request="b")))
    )
    assert [(f.subject, f.evidence["rdma_device"]) for f in found] == [
        ("claim/ml/train-0-nic/mlx5-0-s1", "mlx5_0"),
        ("claim/ml/train-0-nic/mlx5-1-s0", "mlx5_1"),
    ]


# -- dra-claim-root-mismatch --------------------------------------------------------------


def test_a_nic_under_another_root_than_the_claims_gpu_names_both_roots_and_the_fix() -> None:
    cluster = view(claim(ours(), gpu()), dra_devices=(gpu_slice(),))
    (f,) = run(dra.ROOT_MISMATCH, records(nic()), cluster)
    assert (f.rule, f.severity, f.node, f.subject) == (
        dra.ROOT_MISMATCH, "warning", N, "claim/ml/train-0-nic/mlx5-0",
    )  # fmt: skip
    assert f.evidence == {
        "claim": "ml/train-0-nic", "device": "mlx5-0", "rdma_device": "mlx5_0",
        "nic_root": "pci0000:9a", "root_from": "snapshot", "other_devices": f"{GPU}/gpu-0",
        "other_roots": "pci0000:3a", "pcie_root_constraint": False,
    }  # fmt: skip
    for text in ("under PCIe root pci0000:9a", f"{GPU}/gpu-0 under pci0000:3a",
                 "CPU interconnect", "matchAttribute: resource.kubernetes.io/pcieRoot",
                 "deploy/dra/examples/gpu-and-nic.yaml"):  # fmt: skip
        assert text in f.message


def test_the_published_slice_is_the_nics_root_and_a_constraint_is_noted() -> None:
    published = DraDevice(driver=dra.DRIVER, pool=N, node=N, name="mlx5-0", slice="s",
                          attributes={ROOT: "pci0000:3a"})  # fmt: skip
    same = view(claim(ours(), gpu()), dra_devices=(gpu_slice(), published))
    assert run(dra.ROOT_MISMATCH, records(nic()), same) == []  # the scheduler's view wins
    spec = {"devices": {"constraints": [{"requests": ["gpu-0", "nic-0"], "matchAttribute": ROOT}]}}
    other = sr(published, attributes={ROOT: "pci0000:c1"})
    cluster = view(claim(ours(), gpu(), spec=spec), dra_devices=(gpu_slice(), other))
    (f,) = run(dra.ROOT_MISMATCH, records(nic()), cluster)
    assert (f.evidence["root_from"], f.evidence["pcie_root_constraint"]) == ("slice", True)
    assert "does not cover these requests" in f.message


def test_data_direct_compares_the_data_direct_functions_root() -> None:
    # A ConnectX-8 whose NIC hangs off pci0000:9a and whose Data Direct function (same VUID)
    # sits under the GPU's pci0000:3a: pcieRoot is the latter, so the pair is aligned.
    d = sr(nic(), vpd_vuid="VU1")
    path = ("pci0000:3a", "0000:3a:01.0", "0000:3b:00.1")
    function = DataDirectFunction(pci_address="0000:3b:00.1", vpd_vuid="VU1", pci_path=path)
    snap = sr(node(N, d), data_direct=(function,))
    cluster = view(claim(ours(), gpu()), dra_devices=(gpu_slice(),))
    assert run(dra.ROOT_MISMATCH, records(snap=snap), cluster) == []


@pytest.mark.parametrize(
    "cluster",
    [
        pytest.param(
            view(claim(ours(), gpu()), dra_devices=(gpu_slice("pci0000:9a"),)), id="same-root"
        ),
        pytest.param(view(claim(ours()), dra_devices=(gpu_slice(),)), id="ours-only"),
        pytest.param(view(claim(gpu()), dra_devices=(gpu_slice(),)), id="other-driver-only"),
        pytest.param(
            view(claim(ours(), gpu()), dra_devices=(sr(gpu_slice(), attributes={}),)),
            id="gpu-without-root",
        ),
        pytest.param(
            view(claim(ours(), gpu()), dra_devices=(gpu_slice(on="gpu-02"),)),
            id="gpu-on-another-node",
        ),
        pytest.param(
            view(claim(ours(), gpu(), allocated=False), dra_devices=(gpu_slice(),)), id="pending"
        ),
        pytest.param(
            view(claim(ours(pool="gpu-99"), gpu()), dra_devices=(gpu_slice(),)),
            id="node-not-in-fleet",
        ),
    ],
)
def test_root_mismatch_stays_quiet(cluster: ClusterView) -> None:
    assert run(dra.ROOT_MISMATCH, records(nic()), cluster) == []


def test_the_root_does_not_depend_on_the_agent_being_heard() -> None:
    cluster = view(claim(ours(), gpu()), dra_devices=(gpu_slice(),))
    assert len(run(dra.ROOT_MISMATCH, records(nic()), cluster, now=T0 + 3600)) == 1


# -- the engine ----------------------------------------------------------------------------


def test_both_rules_read_the_cluster_and_only_the_health_rule_reads_the_clock() -> None:
    assert OURS <= CLUSTER_RULES
    assert dra.UNHEALTHY in TIME_RULES and frozenset({dra.UNHEALTHY}) == BEFORE_DUE
    assert dra.ROOT_MISMATCH not in TIME_RULES
    with pytest.raises(ValueError, match="x: reports before its due time"):
        Rule(id="x", family="fleet", severity="info", check=lambda given: [],
             reads=frozenset(), before_due=True)  # fmt: skip


def _ours(found: list[Finding]) -> list[tuple[str, str]]:
    return [(f.rule, str(f.evidence.get("reason", ""))) for f in found if f.rule in OURS]


def test_incremental_follows_claims_the_clock_and_the_node() -> None:
    engine = IncrementalRules()
    fleet = Fleet()
    fleet.apply_snapshot(node(N, nic()), T0)
    empty = view()
    both = view(claim(ours(), gpu()), dra_devices=(gpu_slice(),))

    def step(cluster: ClusterView, now: float) -> list[tuple[str, str]]:
        found = engine.evaluate(fleet.view(), (), cluster, now)
        assert found == evaluate(fleet.view(), (), cluster, now)
        return _ours(found)

    assert step(empty, T0 + 1) == []
    rebuilds = engine.rebuilds
    assert engine.starts_over((), both, DEFAULT_THRESHOLDS)  # a claim moved: every node
    assert step(both, T0 + 2) == [(dra.ROOT_MISMATCH, "")]
    assert engine.rebuilds == rebuilds  # re-ran the cluster rules, did not start over
    fleet.apply_event(port_event(N, new="DOWN", observed_at=T0 + 3, seq=2), T0 + 3)
    assert step(both, T0 + 4) == [(dra.UNHEALTHY, "port DOWN"), (dra.ROOT_MISMATCH, "")]
    stale = "the node's agent is silent: port state not known"
    assert step(both, T0 + 40) == [(dra.UNHEALTHY, stale), (dra.ROOT_MISMATCH, "")]
    up = port_event(N, new="ACTIVE", old="DOWN", phys="LinkUp", observed_at=T0 + 41, seq=3)
    fleet.apply_event(up, T0 + 41)  # heard again, port up
    assert step(both, T0 + 42) == [(dra.ROOT_MISMATCH, "")]
    assert step(both, T0 + 30) == [(dra.ROOT_MISMATCH, "")]  # the clock went back
    assert step(empty, T0 + 43) == []
