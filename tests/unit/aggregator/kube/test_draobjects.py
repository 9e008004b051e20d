"""DRA API objects -> the cluster view's DRA Structs (pure): pods' resourceClaims and the
kubelet's claim health, ResourceClaims, ResourceSlices and DeviceClasses of any driver, in
the shapes the scheduler, the resourceclaim controller, the kubelet and drivers write
(k8s.io/api core/v1 and resource/v1); malformed objects and entries are skipped."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.cluster import ClaimHealth, DraClaim, DraDevice, DraResult, PodClaim
from aggregator.kube import draobjects
from aggregator.kube.draobjects import (
    claim_from_object,
    claim_health,
    claims_from,
    classes_from,
    device_class_from_object,
    devices_from,
    devices_from_slice,
    pod_claims,
)
from aggregator.kube.objects import pod_request_from_object

GPU = "gpu.nvidia.com"
RDMA = "rdma.nicfleet.io"


def claim(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "train-0-nic-x7k2p", "namespace": "ml", "uid": "u-1"},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {
            "deviceClassName": "rdma.nicfleet.io"}}]}},
        "status": status,
    }  # fmt: skip


ALLOCATION = {
    "devices": {"results": [
        {"request": "gpu", "driver": GPU, "pool": "gpu-1", "device": "gpu-0"},
        {"request": "nic", "driver": RDMA, "pool": "gpu-1", "device": "mlx5-0",
         "shareID": "5b0e8c1e-7c55-4f4d-9c1c-3c3f3c2b7f10"},
    ]},
    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}]},
    "allocationTimestamp": "2026-12-02T07:00:00Z",
}  # fmt: skip

RESERVED = [
    {"resource": "pods", "name": "train-0", "uid": "p-1"},
    {"apiGroup": "example.com", "resource": "pods", "name": "not-a-core-pod", "uid": "x"},
    {"resource": "jobs", "name": "j", "uid": "j-1"},
]


def test_an_allocated_claim_keeps_every_driver_node_and_pods() -> None:
    got = claim_from_object(claim(allocation=ALLOCATION, reservedFor=RESERVED))
    assert got == DraClaim(
        namespace="ml",
        name="train-0-nic-x7k2p",
        uid="u-1",
        spec=claim()["spec"],
        allocated=True,
        results=(
            DraResult(request="gpu", driver=GPU, pool="gpu-1", device="gpu-0"),
            DraResult(
                request="nic",
                driver=RDMA,
                pool="gpu-1",
                device="mlx5-0",
                share_id="5b0e8c1e-7c55-4f4d-9c1c-3c3f3c2b7f10",
            ),
        ),
        node="gpu-1",
        reserved_for=("ml/train-0",),
    )


def test_a_pending_claim_and_a_deleting_one() -> None:
    pending = claim_from_object(claim())
    assert pending is not None
    assert (pending.allocated, pending.results, pending.node) == (False, (), None)
    obj = claim(allocation=ALLOCATION)
    obj["metadata"]["deletionTimestamp"] = "2026-12-02T07:05:00Z"
    deleting = claim_from_object(obj)
    assert deleting is not None and deleting.deleting


@pytest.mark.parametrize(
    ("selector", "node"),
    [
        pytest.param(None, None, id="no-selector"),
        pytest.param(
            {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["a", "b"]}]}]},
            None, id="two-names",
        ),
        pytest.param(
            {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["z1"]}]}]},
            None, id="labels-only",
        ),
        pytest.param("gpu-1", None, id="not-a-mapping"),
    ],
)  # fmt: skip
def test_node_only_from_one_pinned_name(selector: object, node: str | None) -> None:
    got = claim_from_object(claim(allocation={**ALLOCATION, "nodeSelector": selector}))
    assert got is not None and got.node == node


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param("a claim", id="not-a-mapping"),
        pytest.param({"metadata": {"name": "c"}}, id="no-namespace"),
        pytest.param({"metadata": {"namespace": "ml", "name": ""}}, id="empty-name"),
        pytest.param({"metadata": ["ml", "c"]}, id="metadata-a-list"),
    ],
)
def test_claims_without_identity_are_skipped(obj: object) -> None:
    assert claim_from_object(obj) is None
    assert claims_from([obj, claim()]) == (claim_from_object(claim()),)


def test_malformed_claim_parts_are_skipped_not_raised() -> None:
    results = [
        "gpu-0",
        {"request": "nic", "driver": RDMA, "pool": "gpu-1"},  # no device
        {"request": "nic", "driver": RDMA, "pool": "gpu-1", "device": 7},
        {"request": "nic", "driver": RDMA, "pool": "gpu-1", "device": "mlx5-1", "shareID": 3},
    ]
    obj = claim(allocation={"devices": {"results": results}}, reservedFor="everyone")
    obj["spec"] = ["not", "a", "spec"]
    got = claim_from_object(obj)
    assert got is not None
    assert got.spec == {} and got.reserved_for == ()
    assert got.results == (DraResult(request="nic", driver=RDMA, pool="gpu-1", device="mlx5-1"),)


def test_results_beyond_the_api_limit_are_not_read() -> None:
    one = {"request": "nic", "driver": RDMA, "pool": "p", "device": "d"}
    got = claim_from_object(claim(allocation={"devices": {"results": [one] * 500}}))
    assert got is not None and len(got.results) == draobjects.MAX_RESULTS


def slice_(driver: str, devices: list[Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",  # list items carry no kind: none here either
        "metadata": {"name": f"gpu-1-{driver}-abcde"},
        "spec": {"driver": driver, "pool": {"name": "gpu-1", "generation": 1,
                 "resourceSliceCount": 1}, **spec, "devices": devices},
    }  # fmt: skip


GPU_DEVICE = {
    "name": "gpu-0",
    "attributes": {
        "index": {"int": 0},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "driverVersion": {"version": "570.86.15"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:3a"},
        "mig": {"bool": False},
    },
    "capacity": {"memory": {"value": "80Gi"}},
}


def test_slice_attributes_are_qualified_with_the_driver() -> None:
    (device,) = devices_from_slice(slice_(GPU, [GPU_DEVICE], nodeName="gpu-1"))
    assert device == DraDevice(
        driver=GPU,
        pool="gpu-1",
        node="gpu-1",
        name="gpu-0",
        slice="gpu-1-gpu.nvidia.com-abcde",
        attributes={
            f"{GPU}/index": 0,
            f"{GPU}/productName": "NVIDIA H100 80GB HBM3",
            f"{GPU}/driverVersion": "570.86.15",
            "resource.kubernetes.io/pcieRoot": "pci0000:3a",
            f"{GPU}/mig": False,
        },
        capacity={f"{GPU}/memory": "80Gi"},
    )


def test_a_slice_for_all_nodes_has_devices_on_no_node() -> None:
    (device,) = devices_from_slice(slice_("net.example.com", [{"name": "fabric"}], allNodes=True))
    assert (device.node, device.name) == ("", "fabric")


def test_one_bad_device_hides_no_other() -> None:
    devices = [
        {"name": "mlx5-0", "attributes": {"portState": {"string": "ACTIVE"}}},
        {"name": "mlx5-1", "attributes": {"portState": {"int": "ACTIVE"}}},  # wrong type
        {"attributes": {}},  # no name
        "mlx5-3",
        {"name": "mlx5-4", "attributes": {"rail": {}}},  # no value field
        {"name": "mlx5-5"},
    ]
    got = devices_from_slice(slice_(RDMA, devices, nodeName="gpu-1"))
    assert [d.name for d in got] == ["mlx5-0", "mlx5-5"]
    assert got[0].attributes == {f"{RDMA}/portState": "ACTIVE"}


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param([], id="not-a-mapping"),
        pytest.param(
            {"spec": {"pool": {"name": "p"}, "nodeName": "n", "devices": [{"name": "d"}]}},
            id="no-driver",
        ),
        pytest.param(
            {"spec": {"driver": RDMA, "nodeName": "n", "devices": [{"name": "d"}]}}, id="no-pool"
        ),
        pytest.param(
            {
                "spec": {
                    "driver": RDMA,
                    "pool": {"name": "p"},
                    "nodeName": "n",
                    "devices": {"name": "d"},
                }
            },
            id="devices-not-a-list",
        ),
    ],
)
def test_slices_that_do_not_parse_give_no_devices(obj: object) -> None:
    assert devices_from_slice(obj) == ()


def test_every_slice_of_a_list_sorted_and_capped() -> None:
    many = [{"name": f"d{i}"} for i in range(300)]  # over the API's 128 per slice
    items = [slice_(RDMA, many, nodeName="gpu-1"), "junk", slice_(GPU, [GPU_DEVICE],
             nodeName="gpu-1")]  # fmt: skip
    got = devices_from(items)
    assert len(got) == 1 + draobjects.MAX_SLICE_DEVICES
    assert got[0].driver == GPU and all(d.driver == RDMA for d in got[1:])


CLASS = {
    "metadata": {"name": "rdma.nicfleet.io"},
    "spec": {"selectors": [{"cel": {"expression": "device.driver == 'rdma.nicfleet.io'"}}]},
}


def test_device_classes_with_their_selectors() -> None:
    bad = {"metadata": {"name": "broken"}, "spec": {"selectors": [{"cel": {}}]}}
    nameless: dict[str, Any] = {"spec": {}}
    plain = {"metadata": {"name": "any"}}
    got = classes_from([CLASS, bad, nameless, "x", plain])
    assert [(c.name, c.selectors) for c in got] == [
        ("any", ()),
        ("rdma.nicfleet.io", ("device.driver == 'rdma.nicfleet.io'",)),
    ]
    assert device_class_from_object(bad) is None


def pod(spec: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "train-0", "namespace": "ml"},
        "spec": {"nodeName": "gpu-1", "containers": [{"name": "c", "image": "i"}], **spec},
        "status": {"phase": "Running", **status},
    }


CLAIMS = [
    {"name": "nic", "resourceClaimTemplateName": "rdma-nic"},
    {"name": "gpu", "resourceClaimName": "shared-gpu"},
    {"name": "pending", "resourceClaimTemplateName": "rdma-nic"},
]
STATUSES = [
    {"name": "nic", "resourceClaimName": "train-0-nic-x7k2p"},
    {"name": "pending"},  # the controller decided no claim is needed / not yet made
]


def test_a_pod_with_only_resource_claims_is_listed() -> None:
    got = pod_request_from_object(
        pod({"resourceClaims": CLAIMS}, {"resourceClaimStatuses": STATUSES}), ("rdma/",)
    )
    assert got is not None
    assert got.requests == {} and got.networks == ()
    assert got.claims == (
        PodClaim(name="nic", claim="train-0-nic-x7k2p", template="rdma-nic"),
        PodClaim(name="gpu", claim="shared-gpu"),
        PodClaim(name="pending", template="rdma-nic"),
    )


def test_a_pod_without_claims_requests_or_networks_is_not_listed() -> None:
    assert pod_request_from_object(pod({"resourceClaims": []}, {}), ("rdma/",)) is None


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param("nic", id="not-a-mapping"),
        pytest.param({"resourceClaimName": "c"}, id="no-name"),
        pytest.param({"name": "x"}, id="no-source"),
        pytest.param(
            {"name": "x", "resourceClaimName": "c", "resourceClaimTemplateName": "t"},
            id="two-sources",
        ),
        pytest.param({"name": "gpu", "resourceClaimName": "again"}, id="duplicate-name"),
        pytest.param({"name": 5, "resourceClaimName": "c"}, id="name-not-a-string"),
    ],
)
def test_malformed_claim_entries_are_skipped(entry: object) -> None:
    spec = {"resourceClaims": [{"name": "gpu", "resourceClaimName": "shared-gpu"}, entry]}
    assert pod_claims(spec, {"resourceClaimStatuses": "junk"}) == (
        PodClaim(name="gpu", claim="shared-gpu"),
    )


def test_claim_health_of_containers_and_init_containers() -> None:
    nic_id = f"{RDMA}/gpu-1/mlx5-0"
    status = {
        "initContainerStatuses": [{"name": "warmup", "allocatedResourcesStatus": [
            {"name": "claim:nic", "resources": [{"resourceID": nic_id, "health": "Healthy"}]},
        ]}],
        "containerStatuses": [{"name": "c", "allocatedResourcesStatus": [
            {"name": "nvidia.com/gpu", "resources": [{"resourceID": "GPU-1", "health": "Healthy"}]},
            {"name": "claim:nic/ib", "resources": [
                {"resourceID": nic_id, "health": "Unhealthy"},
                {"resourceID": f"{RDMA}/gpu-1/mlx5-1"},  # health omitted
                {"resourceID": f"{RDMA}/gpu-1/mlx5-2", "health": "Dead"},
                {"health": "Healthy"},  # no id
                "mlx5-3",
            ]},
            {"name": "claim:", "resources": [{"resourceID": nic_id, "health": "Healthy"}]},
            "junk",
        ]}, {"allocatedResourcesStatus": []}],
    }  # fmt: skip
    assert claim_health(status) == (
        ClaimHealth(container="warmup", entry="nic", resource_id=nic_id, health="Healthy"),
        ClaimHealth(
            container="c", entry="nic", request="ib", resource_id=nic_id, health="Unhealthy"
        ),
        ClaimHealth(
            container="c",
            entry="nic",
            request="ib",
            resource_id=f"{RDMA}/gpu-1/mlx5-1",
            health="Unknown",
        ),
        ClaimHealth(
            container="c",
            entry="nic",
            request="ib",
            resource_id=f"{RDMA}/gpu-1/mlx5-2",
            health="Unknown",
        ),
    )
    got = pod_request_from_object(pod({"resourceClaims": CLAIMS[:1]}, status), ("rdma/",))
    assert got is not None and len(got.claim_health) == 4


def test_claim_health_of_a_pod_with_garbage_status_is_empty() -> None:
    assert claim_health({"containerStatuses": {"c": 1}, "initContainerStatuses": 3}) == ()


def test_claim_health_of_one_pod_is_capped_in_all() -> None:
    """Each list within its cap, the product is not: containers x entries x devices."""
    resources = [
        {"resourceID": f"{RDMA}/gpu-1/mlx5-{i}", "health": "Healthy"}
        for i in range(draobjects.MAX_HEALTH_ENTRIES)
    ]
    entries = [
        {"name": f"claim:e{j}", "resources": resources}
        for j in range(draobjects.MAX_HEALTH_ENTRIES)
    ]
    status = {
        "containerStatuses": [
            {"name": f"c{k}", "allocatedResourcesStatus": entries}
            for k in range(draobjects.MAX_POD_CLAIMS)
        ]
    }
    found = claim_health(status)
    assert len(found) == draobjects.MAX_POD_HEALTH
    assert found[0] == ClaimHealth(
        container="c0", entry="e0", resource_id=f"{RDMA}/gpu-1/mlx5-0", health="Healthy"
    )
