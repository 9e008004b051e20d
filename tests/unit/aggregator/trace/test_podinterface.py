"""The chain's `pod-interface` link (pure), through `trace`: what the newest validation's
verify found on this node's side, and what the chain pods' network-status shows without it."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import pytest
from msgspec.structs import replace as sr

from aggregator.cluster import ClusterNode, ClusterView, NetworkStatus, PodRequest
from aggregator.fleet.state import NodeRecord
from aggregator.trace.chain import LINK_NAMES, trace
from aggregator.trace.podinterface import POD_INTERFACE_LINK
from aggregator.trace.tested import RECENT_S, TESTED_LINK
from proto.http import Link, ValidationRecord
from proto.messages.validation import (
    DeviceEvidence,
    Evidence,
    InterfaceEvidence,
    PortEvidence,
    RdmaInterface,
    Reason,
    ValidationResult,
    Verdict,
)
from tests.support.builders import (
    T0,
    modules,
    nic,
    plugin_status,
    rdma_policy,
    resource_status,
    snapshot,
)

NODE, OTHER = "gpu-001", "gpu-002"
RES = "rdma/roce"
ADAPTERS = (
    sr(nic("mlx5_0", index=0, netdevs=("ens1f0",), link_layer="Ethernet"), fw_ver="28.39.1002"),
    sr(nic("mlx5_1", index=1, netdevs=("ens1f1",), link_layer="Ethernet"), fw_ver="28.39.1002"),
)
ROCE_PORT = PortEvidence(port=1, state="ACTIVE", link_layer="Ethernet")
IB_PORT = PortEvidence(port=1, state="ACTIVE", link_layer="InfiniBand")
NET1 = RdmaInterface(interface="net1", device="mlx5_0", sources=("gid-address", "device-info"))
POD_IFS = (InterfaceEvidence(name="eth0"), InterfaceEvidence(name="net1"))


def result(
    role: str,
    *,
    verdict: Verdict = "rdma-path",
    found: tuple[RdmaInterface, ...] = (NET1,),
    reasons: tuple[Reason, ...] = (),
    port: PortEvidence = ROCE_PORT,
    interfaces: tuple[InterfaceEvidence, ...] = POD_IFS,
) -> ValidationResult:
    evidence = Evidence(
        devices=(DeviceEvidence(name="mlx5_0", ports=(port,), pci_address="0000:19:00.0"),),
        interfaces=interfaces,
        rdma_interfaces=found,
    )
    return ValidationResult(
        validation_id="v1", role=role, node=NODE if role == "server" else OTHER,  # type: ignore[arg-type]
        pod=f"nicfleet-validate-v1-{role}", verdict=verdict, reasons=reasons,
        evidence=evidence, started_at=T0 - 30, finished_at=T0 - 10,
    )  # fmt: skip


def validation(
    server: ValidationResult | None = None,
    client: ValidationResult | None = None,
    *,
    nodes: tuple[str, str] = (NODE, OTHER),
    finished: float = T0,
    phase: str = "done",
    reason: str | None = None,
) -> ValidationRecord:
    return ValidationRecord(
        id="v1", nodes=nodes, resource=RES, namespace="nicfleet-system", phase=phase,  # type: ignore[arg-type]
        passed=phase == "done", reason=reason, created_at=finished - 60, updated_at=finished,
        phase_since=finished, finished_at=finished, server=server, client=client,
    )  # fmt: skip


def reason(code: str, message: str) -> Reason:
    return Reason(code=code, missing="-", message=message)


ON_MLX5_0 = NetworkStatus(
    name="ml/roce-net", interface="net1", ips=("192.168.0.5/24",),
    pci_address="0000:19:00.0", rdma_device="mlx5_0",
)  # fmt: skip
ON_OTHER = NetworkStatus(
    name="ml/roce-net", interface="net1", ips=("192.168.1.5/24",), pci_address="0000:af:00.0"
)
TRAIN = PodRequest(
    namespace="ml", name="train-0", node=NODE, phase="Running", requests={RES: 1},
    networks=("ml/roce-net",),
)  # fmt: skip


@dataclass(frozen=True)
class Case:
    pods: tuple[PodRequest, ...] = (TRAIN,)
    present: bool = True

    def link(self, record: ValidationRecord | None = None, pod: PodRequest | None = None) -> Link:
        snap = msgspec.structs.replace(snapshot(NODE, devices=ADAPTERS), modules=modules())
        status = plugin_status(NODE, resource_status(RES, devices=("mlx5_0", "mlx5_1")))
        fleet = {NODE: NodeRecord(name=NODE, snapshot=snap, first_seen=T0, last_seen=T0,
                                  device_plugin=status)}  # fmt: skip
        cluster = ClusterView(
            present=True, nodes={NODE: ClusterNode(name=NODE, allocatable={RES: "2"})},
            pods=self.pods,
        ) if self.present else ClusterView()  # fmt: skip
        chain = trace(NODE, RES, fleet=fleet, cluster=cluster,
                      policies=(rdma_policy("roce", RES),), now=T0 + 5, stale_after=30.0,
                      validation=record, pod=pod)  # fmt: skip
        names = [link.name for link in chain.links]
        assert names.index(POD_INTERFACE_LINK) == names.index(TESTED_LINK) - 1
        return chain.links[names.index(POD_INTERFACE_LINK)]


PLAIN = Case()


def test_the_link_sits_right_before_the_tested_path() -> None:
    assert LINK_NAMES[-2:] == (POD_INTERFACE_LINK, TESTED_LINK)


def test_never_validated_is_unknown_with_the_command() -> None:
    link = PLAIN.link()
    assert link.status == "unknown"
    assert link.evidence == {
        "validated": "never validated",
        "command": f"nicfleetctl validate {NODE} <other-node> --resource {RES}",
    }


@pytest.mark.parametrize("side", ["server", "client"])
def test_verify_named_the_pods_rdma_interfaces(side: str) -> None:
    record = (
        validation(result("server"))
        if side == "server"
        else validation(client=result("client"), nodes=(OTHER, NODE))
    )
    link = PLAIN.link(record)
    assert link.status == "ok", link
    assert link.evidence["interfaces"] == ["net1 (gid-address, device-info)"]
    (verified,) = link.evidence["verified"]
    assert verified["pod"] == f"nicfleet-system/nicfleet-validate-v1-{side}"
    assert (verified["devices"], verified["pod_interfaces"]) == (
        {"net1": ["mlx5_0"]},
        ["eth0", "net1"],
    )


def test_the_other_nodes_side_says_nothing_about_this_one() -> None:
    primary = reason("primary-interface-only", "the pod has only its primary interface (eth0)")
    record = validation(result("server"), result("client", found=(), reasons=(primary,)))
    assert PLAIN.link(record).status == "ok"  # the client ran on gpu-002


@pytest.mark.parametrize(
    ("code", "verdict", "fix"),
    [
        pytest.param("primary-interface-only", "ordinary-interface-only",
                     "request the RDMA network in `k8s.v1.cni.cncf.io/networks`", id="primary"),
        pytest.param("no-rdma-device-in-pod", "ordinary-interface-only",
                     f"a pod gets one only through {RES} in its limits", id="no-device"),
        pytest.param("gid-not-on-pod-interface", "broken",
                     "the NAD's master must be one of its netdevs", id="gid-elsewhere"),
        pytest.param("attachment-not-allocated", "broken",
                     f"`k8s.v1.cni.cncf.io/resourceName: {RES}`", id="wrong-attachment"),
        pytest.param("attachment-interface-missing", "broken",
                     "check the CNI plugin's log", id="interface-missing"),
    ],
)  # fmt: skip
def test_verify_found_a_wrong_interface(code: str, verdict: Verdict, fix: str) -> None:
    why = reason(code, f"what verify said about {code}")
    record = validation(
        result("server", verdict=verdict, found=(), reasons=(why,), interfaces=POD_IFS[:1]),
        phase="failed",
        reason="the server's verdict is not rdma-path",
    )
    link = PLAIN.link(record)
    assert link.status == "broken"
    assert link.cause == (
        f"verify in nicfleet-system/nicfleet-validate-v1-server: what verify said about {code}"
    )
    assert link.fix is not None and fix in link.fix
    assert link.evidence["reasons"] == [{"code": code, "message": why.message}]
    assert link.evidence["pod_interfaces"] == ["eth0"]


def test_a_port_problem_is_not_this_links() -> None:
    down = reason("port-down", "no port of mlx5_0 is ACTIVE")
    record = validation(result("server", verdict="broken", reasons=(down,)), phase="failed")
    link = PLAIN.link(record)
    assert link.status == "ok"  # net1 is the RDMA interface; tested-data-path says the rest
    assert "reasons" not in link.evidence["verified"][0]


def test_infiniband_verbs_need_no_pod_netdev() -> None:
    record = validation(result("server", found=(), port=IB_PORT, interfaces=POD_IFS[:1]))
    link = PLAIN.link(record)
    assert (link.status, link.evidence["interfaces"]) == ("ok", [])
    assert "infiniband" in link.evidence["verified"][0]


def test_roce_without_an_identified_interface_is_unknown() -> None:
    link = PLAIN.link(validation(result("server", found=())))
    assert link.status == "unknown"
    assert link.evidence["note"] == "verify identified no pod interface as an RDMA device's"


def test_an_old_proof_is_unknown_again() -> None:
    link = PLAIN.link(validation(result("server"), finished=T0 - RECENT_S - 3600))
    assert link.status == "unknown"
    assert link.evidence["note"].startswith("verify identified them 25h ago; re-run:")
    attached = Case(pods=(sr(TRAIN, network_status=(ON_MLX5_0,)),))
    old = validation(result("server"), finished=T0 - RECENT_S - 3600)
    assert attached.link(old).status == "ok"  # a pod's network-status today still counts


def test_a_validation_without_this_nodes_result_falls_back_to_network_status() -> None:
    record = validation(phase="timed-out", reason="the server never answered")
    link = PLAIN.link(record)
    assert link.status == "unknown"
    assert link.evidence["note"] == (
        f"validation v1 (timed-out) has no verify result from {NODE}: the server never answered"
    )
    running = Case(pods=(sr(TRAIN, network_status=(ON_MLX5_0,)),))
    assert running.link(record).status == "ok"


def test_network_status_on_a_selected_adapter_is_ok_without_a_validation() -> None:
    link = Case(pods=(sr(TRAIN, network_status=(ON_MLX5_0,)),)).link()
    assert link.status == "ok", link
    assert link.evidence["interfaces"] == ["net1 (device-info: mlx5_0)"]
    assert link.evidence["network_status"] == [
        {"pod": "ml/train-0", "network": "ml/roce-net", "interface": "net1 (device-info: mlx5_0)",
         "ips": ["192.168.0.5/24"], "adapter_selected": True},
    ]  # fmt: skip
    assert link.evidence["validated"] == "never validated"


@pytest.mark.parametrize(
    "status",
    [
        pytest.param(ON_OTHER, id="another-adapter"),
        pytest.param(NetworkStatus(name="ml/roce-net", interface="net1"), id="no-device-info"),
    ],
)
def test_network_status_without_a_selected_adapter_informs_but_stays_unknown(
    status: NetworkStatus,
) -> None:
    link = Case(pods=(sr(TRAIN, network_status=(status,)),)).link()
    assert link.status == "unknown"
    (seen,) = link.evidence["network_status"]
    assert seen["adapter_selected"] is (False if status.pci_address else None)


def test_a_finished_pods_network_status_is_left_out() -> None:
    done = sr(TRAIN, phase="Succeeded", network_status=(ON_MLX5_0,))
    link = Case(pods=(done,)).link()
    assert (link.status, "network_status" in link.evidence) == ("unknown", False)


def test_a_pod_trace_reads_that_pods_own_network_status() -> None:
    attached = sr(TRAIN, network_status=(ON_MLX5_0,))
    bare = sr(TRAIN, name="train-1", networks=(), network_status=())
    case = Case(pods=(attached, bare))
    assert case.link().status == "ok"  # the node: one of its pods shows the interface
    own = case.link(pod=bare)
    assert (own.status, "network_status" in own.evidence) == ("unknown", False)
    assert case.link(pod=attached).evidence["network_status"][0]["pod"] == "ml/train-0"


def test_without_a_cluster_the_verify_evidence_still_counts() -> None:
    assert Case(present=False).link(validation(result("server"))).status == "ok"
