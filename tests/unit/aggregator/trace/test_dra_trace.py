"""A pod claim's DRA chain, link by link (pure, views built by hand): claim, slice
published, device healthy, claim allocated (with the explanation of a pending one),
prepared, pod."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
import pytest

from aggregator.cluster import ClaimHealth, ClusterView, PodClaim, PodRequest
from aggregator.fleet.state import NodeRecord
from aggregator.trace.dra import CLAIM_LINK_NAMES, trace_claims
from proto.dranames import DRIVER
from proto.http import Link, Trace
from proto.messages.status import DraClaimState, DraPluginStatus
from tests.support.builders import T0
from tests.unit.aggregator.trace import drafixtures as fx


def chain(
    pod: PodRequest | None = None,
    cluster: ClusterView | None = None,
    fleet: Mapping[str, NodeRecord] | None = None,
    *,
    now: float = T0 + 5,
) -> Trace:
    (found,) = trace_claims(
        pod or fx.pod(), fleet=fleet if fleet is not None else fx.fleet(),
        cluster=cluster or fx.cluster(), now=now, stale_after=30.0,
    )  # fmt: skip
    return found


def link(trace: Trace, name: str) -> Link:
    return trace.links[CLAIM_LINK_NAMES.index(name)]


def statuses(trace: Trace) -> dict[str, str]:
    return {item.name: item.status for item in trace.links}


def test_an_allocated_healthy_prepared_claim_is_an_ok_chain() -> None:
    result = chain()
    assert [item.name for item in result.links] == list(CLAIM_LINK_NAMES)
    assert (result.resource, result.node, result.verdict, result.ok) == (
        "claim/nic", "gpu-ib-01", "ok", True,
    )  # fmt: skip
    assert (result.first_broken, result.verdict_reason) == (None, "every link holds")
    assert link(result, "slice-published").evidence["slices"] == {
        "mlx5-0": f"gpu-ib-01-{DRIVER.replace('.', '-')}-0"
    }
    assert link(result, "claim-allocated").evidence["devices"] == {
        "nic": [f"{DRIVER}/gpu-ib-01/mlx5-0"]
    }
    assert link(result, "prepared").evidence["cdi_ids"] == ["rdma.nicfleet.io/claim=u-1"]


def test_a_template_claim_not_generated_yet_is_broken_at_claim() -> None:
    waiting = fx.pod(claims=(PodClaim(name="nic", template="nic-tpl"),))
    result = chain(waiting)
    assert (result.verdict, result.first_broken) == ("broken", 0)
    first = result.links[0]
    assert first.cause == (
        "the resourceclaim controller has not created the claim of template ml/nic-tpl for ml/w-0"
    )
    assert first.fix is not None and "kubectl get resourceclaimtemplate -n ml nic-tpl" in first.fix
    assert set(statuses(result).values()) - {"broken"} == {"unknown"}


@pytest.mark.parametrize(
    ("cluster", "status", "cause"),
    [
        pytest.param(
            fx.cluster(msgspec.structs.replace(fx.claim(), name="other")), "broken",
            "ResourceClaim ml/w-0-nic not found: the pod cannot start without it",
            id="not-found",
        ),
        pytest.param(
            fx.cluster(fx.claim(deleting=True)), "broken",
            "ResourceClaim ml/w-0-nic is being deleted", id="deleting",
        ),
        pytest.param(
            msgspec.structs.replace(fx.cluster(), dra_present=False), "unknown", None,
            id="no-dra-api",
        ),
    ],
)  # fmt: skip
def test_the_claim_link_says_whether_the_claim_is_there(
    cluster: ClusterView, status: str, cause: str | None
) -> None:
    first = chain(cluster=cluster).links[0]
    assert (first.name, first.status, first.cause) == ("claim", status, cause)


def test_a_device_whose_port_is_down_breaks_device_healthy() -> None:
    snaps = fx.nodes() | {
        "gpu-ib-01": fx.node_snapshot("gpu-ib-01", fx.adapter("mlx5_0", 0, state="DOWN"))
    }
    result = chain(cluster=fx.cluster(snaps=snaps), fleet=fx.fleet(snaps=snaps))
    healthy = link(result, "device-healthy")
    assert (healthy.status, healthy.cause) == (
        "broken", "the claim's devices are unhealthy (mlx5-0: port DOWN)",
    )  # fmt: skip
    assert healthy.fix is not None and healthy.fix.startswith("bring the port up")
    assert result.verdict_reason == f"link 2 (device-healthy): {healthy.cause}"


def test_one_of_two_devices_down_is_degraded_naming_it() -> None:
    snaps = fx.nodes() | {
        "gpu-ib-01": fx.node_snapshot(
            "gpu-ib-01", fx.adapter("mlx5_0", 0), fx.adapter("mlx5_1", 1, state="DOWN")
        )
    }
    two = fx.claim(results=(fx.result("mlx5-0"), fx.result("mlx5-1")))
    result = chain(cluster=fx.cluster(two, snaps=snaps), fleet=fx.fleet(snaps=snaps))
    healthy = link(result, "device-healthy")
    assert (healthy.status, healthy.cause) == (
        "degraded", "1 of 2 of the claim's devices unhealthy (mlx5-1: port DOWN)",
    )  # fmt: skip
    assert healthy.evidence["degraded_adapters"] == ["mlx5_1"]
    assert (result.verdict, result.verdict_reason) == (
        "degraded", "capacity reduced on mlx5_1 (device-healthy)",
    )  # fmt: skip


def test_a_silent_agent_makes_its_devices_unhealthy() -> None:
    silent = fx.fleet()
    silent["gpu-ib-01"] = msgspec.structs.replace(silent["gpu-ib-01"], last_seen=T0 - 120)
    healthy = link(chain(fleet=silent), "device-healthy")
    assert healthy.status == "broken"
    assert healthy.cause is not None and "the node's agent is silent" in healthy.cause


def test_the_kubelets_unhealthy_report_counts() -> None:
    sick = ClaimHealth(
        container="main", entry="nic", resource_id=f"{DRIVER}/gpu-ib-01/mlx5-0", health="Unhealthy"
    )
    result = chain(fx.pod(claim_health=(sick,)))
    healthy = link(result, "device-healthy")
    assert (healthy.status, healthy.cause) == (
        "broken",
        "the claim's devices are unhealthy (mlx5-0: the kubelet reports it Unhealthy (main))",
    )
    assert healthy.evidence["devices"]["mlx5-0"]["kubelet_unhealthy"] == ["main"]
    pod = link(result, "pod")
    assert pod.status == "degraded" and pod.evidence["degraded_adapters"] == ["mlx5_0"]


def pending(spec: dict[str, Any] | None = None) -> tuple[PodRequest, ClusterView]:
    """ml/w-0 pending with its claim unallocated; the only node, gpu-ib-02, has its IB
    adapter DOWN and a RoCE one up (which the ib class's linkLayer selector refuses)."""
    snaps = {
        "gpu-ib-02": fx.node_snapshot(
            "gpu-ib-02",
            fx.adapter("mlx5_0", 0, state="DOWN"),
            fx.adapter("mlx5_1", 1, link="Ethernet"),
        )
    }
    claim = fx.claim(
        spec=spec or fx.NIC_SPEC, allocated=False, results=(), node=None, reserved_for=()
    )
    pod = fx.pod(node=None, phase="Pending")
    return pod, fx.cluster(claim, snaps=snaps, pods=(pod,))


def test_a_pending_claim_is_explained_by_the_closest_nodes_failing_reason() -> None:
    pod, cluster = pending()
    result = chain(pod, cluster, fx.fleet(snaps={}))
    assert result.node == ""
    allocated = link(result, "claim-allocated")
    assert (allocated.status, allocated.cause) == (
        "broken",
        "no node can allocate the claim; closest, gpu-ib-02: request nic: needs 1 device of "
        f"class ib.{DRIVER}, 0 allocatable on gpu-ib-02; mlx5-0 port DOWN; "
        f"class ib.{DRIVER} selector #0 rejects mlx5-1",
    )
    assert allocated.evidence["closest"] == "gpu-ib-02"
    assert statuses(result) == {
        "claim": "ok", "slice-published": "ok", "device-healthy": "unknown",
        "claim-allocated": "broken", "prepared": "unknown", "pod": "unknown",
    }  # fmt: skip
    assert link(result, "slice-published").evidence == {"nodes_count": 1, "nodes": ["gpu-ib-02"]}


def test_a_pending_claim_without_any_slice_of_ours_is_broken_at_slice_published() -> None:
    pod, cluster = pending()
    gpus_only = msgspec.structs.replace(cluster, dra_devices=(fx.gpu("gpu-ib-02"),))
    published = link(chain(pod, gpus_only), "slice-published")
    assert (published.status, published.cause) == (
        "broken",
        f"no ResourceSlice of {DRIVER} in the cluster: run the aggregator with --dra-publish",
    )


def _spec(exactly: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "nic", "exactly": exactly}]}}


