"""deploy/dra/ offline: the DeviceClasses and ResourceClaimTemplate examples render with the
pinned kustomize and validate for Kubernetes 1.37 (strict), and every CEL selector in them,
evaluated with a real CEL implementation (tests/unit/deploy/admission.py) and the variables
the DRA allocator binds (`device.driver`, `device.attributes`, `device.capacity`, each map
keyed by domain), picks exactly the devices it is meant to among attribute maps of the
dra-contract: an InfiniBand PF, a RoCE VF, a RoCE LAG bond, a GPU of NVIDIA's driver."""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any, Final

import kubernetes_validate
import pytest

from proto import dranames, draslices
from tests.support.paths import REPO
from tests.unit.deploy import admission
from tests.unit.deploy.rendered import find, render

KUBERNETES_VERSION: Final = "1.37"  # the schemas kubernetes-validate 1.37.0 ships
TARGETS: Final = ("dra", "dra/examples", "overlays/dra-agent-publish")
STANDARD_DOMAIN: Final = "resource.kubernetes.io"
NVIDIA_GPU: Final = "gpu.nvidia.com"  # NVIDIA's DRA driver and its DeviceClass
_DOMAIN_LOOKUP: Final = re.compile(r'device\.(?:attributes|capacity)\["([^"]+)"\]')

# Attribute maps as a ResourceSlice publishes them (unqualified: the driver's domain).
IB_PF: Final = {
    "resource.kubernetes.io/pcieRoot": "pci0000:3a",
    "resource.kubernetes.io/pciBusID": "0000:3b:00.0",
    "resource.kubernetes.io/numaNode": 0,
    "kind": "pf",
    "rdmaDevice": "mlx5_0",
    "netdevs": "ibp59s0",
    "linkLayer": "InfiniBand",
    "rateGbps": 400,
    "portState": "ACTIVE",
    "firmware": "28.39.1002",
    "nodeGUID": "a088:c203:0012:3456",
    "sysImageGUID": "a088:c203:0012:3456",
    "vendorID": "15b3",
    "deviceID": "1021",
    "model": "ConnectX-7",
    "rail": 3,
}
ROCE_VF: Final = {
    "resource.kubernetes.io/pcieRoot": "pci0000:97",
    "resource.kubernetes.io/pciBusID": "0000:98:00.2",
    "kind": "vf",
    "rdmaDevice": "mlx5_4",
    "netdevs": "",
    "linkLayer": "Ethernet",
    "rateGbps": 200,
    "portState": "DOWN",
    "vendorID": "15b3",
    "deviceID": "101e",
    "model": "ConnectX-7 Virtual Function",
    "pfPciBusID": "0000:98:00.0",
}
ROCE_BOND: Final = {
    "resource.kubernetes.io/pcieRoot": "pci0000:17",
    "resource.kubernetes.io/pciBusID": "0000:18:00.0",
    "kind": "bond",
    "rdmaDevice": "mlx5_bond_0",
    "netdevs": "bond0",
    "linkLayer": "Ethernet",
    "rateGbps": 400,
    "portState": "ACTIVE",
}
GPU_ATTRIBUTES: Final = {
    "resource.kubernetes.io/pcieRoot": "pci0000:3a",
    "productName": "NVIDIA H200",
    "type": "gpu",
}


