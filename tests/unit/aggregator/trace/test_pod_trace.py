"""One pod's own chain (pure): scheduled on a healthy node, on a broken one, pending with
the scheduler's reason, bound to a node that no longer offers the resource, unknown."""

from __future__ import annotations

import msgspec
import pytest

from aggregator.cluster import ClusterView, PodRequest
from aggregator.trace.chain import LINK_NAMES
from aggregator.trace.pod import UnknownPod, trace_pod
from proto.http import PodTrace
from tests.support.builders import T0, rdma_policy
from tests.support.chain_fixtures import RES, chain_fleet
from tests.support.pod_trace_fixtures import pod_cluster


def traced(name: str, cluster: ClusterView | None = None) -> PodTrace:
    return trace_pod(
        "ml", name, fleet=chain_fleet().view(), cluster=cluster or pod_cluster(),
        policies=(rdma_policy("ib", RES),), now=T0 + 5, stale_after=30.0,
    )  # fmt: skip


def test_a_pod_on_a_healthy_node_has_its_whole_chain_ok() -> None:
    result = traced("t-0")
    assert (result.node, result.phase, result.requests, result.ok) == (
        "gpu-001", "Running", {RES: 1}, True,
    )  # fmt: skip
    assert result.scheduling.status == "ok"
    (chain,) = result.traces
    assert [link.name for link in chain.links] == list(LINK_NAMES)
    scheduling = chain.links[LINK_NAMES.index("scheduling")]
    assert scheduling.evidence["pod"] == "ml/t-0"  # the pod's own link, not the node's
    assert chain.components is not None and chain.components.status == "ok"


def test_a_pod_on_a_broken_node_names_the_first_broken_link() -> None:
    result = traced("t-2")
    assert (result.node, result.ok) == ("gpu-002", False)
    (chain,) = result.traces
    assert chain.first_broken is not None
    assert chain.links[chain.first_broken].name == "rdma-device"


def test_a_pending_pod_is_broken_at_scheduling_with_the_schedulers_reason() -> None:
    result = traced("t-9")
    assert (result.node, result.ok, result.traces) == (None, False, ())
    link = result.scheduling
    assert (link.status, link.cause) == (
        "broken", "ml/t-9 is not scheduled: 0/2 nodes are available: 2 Insufficient rdma/ib",
    )  # fmt: skip
    assert link.fix is not None and "nicfleetctl resources --name rdma/ib" in link.fix
    assert link.evidence["count"] == 4


def test_a_resource_gone_from_the_node_is_one_broken_link() -> None:
    gone = PodRequest(
        namespace="ml", name="old", node="gpu-001", phase="Running", requests={"rdma/old": 1}
    )
    cluster = msgspec.structs.replace(pod_cluster(), pods=(gone,))
    (chain,) = traced("old", cluster).traces
    assert (chain.ok, chain.first_broken, chain.links[0].name) == (False, 0, "device-plugin")
    assert chain.links[0].cause is not None and "'rdma/old'" in chain.links[0].cause


def test_an_unknown_pod_names_itself_and_close_names() -> None:
    with pytest.raises(UnknownPod) as caught:
        traced("t-00")
    assert str(caught.value).startswith("pod 'ml/t-00' not found: no pod of that name attaches")
    assert caught.value.suggestions[0] == "ml/t-0"
    with pytest.raises(UnknownPod, match="has no Kubernetes API"):
        traced("t-0", ClusterView())