@pytest.mark.parametrize(
    ("spec", "cause"),
    [
        pytest.param(
            _spec({"deviceClassName": fx.IB_CLASS, "count": 99}),
            "the claim's spec is invalid: claim.spec.devices.requests[0].exactly.count: 99 is "
            "not an integer in 1..32",
            id="count",
        ),
        pytest.param(
            _spec({"deviceClassName": fx.IB_CLASS,
                   "selectors": [{"cel": {"expression": "device.driver =="}}]}),
            "the claim's spec is invalid: request nic selector #0: CEL expression "
            "'device.driver ==' does not compile",
            id="cel",
        ),
        pytest.param(
            {"devices": {"requests": [
                {"name": "nic", "exactly": {"deviceClassName": "fpga.example.com"}},
                {"name": "ib", "exactly": {"deviceClassName": fx.IB_CLASS}},
            ]}},
            "request nic names DeviceClass fpga.example.com, which the cluster does not have: "
            "the claim cannot be allocated",
            id="no-such-class",
        ),
    ],
)  # fmt: skip
def test_an_invalid_claim_spec_is_broken_naming_where(spec: dict[str, Any], cause: str) -> None:
    pod, cluster = pending(spec)
    allocated = link(chain(pod, cluster), "claim-allocated")
    assert allocated.status == "broken"
    assert allocated.cause is not None and allocated.cause.startswith(cause)


