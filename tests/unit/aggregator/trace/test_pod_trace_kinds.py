"""Which pods have an RDMA chain (pure): a pod is traced when it attaches a network or
requests any device-plugin resource; only the resources nicfleet covers (configured by a
policy, served by an agent, or under rdma/) get a chain, the others are named with why, and
a pod with none of them says why there is nothing to trace."""

from __future__ import annotations

import msgspec
import pytest

from aggregator.cluster import ClusterView, NetworkAttachment, PodRequest
from aggregator.trace.pod import UnknownPod, rdma_resources, trace_pod
from proto.http import PodTrace
from tests.support.builders import T0, rdma_policy
from tests.support.chain_fixtures import RES, chain_fleet
from tests.support.pod_trace_fixtures import pod_cluster

SRIOV = "nvidia.com/mlnx_sriov_rdma"
SRIOV_NAD = NetworkAttachment(
    namespace="ml",
    name="sriov-rdma",
    resource_name=SRIOV,
    cni_type="sriov",
    ipam_type="whereabouts",
)


def traced(pod: PodRequest) -> PodTrace:
    base = pod_cluster()
    cluster = msgspec.structs.replace(
        base, pods=(*base.pods, pod), attachments=(*base.attachments, SRIOV_NAD)
    )
    return trace_pod(
        pod.namespace, pod.name, fleet=chain_fleet().view(), cluster=cluster,
        policies=(rdma_policy("ib", RES),), now=T0 + 5, stale_after=30.0,
    )  # fmt: skip


def pod(name: str, requests: dict[str, int], networks: tuple[str, ...] = ()) -> PodRequest:
    return PodRequest(
        namespace="ml", name=name, node="gpu-001", phase="Running", requests=requests,
        networks=networks,
    )  # fmt: skip


def test_the_resources_nicfleet_covers() -> None:
    assert rdma_resources(chain_fleet().view(), (rdma_policy("ib", RES),)) == {RES}
    assert rdma_resources(chain_fleet().view(), ()) == {RES}  # served by the agents
    assert rdma_resources({}, (rdma_policy("x", "rdma/x"),)) == {"rdma/x"}


def test_an_rdma_resource_beside_a_gpu_is_traced_and_the_gpu_named() -> None:
    result = traced(pod("mixed", {RES: 1, "nvidia.com/gpu": 8}))
    assert [t.resource for t in result.traces] == [RES]
    assert result.ok and result.no_chain is None
    assert result.untraced == {
        "nvidia.com/gpu": "no policy configures it and no agent's device plugin serves it: "
        "another device plugin's resource, whose chain nicfleet does not trace"
    }


def test_an_sriov_pool_names_the_network_it_backs() -> None:
    result = traced(pod("vf", {SRIOV: 1}, ("ml/sriov-rdma",)))
    assert result.traces == ()
    assert (
        "the device of ml/sriov-rdma, by its k8s.v1.cni.cncf.io/resourceName"
        in (result.untraced[SRIOV])
    )
    assert result.no_chain == (
        f"ml/vf requests only {SRIOV} (no resource nicfleet serves); it attaches "
        "ml/sriov-rdma, but no RDMA adapter is allocated to it: there is no RDMA chain to "
        "trace; request an RDMA resource (nicfleetctl resources lists them) to get one"
    )


@pytest.mark.parametrize(
    ("requests", "networks", "asks"),
    [
        pytest.param({}, ("ml/ib",), "requests no device-plugin resource; it attaches ml/ib",
                     id="network-only"),
        pytest.param({"nvidia.com/gpu": 1}, (), "requests only nvidia.com/gpu (no resource "
                     "nicfleet serves): there", id="gpu-only"),
    ],
)  # fmt: skip
def test_a_pod_without_an_rdma_resource_says_why(
    requests: dict[str, int], networks: tuple[str, ...], asks: str
) -> None:
    result = traced(pod("p", requests, networks))
    assert result.traces == () and result.no_chain is not None
    assert result.no_chain.startswith(f"ml/p {asks}")
    assert result.scheduling.status == "ok"


def test_an_rdma_prefixed_resource_no_node_serves_is_still_a_broken_chain() -> None:
    result = traced(pod("gone", {"rdma/old": 1}))
    (chain,) = result.traces
    assert (chain.ok, chain.links[0].name) == (False, "device-plugin")
    assert result.untraced == {} and result.no_chain is None


def test_a_pending_pod_has_no_no_chain_note() -> None:
    pending = msgspec.structs.replace(pod("wait", {"nvidia.com/gpu": 1}), node=None)
    result = traced(pending)
    assert (result.no_chain, result.untraced) == (None, {})


def test_an_unknown_pod_names_what_is_traced() -> None:
    with pytest.raises(UnknownPod) as caught:
        trace_pod(
            "ml", "web", fleet={}, cluster=ClusterView(present=True), policies=(), now=T0,
            stale_after=30.0,
        )  # fmt: skip
    assert str(caught.value) == (
        "pod 'ml/web' not found: no pod of that name attaches a network "
        "(k8s.v1.cni.cncf.io/networks) or requests a device-plugin resource; a pod doing "
        "neither has no RDMA chain to trace"
    )
