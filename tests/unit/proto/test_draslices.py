"""proto.draslices: ResourceSlices from a snapshot, for every device kind, sharing mode and
pool size; every slice validates against the Kubernetes 1.37 strict schema."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from proto import draslices
from proto.draslices import SliceSettings, build_slices, data_direct_of, device_kind
from proto.inventory import DataDirectFunction, Device, NodeSnapshot, Port, Sriov

KUBERNETES_VERSION = "1.37"  # the schemas kubernetes-validate 1.37.0 ships
STD = "resource.kubernetes.io"


def port(state: Any = "ACTIVE", layer: Any = "InfiniBand") -> Port:
    return Port(port=1, state=state, phys_state="LinkUp", link_layer=layer, rate_gbps=400.0)


PF = Device(
    name="mlx5_0",
    pci_address="0000:16:00.0",
    vendor_id="0x15b3",
    device_id="0x1023",
    fw_ver="40.44.1036",
    node_guid="c470:bd03:00a1:0a00",
    sys_image_guid="c470:bd03:00a1:0a00",
    numa_node=0,
    netdevs=("ib0",),
    pci_path=("pci0000:15", "0000:15:01.0"),
    ports=(port(),),
    char_devices=("/dev/infiniband/uverbs0",),
    sriov=Sriov(totalvfs=4, numvfs=1, vfs=("0000:16:00.2",)),
    vpd_serial="MT1",
    vpd_vuid="vu-a",
)
VF = Device(
    name="mlx5_2",
    pci_address="0000:16:00.2",
    vendor_id="0x15b3",
    device_id="0x101e",
    fw_ver="40.44.1036",
    numa_node=0,
    pci_path=("pci0000:15", "0000:15:01.0"),
    ports=(port(),),
    sriov=Sriov(physfn="0000:16:00.0"),
)
SF = Device(
    name="mlx5_3",
    pci_address="0000:16:00.0",
    vendor_id="0x15b3",
    device_id="0x1023",
    pci_path=("pci0000:15", "0000:15:01.0"),
    ports=(port(),),
    auxiliary_device="mlx5_core.sf.2",
    sf_number=88,
    vpd_serial="MT1",
    vpd_vuid="vu-a",
)
BOND = Device(
    name="mlx5_bond_0",
    pci_address="0000:26:00.0",
    vendor_id="0x15b3",
    device_id="0x1021",
    fw_ver="28.39.1002",
    numa_node=1,
    netdevs=("enp38s0f0np0",),
    pci_path=("pci0000:25", "0000:25:01.0"),
    ports=(port(layer="Ethernet"),),
    lag_functions=("0000:26:00.0", "0000:26:00.1"),
)
DD = DataDirectFunction(
    pci_address="0000:1b:00.0",
    pci_path=("pci0000:1a", "0000:1a:01.0"),
    vpd_serial="MT1",
    vpd_vuid="vu-a",
)


def snap(*devices: Device, dd: tuple[DataDirectFunction, ...] = ()) -> NodeSnapshot:
    return NodeSnapshot(
        node="gpu-01", agent_version="t", seq=1, collected_at=0.0, devices=devices, data_direct=dd
    )


def values(entry: dict[str, Any]) -> dict[str, Any]:
    return {name: next(iter(v.values())) for name, v in entry["attributes"].items()}


def only_devices(snapshot: NodeSnapshot, **kw: Any) -> list[dict[str, Any]]:
    return draslices.device_entries(snapshot, kw.pop("states", {}), SliceSettings(**kw))


def validate(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        found = kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        assert found == KUBERNETES_VERSION
        devices = obj["spec"]["devices"]
        assert len(devices) <= draslices.MAX_DEVICES
        for device in devices:
            assert len(device["attributes"]) + len(device.get("capacity", {})) <= 32
            for value in device["attributes"].values():
                assert len(str(next(iter(value.values())))) <= 64


@pytest.mark.parametrize(
    ("device", "kind"),
    [
        pytest.param(PF, "pf", id="pf"),
        pytest.param(VF, "vf", id="vf"),
        pytest.param(SF, "sf", id="sf"),
        pytest.param(BOND, "bond", id="bond"),
        pytest.param(Device(name="mlx5_bond_1"), "bond", id="bond-by-name"),
    ],
)
def test_device_kind(device: Device, kind: str) -> None:
    assert device_kind(device) == kind


def test_pf_attributes_without_data_direct() -> None:
    (entry,) = only_devices(snap(PF))
    assert entry["name"] == "mlx5-0"
    assert values(entry) == {
        f"{STD}/pcieRoot": "pci0000:15",
        f"{STD}/pciBusID": "0000:16:00.0",
        f"{STD}/numaNode": 0,
        "kind": "pf",
        "rdmaDevice": "mlx5_0",
        "netdevs": "ib0",
        "linkLayer": "InfiniBand",
        "rateGbps": 400,
        "portState": "ACTIVE",
        "firmware": "40.44.1036",
        "nodeGUID": "c470:bd03:00a1:0a00",
        "sysImageGUID": "c470:bd03:00a1:0a00",
        "vendorID": "15b3",
        "deviceID": "1023",
        "model": "ConnectX-8",
    }
    assert entry["attributes"]["firmware"] == {"version": "40.44.1036"}
    assert "allowMultipleAllocations" not in entry and "capacity" not in entry


def test_data_direct_root_wins_and_nic_root_is_kept() -> None:
    entries = only_devices(snap(PF, VF, SF, dd=(DD,)))
    for entry in entries:
        got = values(entry)
        assert got[f"{STD}/pcieRoot"] == "pci0000:1a", entry["name"]
        assert got["nicPcieRoot"] == "pci0000:15", entry["name"]


def test_vf_takes_pf_model_and_names_its_pf() -> None:
    _, entry = only_devices(snap(PF, VF))
    got = values(entry)
    assert (got["kind"], got["pfPciBusID"], got["model"], got["deviceID"]) == (
        "vf",
        "0000:16:00.0",
        "ConnectX-8",
        "101e",
    )
    assert got["netdevs"] == ""


def test_sf_and_bond_attributes() -> None:
    sf, bond = only_devices(snap(SF, BOND))
    assert (sf["name"], values(sf)["sfNumber"], values(sf)["pfPciBusID"]) == (
        "mlx5-3",
        88,
        "0000:16:00.0",
    )
    assert "numaNode" not in " ".join(sf["attributes"])  # unknown NUMA: omitted
    got = values(bond)
    assert bond["name"] == "mlx5-bond-0"
    assert (got["kind"], got["bondPciBusIDs"], got["linkLayer"]) == (
        "bond",
        "0000:26:00.0,0000:26:00.1",
        "Ethernet",
    )
    assert "pfPciBusID" not in got and "nicPcieRoot" not in got


@pytest.mark.parametrize(
    ("device", "functions", "expected"),
    [
        pytest.param(PF, (DD,), DD, id="vuid"),
        pytest.param(replace(PF, vpd_vuid=None), (DD,), DD, id="serial-without-vuid"),
        pytest.param(PF, (DataDirectFunction(pci_address="x", vpd_vuid="o"),), None, id="no-match"),
        pytest.param(PF, (DD, replace(DD, pci_address="y")), None, id="ambiguous"),
        pytest.param(Device(name="mlx5_9"), (DD,), None, id="no-vpd"),
    ],
)
def test_data_direct_pairing(
    device: Device, functions: tuple[DataDirectFunction, ...], expected: object
) -> None:
    assert data_direct_of(device, functions) == expected


def test_serial_match_needs_a_single_candidate() -> None:
    pf = Device(name="mlx5_0", vpd_serial="MT1")
    twins = (
        DataDirectFunction(pci_address="a", vpd_serial="MT1"),
        DataDirectFunction(pci_address="b", vpd_serial="MT1"),
    )
    assert data_direct_of(pf, twins) is None
    assert data_direct_of(pf, twins[:1]) == twins[0]


@pytest.mark.parametrize(
    ("fw", "expected"),
    [
        pytest.param("28.39.1002", {"version": "28.39.1002"}, id="semver"),
        pytest.param("16.35.0502", {"string": "16.35.0502"}, id="leading-zero"),
        pytest.param(
            "2.42.5000 (MT_0000000001)", {"string": "2.42.5000 (MT_0000000001)"}, id="text"
        ),
    ],
)
def test_firmware_version_or_string(fw: str, expected: dict[str, str]) -> None:
    (entry,) = only_devices(snap(Device(name="mlx5_0", fw_ver=fw)))
    assert entry["attributes"]["firmware"] == expected


def test_polled_port_state_wins_and_rail_is_published() -> None:
    (entry,) = only_devices(
        snap(PF), states={("mlx5_0", 1): ("DOWN", "Disabled")}, rails={"mlx5_0": 3}
    )
    assert values(entry)["portState"] == "DOWN"
    assert values(entry)["rail"] == 3


def test_too_long_string_is_left_out() -> None:
    many = tuple(f"enp{i}s0f0np0" for i in range(8))
    (entry,) = only_devices(snap(Device(name="mlx5_0", netdevs=many)))
    assert "netdevs" not in entry["attributes"]


def test_copies_mode_names_and_own_dicts() -> None:
    entries = only_devices(snap(PF), sharing="copies", share=3)
    assert [e["name"] for e in entries] == ["mlx5-0-s0", "mlx5-0-s1", "mlx5-0-s2"]
    assert entries[0]["attributes"] == entries[1]["attributes"]
    assert entries[0]["attributes"] is not entries[1]["attributes"]


def test_consumable_mode() -> None:
    (entry,) = only_devices(snap(PF), sharing="consumable", share=8)
    assert entry["name"] == "mlx5-0"
    assert entry["allowMultipleAllocations"] is True
    assert entry["capacity"] == {
        "shares": {
            "value": "8",
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "8", "step": "1"}},
        }
    }


@pytest.mark.parametrize(
    "kw",
    [
        pytest.param({}, id="exclusive"),
        pytest.param({"sharing": "copies", "share": 4}, id="copies"),
        pytest.param({"sharing": "consumable", "share": 4}, id="consumable"),
    ],
)
def test_every_kind_validates_against_the_1_37_schema(kw: dict[str, Any]) -> None:
    slices = build_slices(
        snap(PF, VF, SF, BOND, dd=(DD,)), {}, SliceSettings(rails={"mlx5_0": 1}, **kw)
    )
    validate(slices)
    (one,) = slices
    assert one["metadata"]["name"] == "gpu-01-rdma-nicfleet-io-0"
    assert one["spec"]["pool"] == {"name": "gpu-01", "generation": 1, "resourceSliceCount": 1}
    assert one["spec"]["driver"] == "rdma.nicfleet.io"
    assert one["spec"]["nodeName"] == "gpu-01"


def test_a_node_without_devices_publishes_one_empty_slice() -> None:
    (one,) = build_slices(snap(), {}, SliceSettings())
    assert one["spec"]["devices"] == [] and one["spec"]["pool"]["resourceSliceCount"] == 1
    validate([one])


def test_unpublishable_names_are_skipped() -> None:
    assert only_devices(snap(Device(name="rxe-0"), PF))[0]["name"] == "mlx5-0"


@pytest.mark.parametrize(
    "kw",
    [
        pytest.param({"share": 0}, id="share"),
        pytest.param({"generation": -1}, id="generation"),
        pytest.param({"max_devices": 129}, id="max-devices"),
    ],
)
def test_bad_settings(kw: dict[str, Any]) -> None:
    with pytest.raises(draslices.InvalidSliceSettings):
        SliceSettings(**kw)


@settings(max_examples=30, deadline=None)
@given(adapters=st.integers(0, 300), share=st.integers(1, 3))
def test_pools_split_into_slices_of_at_most_128(adapters: int, share: int) -> None:
    devices = tuple(Device(name=f"mlx5_{i}", ports=(port(),)) for i in range(adapters))
    slices = build_slices(snap(*devices), {}, SliceSettings(sharing="copies", share=share))
    total = adapters * share
    assert len(slices) == max(1, -(-total // 128))
    names = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert len(names) == total == len(set(names))
    assert all(s["spec"]["pool"]["resourceSliceCount"] == len(slices) for s in slices)
    assert len({s["metadata"]["name"] for s in slices}) == len(slices)
    assert all(len(s["spec"]["devices"]) <= 128 for s in slices)