def test_an_agent_without_the_dra_plugin_breaks_prepared() -> None:
    plain = {n: fx.record(s, None) for n, s in fx.nodes().items()}
    prepared = link(chain(fleet=plain), "prepared")
    assert (prepared.status, prepared.cause, prepared.fix) == (
        "broken",
        f"the agent on gpu-ib-01 does not run the DRA plugin: nothing prepares {DRIVER} "
        "claims there",
        "run the agent with --dra (deploy/overlays/dra)",
    )


def test_a_failed_prepare_carries_the_agents_error() -> None:
    error = "mlx5_0: /dev/infiniband/uverbs0 missing"
    failed = DraPluginStatus(
        state="registered",
        failed=(DraClaimState(uid="u-1", namespace="ml", name="w-0-nic", error=error, at=T0),),
    )
    result = chain(fx.pod(phase="Pending"), fleet=fx.fleet(failed))
    prepared = link(result, "prepared")
    assert (prepared.status, prepared.cause) == (
        "broken", f"the agent on gpu-ib-01 failed to prepare the claim: {error}",
    )  # fmt: skip
    assert result.first_broken == CLAIM_LINK_NAMES.index("prepared")
    assert link(result, "pod").evidence["phase"] == "Pending"


@pytest.mark.parametrize(
    ("dra", "phase", "status", "said"),
    [
        pytest.param(DraPluginStatus(state="retrying", error="kubelet gone"), "Pending",
                     "broken", "is not registered with the kubelet (retrying: kubelet gone)",
                     id="unregistered"),
        # A running pod's claim was prepared; a plugin re-registering does not break it.
        pytest.param(DraPluginStatus(state="waiting"), "Running", "unknown",
                     "not reported by the agent", id="running-plugin-re-registering"),
        pytest.param(DraPluginStatus(state="registered"), "Running", "unknown",
                     "not reported by the agent", id="running-not-reported"),
        pytest.param(DraPluginStatus(state="registered"), "Pending", "unknown",
                     "the kubelet has not asked yet", id="pending-not-asked"),
    ],
)  # fmt: skip
def test_prepared_says_what_the_plugin_reports(
    dra: DraPluginStatus, phase: str, status: str, said: str
) -> None:
    prepared = link(chain(fx.pod(phase=phase), fleet=fx.fleet(dra)), "prepared")
    assert prepared.status == status
    assert said in (prepared.cause or prepared.evidence["reason"])


def test_a_claim_not_reserved_for_the_pod_breaks_the_pod_link() -> None:
    cluster = fx.cluster(fx.claim(reserved_for=("ml/other",)))
    result = chain(fx.pod(phase="Pending"), cluster=cluster)
    pod = link(result, "pod")
    assert (pod.status, pod.cause) == (
        "broken", "the claim is not reserved for the pod: w-0-nic's reservedFor lists ml/other",
    )  # fmt: skip
    assert result.verdict == "broken"
    # Running, the pod was reserved (the kubelet prepares only then): an older claim list.
    running = link(chain(fx.pod(phase="Running"), cluster=cluster), "pod")
    assert running.status == "unknown"
    assert "listed before its reservation" in running.evidence["reason"]


def test_a_withdrawn_device_is_not_in_any_slice_of_its_pool() -> None:
    cluster = fx.cluster(fx.claim(results=(fx.result("mlx5-3"),)))
    published = link(chain(cluster=cluster), "slice-published")
    assert published.status == "broken"
    assert published.cause is not None and published.cause.startswith(
        "mlx5-3 is not in any ResourceSlice of pool gpu-ib-01: the publisher (aggregator "
        "--dra-publish)"
    )


