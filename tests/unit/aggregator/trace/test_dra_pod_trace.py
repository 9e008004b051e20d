"""`trace_pod` for pods with spec.resourceClaims (pure): a pod with only claims is traced,
a pending one still gets its claim chains, a GPU-only claim is listed as untraced, and a
broken claim chain makes the pod's trace not ok."""

from __future__ import annotations

from aggregator.cluster import ClusterView, DraResult, PodClaim, PodRequest
from aggregator.trace.pod import trace_pod
from proto.http import PodTrace
from tests.support.builders import T0
from tests.unit.aggregator.trace import drafixtures as fx


def traced(pod: PodRequest, cluster: ClusterView | None = None) -> PodTrace:
    view = cluster or fx.cluster(pods=(pod,))
    return trace_pod(
        pod.namespace, pod.name, fleet=fx.fleet(), cluster=view, policies=(), now=T0 + 5,
        stale_after=30.0,
    )  # fmt: skip


def test_a_pod_with_only_claims_is_traced() -> None:
    result = traced(fx.pod())
    assert (result.requests, result.traces, result.untraced) == ({}, (), {})
    (claim,) = result.claims
    assert (claim.resource, claim.verdict) == ("claim/nic", "ok")
    assert (result.ok, result.no_chain) == (True, None)


def test_a_broken_claim_chain_makes_the_pod_not_ok() -> None:
    waiting = fx.pod(claims=(PodClaim(name="nic", template="nic"),))
    result = traced(waiting)
    (claim,) = result.claims
    assert (claim.verdict, claim.first_broken, result.ok) == ("broken", 0, False)


def test_a_gpu_only_claim_is_untraced_with_a_reason() -> None:
    gpu_claim = fx.claim(
        name="w-0-gpu",
        spec=fx.GPU_SPEC,
        results=(DraResult(request="gpu", driver=fx.GPU_DRIVER, pool="gpu-ib-01", device="gpu-0"),),
    )
    pod = fx.pod(claims=(PodClaim(name="gpu", claim="w-0-gpu"),))
    result = traced(pod, fx.cluster(gpu_claim, pods=(pod,)))
    assert result.claims == ()
    assert result.untraced == {
        "claim/gpu": "ResourceClaim ml/w-0-gpu asks for no rdma.nicfleet.io device "
        "(DeviceClass gpu.nvidia.com): another driver's, whose chain nicfleet does not trace"
    }
    assert result.no_chain is not None and result.no_chain.startswith(
        "ml/w-0 requests no device-plugin resource and its claims (gpu) ask for no "
        "rdma.nicfleet.io device: there is no RDMA chain to trace"
    )


def test_a_gpu_and_a_nic_claim_trace_only_the_nic() -> None:
    gpu_claim = fx.claim(name="w-0-gpu", uid="u-2", spec=fx.GPU_SPEC, results=())
    pod = fx.pod(
        claims=(PodClaim(name="gpu", claim="w-0-gpu"), PodClaim(name="nic", claim="w-0-nic"))
    )
    result = traced(pod, fx.cluster(gpu_claim, fx.claim(), pods=(pod,)))
    assert [c.resource for c in result.claims] == ["claim/nic"]
    assert list(result.untraced) == ["claim/gpu"]


def test_a_pending_pod_still_gets_its_claim_chain() -> None:
    claim = fx.claim(allocated=False, results=(), node=None, reserved_for=())
    pod = fx.pod(node=None, phase="Pending")
    result = traced(pod, fx.cluster(claim, pods=(pod,)))
    assert (result.node, result.traces, result.no_chain) == (None, (), None)
    (chain,) = result.claims
    assert chain.node == ""
    by_name = {link.name: link for link in chain.links}
    # Both nodes have mlx5-0 ACTIVE: it fits, the scheduler just has not placed the pod.
    assert by_name["claim-allocated"].status == "broken"
    assert by_name["claim-allocated"].evidence["fits"] == ["gpu-ib-01", "gpu-ib-02"]
    assert by_name["prepared"].evidence["reason"] == "the claim is not allocated to a node yet"