def device(
    attributes: Mapping[str, Any],
    *,
    driver: str = dranames.DRIVER,
    capacity: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The CEL `device` variable of a slice device: names grouped by domain, unqualified ones
    in the driver's. Kubernetes answers an unknown domain with an empty map: every domain the
    expressions look up gets one here. Quantities are strings (no quantity type here)."""
    domains = looked_up()

    def grouped(names: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        by_domain: dict[str, dict[str, Any]] = {d: {} for d in domains | {driver}}
        for name, value in names.items():
            domain, _, short = name.rpartition("/")
            by_domain.setdefault(domain or driver, {})[short] = value
        return by_domain

    return {
        "driver": driver,
        "attributes": grouped(attributes),
        "capacity": grouped(capacity or {}),
    }


def class_selectors(name: str) -> list[str]:
    spec = find(render("dra"), "DeviceClass", name)["spec"]
    return [s["cel"]["expression"] for s in spec["selectors"]]


def templates() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d["spec"]["spec"]["devices"] for d in render("dra/examples")}


def request_selectors(template: str, request: str) -> list[str]:
    (found,) = [r for r in templates()[template]["requests"] if r["name"] == request]
    return [s["cel"]["expression"] for s in found["exactly"].get("selectors", [])]


def every_expression() -> list[str]:
    classes = [e for d in render("dra") for e in class_selectors(d["metadata"]["name"])]
    requests = [
        s["cel"]["expression"]
        for devices in templates().values()
        for r in devices["requests"]
        for s in r["exactly"].get("selectors", [])
    ]
    return classes + requests


def selected(expressions: list[str], dev: Mapping[str, Any]) -> bool:
    """True when every selector answers true; an error fails the test, as it would abort
    the allocation in Kubernetes instead of skipping the device."""
    answers = [admission.outcome(e, {"device": dev}) for e in expressions]
    assert all(isinstance(a, bool) for a in answers), answers
    return all(answers)


@cache
def looked_up() -> frozenset[str]:
    return frozenset(d for e in every_expression() for d in _DOMAIN_LOOKUP.findall(e))


@cache
def sample_devices() -> dict[str, dict[str, Any]]:
    return {
        "ib-pf": device(IB_PF),
        "roce-vf": device(ROCE_VF),
        "roce-bond": device(ROCE_BOND),
        "no-link-layer": device({"kind": "pf", "rdmaDevice": "mlx5_9"}),
        "gpu": device(GPU_ATTRIBUTES, driver=NVIDIA_GPU),
        "gpu-claims-linklayer": device(
            {**GPU_ATTRIBUTES, f"{dranames.DRIVER}/linkLayer": "InfiniBand"}, driver=NVIDIA_GPU
        ),
    }


@pytest.mark.parametrize("target", TARGETS)
def test_rendered_objects_validate_for_kubernetes_1_37(target: str) -> None:
    docs = render(target)
    assert docs
    for doc in docs:
        found = kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        assert found == KUBERNETES_VERSION, doc["metadata"]["name"]


def test_the_classes_and_examples_shipped() -> None:
    assert {d["metadata"]["name"] for d in render("dra")} == {
        dranames.DRIVER,
        f"ib.{dranames.DRIVER}",
        f"roce.{dranames.DRIVER}",
    }
    assert set(templates()) == {
        "rdma-nic", "gpu-and-nic", "rail-aligned-nics", "gpu-nic-pairs", "shared-nic",
    }  # fmt: skip
    for doc in (*render("dra"), *render("dra/examples")):
        assert doc["apiVersion"] == "resource.k8s.io/v1"


def test_every_selector_is_standard_cel() -> None:
    """Only functions Kubernetes' CEL shares with the implementation here: what the tests
    below compute is what the scheduler computes."""
    found = every_expression()
    assert len(found) >= 13
    for expression in found:
        admission.check_standard(expression)


@pytest.mark.parametrize(
    ("device_class", "chosen"),
    [
        pytest.param(dranames.DRIVER, {"ib-pf", "roce-bond"}, id="every-device-of-the-driver"),
        pytest.param(f"ib.{dranames.DRIVER}", {"ib-pf"}, id="infiniband"),
        pytest.param(f"roce.{dranames.DRIVER}", {"roce-bond"}, id="roce"),
    ],
)  # fmt: skip
def test_each_class_selects_its_devices(device_class: str, chosen: set[str]) -> None:
    """A GPU is never chosen, even one with an attribute in nicfleet's domain; a device
    without linkLayer is skipped by the link-layer classes rather than an error; a port
    that is not ACTIVE (the RoCE VF is DOWN, the no-link-layer PF has no port) is passed
    over by every class, as the device plugin advertises only healthy devices."""
    expressions = class_selectors(device_class)
    assert {n for n, d in sample_devices().items() if selected(expressions, d)} == chosen


def test_a_selector_without_the_driver_check_would_fail_on_a_gpu() -> None:
    """Why every class tests device.driver first: the GPU's empty nicfleet domain."""
    for name in (f"ib.{dranames.DRIVER}", f"roce.{dranames.DRIVER}"):
        for expression in class_selectors(name):
            assert expression.startswith(f'device.driver == "{dranames.DRIVER}" && '), name
    bare = 'device.attributes["rdma.nicfleet.io"].linkLayer == "InfiniBand"'
    assert str(admission.outcome(bare, {"device": sample_devices()["gpu"]})).startswith("error")


def test_the_single_nic_takes_an_active_port_only() -> None:
    expressions = class_selectors(dranames.DRIVER) + request_selectors("rdma-nic", "nic")
    assert {n for n, d in sample_devices().items() if selected(expressions, d)} == {
        "ib-pf",
        "roce-bond",
    }


def test_gpu_and_nic_share_the_pcie_root() -> None:
    devices = templates()["gpu-and-nic"]
    classes = {r["name"]: r["exactly"]["deviceClassName"] for r in devices["requests"]}
    assert classes == {"gpu": NVIDIA_GPU, "nic": f"ib.{dranames.DRIVER}"}
    assert devices["constraints"] == [
        {"requests": ["gpu", "nic"], "matchAttribute": f"{STANDARD_DOMAIN}/pcieRoot"}
    ]


def test_gpu_nic_pairs_constrain_each_pair_alone() -> None:
    """One constraint per pair: a constraint over all GPUs and NICs would put every device
    on a single root."""
    devices = templates()["gpu-nic-pairs"]
    names = [r["name"] for r in devices["requests"]]
    pairs = [c["requests"] for c in devices["constraints"]]
    assert pairs == [[f"gpu-{i}", f"nic-{i}"] for i in range(4)]
    assert sorted(n for p in pairs for n in p) == sorted(names)
    assert {c["matchAttribute"] for c in devices["constraints"]} == {f"{STANDARD_DOMAIN}/pcieRoot"}
    for request in devices["requests"]:
        wanted = NVIDIA_GPU if request["name"].startswith("gpu") else f"ib.{dranames.DRIVER}"
        assert request["exactly"]["deviceClassName"] == wanted


def test_the_rail_aligned_set_asks_one_nic_per_rail() -> None:
    devices = templates()["rail-aligned-nics"]
    assert [r["name"] for r in devices["requests"]] == [f"rail-{i}" for i in range(8)]
    for rail in range(8):
        expressions = class_selectors(f"ib.{dranames.DRIVER}") + request_selectors(
            "rail-aligned-nics", f"rail-{rail}"
        )
        on_rail = device({**IB_PF, "rail": rail})
        other = device({**IB_PF, "rail": (rail + 1) % 8})
        assert selected(expressions, on_rail)
        assert not selected(expressions, other)
        assert not selected(expressions, sample_devices()["roce-vf"])  # no rail: skipped, no error


def test_the_shared_nic_asks_for_capacity_of_shareable_devices_only() -> None:
    (request,) = templates()["shared-nic"]["requests"]
    # The capacity proto/draslices.py publishes in consumable mode.
    assert request["exactly"]["capacity"] == {"requests": {draslices.SHARES: "1"}}
    expressions = class_selectors(f"roce.{dranames.DRIVER}") + request_selectors(
        "shared-nic", "nic"
    )
    shareable = device(ROCE_BOND, capacity={"shares": "16"})
    assert selected(expressions, shareable)
    assert not selected(expressions, sample_devices()["roce-bond"])  # exclusive: no capacity
    ib = device(IB_PF, capacity={"shares": "16"})
    assert not selected(expressions, ib)


def test_every_named_class_is_shipped_or_nvidias() -> None:
    shipped = {d["metadata"]["name"] for d in render("dra")}
    used = {
        r["exactly"]["deviceClassName"] for devices in templates().values()
        for r in devices["requests"]
    }  # fmt: skip
    assert used == shipped | {NVIDIA_GPU}


def test_docs_name_every_class_and_example() -> None:
    text = (REPO / "docs" / "dra.md").read_text()
    for name in [*(d["metadata"]["name"] for d in render("dra")), *templates()]:
        assert f"`{name}`" in text, name
