"""The claim explainer on hand-built slices: which node can allocate, and the reason a
node cannot (health, counts, CEL, matchAttribute across drivers)."""

from __future__ import annotations

import pytest

from aggregator.dra import builtin
from aggregator.dra.celenv import CelCompileError
from aggregator.dra.explain import Explanation, NodeResult, explain
from aggregator.dra.objects import DeviceClass, InvalidObject, Selector
from tests.unit.aggregator.dra.builders import (
    GPU,
    NIC,
    claim,
    devices,
    gpu,
    nic,
    request,
    slice_doc,
)

GPU_CLASS = DeviceClass(
    GPU,
    (
        Selector(
            f"device.driver == '{GPU}' && device.attributes['{GPU}'].type == 'gpu'", "class gpu"
        ),
    ),
)
CLASSES = {**{c.name: c for c in builtin.CLASSES}, GPU: GPU_CLASS}
IB = f"ib.{NIC}"
ROOT = "resource.kubernetes.io/pcieRoot"
FLEET = devices(
    slice_doc("gpu-ib-01", GPU, gpu("gpu-0", "pci0000:3a")),
    slice_doc("gpu-ib-01", NIC, nic("mlx5-0", "pci0000:3a"), nic("mlx5-1", "pci0000:9a")),
    slice_doc("gpu-ib-02", GPU, gpu("gpu-0", "pci0000:3a")),
    slice_doc(
        "gpu-ib-02", NIC, nic("mlx5-3", "pci0000:3a", state="DOWN"), nic("mlx5-4", "pci0000:9a")
    ),
)
GPU_NIC = claim(
    request("gpu", GPU),
    request("nic", IB),
    constraints=[{"requests": ["gpu", "nic"], "matchAttribute": ROOT}],
)


def by_node(explanation: Explanation) -> dict[str, NodeResult]:
    return {n.node: n for n in explanation.nodes}


def test_gpu_and_nic_under_one_root_ok_on_one_node_and_why_not_on_the_other() -> None:
    got = by_node(explain(GPU_NIC, CLASSES, FLEET))
    assert got["gpu-ib-01"].ok
    assert [r.devices for r in got["gpu-ib-01"].requests] == [("gpu-0",), ("mlx5-0",)]
    node = got["gpu-ib-02"]
    assert not node.ok
    gpu_row, nic_row = node.requests
    assert gpu_row.ok and not nic_row.ok
    assert "pcieRoot of request gpu (pci0000:3a: gpu-0) on gpu-ib-02" in nic_row.why
    assert "mlx5-3 port DOWN" in nic_row.why


def test_without_the_constraint_the_other_root_will_do() -> None:
    free = claim(request("gpu", GPU), request("nic", IB))
    got = by_node(explain(free, CLASSES, FLEET))
    assert got["gpu-ib-02"].ok
    assert got["gpu-ib-02"].requests[1].devices == ("mlx5-4",)


@pytest.mark.parametrize(
    ("count", "ok01", "ok02"),
    [
        pytest.param(1, True, True, id="one"),
        pytest.param(2, True, False, id="two"),
        pytest.param(3, False, False, id="too-many"),
    ],
)
def test_count(count: int, ok01: bool, ok02: bool) -> None:
    got = by_node(explain(claim(request("nics", IB, count=count)), CLASSES, FLEET))
    assert (got["gpu-ib-01"].ok, got["gpu-ib-02"].ok) == (ok01, ok02)
    if not ok02:
        why = got["gpu-ib-02"].requests[0].why
        assert f"needs {count} devices of class {IB}, 1 allocatable on gpu-ib-02" in why
        assert "mlx5-3 port DOWN" in why


def test_allocation_mode_all_takes_the_devices_the_class_keeps() -> None:
    # nicfleet's classes pass over a port that is not ACTIVE: All is every ACTIVE device.
    got = by_node(explain(claim(request("nics", IB, allocationMode="All")), CLASSES, FLEET))
    assert got["gpu-ib-01"].requests[0].devices == ("mlx5-0", "mlx5-1")
    ib02 = got["gpu-ib-02"]
    assert ib02.ok and "mlx5-3" not in ib02.requests[0].devices