@pytest.mark.parametrize(
    ("root", "status"),
    [pytest.param(fx.ROOT, "ok", id="holds"), pytest.param("pci0000:99", "degraded", id="broken")],
)
def test_an_allocated_gpu_and_nic_claim_checks_match_attribute(root: str, status: str) -> None:
    both = fx.claim(
        spec=fx.GPU_NIC_SPEC,
        results=(
            msgspec.structs.replace(fx.result(request="gpu"), driver=fx.GPU_DRIVER, device="gpu-0"),
            fx.result(),
        ),
    )
    cluster = fx.cluster(both)
    cluster = msgspec.structs.replace(
        cluster, dra_devices=(*cluster.dra_devices, fx.gpu("gpu-ib-01", root=root))
    )
    allocated = link(chain(cluster=cluster), "claim-allocated")
    assert allocated.status == status
    assert allocated.evidence["devices"] == {
        "gpu": [f"{fx.GPU_DRIVER}/gpu-ib-01/gpu-0"], "nic": [f"{DRIVER}/gpu-ib-01/mlx5-0"],
    }  # fmt: skip
    check = allocated.evidence["constraints"]["resource.kubernetes.io/pcieRoot"]
    assert check == {"holds": status == "ok", "values": {"gpu-0": root, "mlx5-0": fx.ROOT}}


def test_a_pool_not_named_after_its_node_is_read_on_the_slices_node() -> None:
    """The device's node is its slice's nodeName: a healthy device in a pool named
    otherwise is not 'no inventory from an agent on <pool>'."""
    cluster = fx.cluster(fx.claim(results=(fx.result(pool="rack-7"),)))
    renamed = tuple(
        msgspec.structs.replace(d, pool="rack-7") if d.node == "gpu-ib-01" else d
        for d in cluster.dra_devices
    )
    cluster = msgspec.structs.replace(cluster, dra_devices=renamed)
    result = chain(cluster=cluster)
    healthy = link(result, "device-healthy")
    assert healthy.status == "ok", healthy.cause
    assert healthy.evidence["devices"]["mlx5-0"]["node"] == "gpu-ib-01"
    assert result.verdict == "ok"


def test_the_plugins_unhealthy_list_is_quoted_for_the_claims_devices_only() -> None:
    """An agent's `unhealthy` map is as long as it makes it: the trace quotes the claim's
    own devices from their own node's record, nothing else."""
    flood = {f"mlx5-{i}": "port DOWN" for i in range(1, 5000)}
    fleet = fx.fleet()
    fleet["gpu-ib-01"] = fx.record(
        fx.nodes()["gpu-ib-01"],
        msgspec.structs.replace(fx.prepared(), unhealthy=flood),
    )
    fleet["gpu-ib-02"] = fx.record(
        fx.nodes()["gpu-ib-02"],
        msgspec.structs.replace(fx.prepared(), unhealthy={"mlx5-0": "forged"}),
    )
    healthy = link(chain(fleet=fleet), "device-healthy")
    assert (healthy.status, healthy.evidence["agent_unhealthy"]) == ("ok", {})
    fleet["gpu-ib-01"] = fx.record(
        fx.nodes()["gpu-ib-01"],
        msgspec.structs.replace(fx.prepared(), unhealthy={**flood, "mlx5-0": "port DOWN"}),
    )
    said = link(chain(fleet=fleet), "device-healthy").evidence["agent_unhealthy"]
    assert said == {"mlx5-0": "port DOWN"}


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pods_released_claim_is_not_a_fault(phase: str) -> None:
    """Once the pod is done the controller unreserves its claim (and deletes a template's),
    the kubelet unprepares it: nothing of that breaks the chain."""
    done = fx.pod(phase=phase)
    unreserved = chain(
        done,
        cluster=fx.cluster(fx.claim(reserved_for=())),
        fleet=fx.fleet(DraPluginStatus(state="registered")),
    )
    assert unreserved.verdict != "broken", unreserved.verdict_reason
    assert statuses(unreserved)["pod"] == statuses(unreserved)["prepared"] == "unknown"
    assert phase in link(unreserved, "pod").evidence["reason"]
    gone = chain(done, cluster=fx.cluster(msgspec.structs.replace(fx.claim(), name="other")))
    assert (gone.verdict, statuses(gone)["claim"]) == ("unknown", "unknown")
    deleting = chain(done, cluster=fx.cluster(fx.claim(deleting=True)))
    assert statuses(deleting)["claim"] == "unknown"
    # A pod still running with its claim gone is broken as before.
    assert chain(cluster=fx.cluster(fx.claim(deleting=True))).verdict == "broken"