def test_a_class_without_a_port_state_selector_allocates_a_down_device() -> None:
    # What the scheduler does: a DOWN device the selectors keep is allocatable (the
    # dra-claim-unhealthy-device rule then fires); explain says so rather than refusing it.
    link_layer = CLASSES[IB].selectors[0]  # ib.rdma.nicfleet.io without its portState one
    bare = DeviceClass("any-ib", (Selector(link_layer.expression, "class any-ib selector #0"),))
    got = by_node(explain(claim(request("nic", "any-ib", count=2)), {**CLASSES, "any-ib": bare},
                          FLEET))  # fmt: skip
    assert got["gpu-ib-02"].ok
    assert got["gpu-ib-02"].requests[0].devices == ("mlx5-3", "mlx5-4")


def test_request_selector_names_itself_when_it_rejects() -> None:
    fast = claim(request("nic", IB, 'device.attributes["rdma.nicfleet.io"].rateGbps > 400'))
    got = explain(fast, CLASSES, FLEET)
    assert not got.allocatable
    assert "request nic selector #0 rejects mlx5-0, mlx5-1" in got.nodes[0].requests[0].why


def test_cel_syntax_error_names_request_and_expression() -> None:
    bad = claim(request("nic", IB, "device.driver == "))
    with pytest.raises(
        CelCompileError, match=r"request nic selector #0: CEL expression 'device.driver == '"
    ):
        explain(bad, CLASSES, FLEET)


def test_cel_runtime_error_fails_the_node_and_names_the_device() -> None:
    # no `has()`: a GPU has no linkLayer, and the scheduler stops at the error
    bad = claim(request("any", NIC, 'device.attributes["rdma.nicfleet.io"].nope == 1'))
    got = explain(bad, CLASSES, FLEET)
    assert not got.allocatable
    assert "no such key: nope" in got.nodes[0].requests[0].why
    assert "request any selector #0" in got.nodes[0].requests[0].why


def test_an_unknown_domain_reads_as_empty_as_in_kubernetes() -> None:
    guarded = claim(request("nic", IB, 'has(device.attributes["example.com"].x) == false'))
    assert explain(guarded, CLASSES, FLEET).allocatable


def test_match_attribute_across_three_requests() -> None:
    fleet = devices(
        slice_doc(
            "n1",
            NIC,
            nic("mlx5-0", "pci0000:3a"),
            nic("mlx5-1", "pci0000:3a", link="Ethernet"),
            nic("mlx5-2", "pci0000:9a", link="Ethernet"),
        ),
    )
    three = claim(
        request("ib", IB),
        request("roce", f"roce.{NIC}"),
        request("any", NIC),
        constraints=[{"matchAttribute": ROOT}],
    )
    got = explain(three, CLASSES, fleet)
    assert not got.allocatable  # only two devices share pci0000:3a
    two = claim(
        request("ib", IB), request("roce", f"roce.{NIC}"), constraints=[{"matchAttribute": ROOT}]
    )
    assert [r.devices for r in explain(two, CLASSES, fleet).nodes[0].requests] == [
        ("mlx5-0",),
        ("mlx5-1",),
    ]


def test_capacity_quantities_and_other_drivers_devices() -> None:
    big = claim(
        request("gpu", GPU, f'device.capacity["{GPU}"].memory.compareTo(quantity("40Gi")) >= 0')
    )
    assert explain(big, CLASSES, FLEET).allocatable
    huge = claim(request("gpu", GPU, f'device.capacity["{GPU}"].memory > quantity("100Gi")'))
    assert not explain(huge, CLASSES, FLEET).allocatable


def test_first_available_takes_the_first_subrequest_that_fits() -> None:
    spec = {
        "name": "nic",
        "firstAvailable": [
            {"name": "fast", "deviceClassName": IB, "count": 2},
            {"name": "one", "deviceClassName": IB},
        ],
    }
    got = by_node(explain(claim(spec), CLASSES, FLEET))
    assert "subrequest nic/fast" in got["gpu-ib-01"].requests[0].why
    assert got["gpu-ib-02"].requests[0].why == "would get mlx5-4 (subrequest nic/one)"


def test_nic_class_rejections_do_not_list_gpus() -> None:
    got = by_node(explain(claim(request("nics", IB, count=2)), CLASSES, FLEET))
    assert "gpu-0" not in got["gpu-ib-02"].requests[0].why


def test_a_class_not_given_is_bad_input() -> None:
    with pytest.raises(InvalidObject, match="deviceClassName 'nope': no such DeviceClass"):
        explain(claim(request("x", "nope")), CLASSES, FLEET)


def test_progress_names_each_selector() -> None:
    seen: list[str] = []
    explain(claim(request("nic", IB, "true")), CLASSES, FLEET, progress=seen.append)
    assert "request nic selector #0: true" in seen


def test_two_requests_never_share_one_device() -> None:
    fleet = devices(slice_doc("n1", NIC, nic("mlx5-0", "pci0000:3a")))
    got = explain(claim(request("a", IB), request("b", IB)), CLASSES, fleet)
    assert not got.allocatable
    assert "need more distinct devices than n1 has allocatable" in got.nodes[0].requests[0].why
    assert got.nodes[0].requests[1].why == "satisfiable alone"


def test_mode_all_over_the_claim_limit_fails() -> None:
    many = [nic(f"mlx5-{i}", "pci0000:3a") for i in range(40)]
    fleet = devices(slice_doc("n1", NIC, *many[:20]), slice_doc("n1", NIC, *many[20:]))
    got = explain(claim(request("all", IB, allocationMode="All")), CLASSES, fleet)
    assert not got.allocatable
    assert "more than 32" in got.nodes[0].requests[0].why


def test_two_constraints_on_one_attribute_pick_their_values_independently() -> None:
    fleet = devices(
        slice_doc("n1", GPU, gpu("gpu-0", "pci0000:3a"), gpu("gpu-1", "pci0000:9a")),
        slice_doc("n1", NIC, nic("mlx5-0", "pci0000:3a"), nic("mlx5-1", "pci0000:9a")),
    )
    pairs = claim(
        request("gpu-a", GPU),
        request("nic-a", IB),
        request("gpu-b", GPU),
        request("nic-b", IB),
        constraints=[
            {"requests": ["gpu-a", "nic-a"], "matchAttribute": ROOT},
            {"requests": ["gpu-b", "nic-b"], "matchAttribute": ROOT},
        ],
    )
    (node,) = explain(pairs, CLASSES, fleet).nodes
    assert node.ok
    got = {r.request: r.devices[0] for r in node.requests}
    assert {(got["gpu-a"], got["nic-a"]), (got["gpu-b"], got["nic-b"])} == {
        ("gpu-0", "mlx5-0"),
        ("gpu-1", "mlx5-1"),
    }


def test_a_constraint_on_a_subrequest_binds_only_when_it_is_chosen() -> None:
    spec = {
        "name": "nic",
        "firstAvailable": [
            {"name": "near", "deviceClassName": IB, "count": 2},
            {"name": "any", "deviceClassName": IB},
        ],
    }
    near = claim(
        request("gpu", GPU),
        spec,
        constraints=[{"requests": ["gpu", "nic/near"], "matchAttribute": ROOT}],
    )
    got = by_node(explain(near, CLASSES, FLEET))
    # gpu-ib-02: one ACTIVE NIC, not under gpu-0's root; `any` is not bound by the root
    assert got["gpu-ib-02"].requests[1].why == "would get mlx5-4 (subrequest nic/any)"
