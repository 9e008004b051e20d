"""proto.sriovdp (pure): the sriovDevicePlugin config as sriov-network-device-plugin decodes
it (Go's json, parseObjectOrSlice), the checks it exits on (validConfigs), and its netDevice
selectors on a fleet of PFs and VFs (pfNames/rootDevices VF ranges, linkTypes, isRdma)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from proto.inventory import Device, NodeSnapshot, Sriov
from proto.sriovdp import Refusal, Resource, read_config, selected, sriov_notes
from tests.support.builders import nic, snapshot

PF_VFS = ("0000:3b:00.2", "0000:3b:00.3", "0000:3b:00.4")


def vf(i: int, *, netdevs: tuple[str, ...] = ()) -> Device:
    base = nic(f"mlx5_{2 + i}", index=2 + i, netdevs=netdevs, link_layer="Ethernet",
               device_id="0x101e", pci=PF_VFS[i])  # fmt: skip
    return msgspec.structs.replace(base, sriov=Sriov(physfn="0000:3b:00.0"))


# A PF with 3 VFs created (the plugin skips it), its VFs (vf1 has its own netdev), and a PF
# without VFs (an InfiniBand port).
PF = msgspec.structs.replace(
    nic("mlx5_0", netdevs=("ens1f0np0",), link_layer="Ethernet", device_id="0x101d",
        pci="0000:3b:00.0"),
    sriov=Sriov(totalvfs=8, numvfs=3, vfs=PF_VFS),
)  # fmt: skip
IB = nic("mlx5_1", index=1, netdevs=("ibp94s0",), pci="0000:5e:00.0", device_id="0x101b")
SNAP: NodeSnapshot = snapshot("n1", devices=(PF, vf(0), vf(1, netdevs=("ens1f0v1",)), vf(2), IB))


def resource(selectors: Any) -> Resource:
    config = read_config(json.dumps({"resourceList": [
        {"resourceName": "r", "selectors": selectors}]}))  # fmt: skip
    assert not isinstance(config, Refusal), config
    return config[0]


def picked(selectors: Any) -> list[str]:
    devices, _ = selected(resource(selectors), SNAP)
    return sorted(d.name for d in devices)


@pytest.mark.parametrize(
    ("selectors", "names"),
    [
        pytest.param({"vendors": ["15b3"]}, ["mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4"],
                     id="pf-with-vfs-skipped"),
        pytest.param({"vendors": ["0x15b3"]}, [], id="ids-as-ghw-writes-them"),
        pytest.param({"devices": ["101e"]}, ["mlx5_2", "mlx5_3", "mlx5_4"], id="vf-device-id"),
        pytest.param({"pfNames": ["ens1f0np0"]}, ["mlx5_2", "mlx5_3", "mlx5_4"], id="pf-name"),
        pytest.param({"pfNames": ["ENS1F0NP0#0,2"]}, ["mlx5_2", "mlx5_4"], id="pf-name-indexes"),
        pytest.param({"pfNames": ["ens1f0np0#1-2"]}, ["mlx5_3", "mlx5_4"], id="pf-name-range"),
        pytest.param({"pfNames": ["ens1f0np0#x"]}, [], id="pf-name-bad-index"),
        pytest.param({"pfNames": ["ibp94s0"]}, [], id="a-pf-has-no-pf-name"),
        pytest.param({"rootDevices": ["0000:3b:00.0#0"]}, ["mlx5_2"], id="root-device-index"),
        # A VF without a netdev takes its PF's link type; the IB PF its own.
        pytest.param({"linkTypes": ["ether"]}, ["mlx5_2", "mlx5_3", "mlx5_4"], id="link-ether"),
        pytest.param({"linkTypes": ["infiniband"]}, ["mlx5_1"], id="link-ib"),
        # isRdma false is no filter (every listed function is an RDMA device anyway).
        pytest.param({"isRdma": False, "devices": ["101b"]}, ["mlx5_1"], id="isrdma-false"),
        pytest.param({"IsRdma": True, "devices": ["101b"]}, ["mlx5_1"], id="isrdma-any-case"),
        pytest.param({"Devices": ["101b"]}, ["mlx5_1"], id="keys-case-insensitive"),
        pytest.param({"ddpProfiles": ["gtp"]}, [], id="ddp-never-mellanox"),
        pytest.param([{"devices": ["101b"]}, {"pfNames": ["ens1f0np0#0"]}], ["mlx5_1", "mlx5_2"],
                     id="selector-groups-union"),
    ],
)  # fmt: skip
def test_selectors(selectors: Any, names: list[str]) -> None:
    assert picked(selectors) == names


def test_what_snapshots_cannot_show_is_named() -> None:
    _, unseen = selected(resource({"pKeys": ["0x7fff"], "acpiIndexes": ["1"]}), SNAP)
    assert unseen == ["acpiIndexes", "pKeys"]


@pytest.mark.parametrize(
    ("config", "path", "words"),
    [
        pytest.param("{", "", "not valid for Go", id="not-json"),
        pytest.param({"resourceList": [{"resourceName": "a", "selectors": {}}],
                      "resourcelist": 7}, "resourceList", "cannot unmarshal", id="type-error"),
        pytest.param({"resourceList": [{"resourceName": "a"}]}, "resourceList[0].selectors",
                     "panics", id="no-selectors"),
        pytest.param({"resourceList": [{"resourceName": "a", "selectors": None}]},
                     "resourceList[0].selectors", "panics", id="null-selectors"),
        pytest.param({"resourceList": [{"resourceName": "a", "deviceType": "gpu",
                                        "selectors": {}}]},
                     "resourceList[0].deviceType", "unsupported", id="device-type"),
        pytest.param({"resourceList": [{"resourceName": "a/b", "selectors": {}}]},
                     "resourceList[0].resourceName", "invalid characters", id="name"),
        pytest.param({"resourceList": [{"resourceName": "a", "selectors": {}},
                                       {"resourceName": "a", "selectors": {}}]},
                     "resourceList[1].resourceName", "already exists", id="duplicate"),
        pytest.param({"resourceList": [{"resourceName": "a", "selectors": {
            "isRdma": True, "vdpaType": "vhost"}}]},
                     "resourceList[0].selectors", "mutually exclusive", id="rdma-and-vdpa"),
        pytest.param({"resourceList": [{"resourceName": "a", "selectors": []}]},
                     "resourceList", "no resource configuration", id="only-entry-dropped"),
    ],
)  # fmt: skip
def test_the_plugin_would_not_start(config: Any, path: str, words: str) -> None:
    text = config if isinstance(config, str) else json.dumps(config)
    refusal = read_config(text)
    assert isinstance(refusal, Refusal), refusal
    assert refusal.path == path and words in refusal.reason, refusal


def test_selectors_that_do_not_decode_leave_the_entry_out() -> None:
    config = {"resourceList": [
        {"resourceName": "bad", "selectors": {"vendors": "15b3"}},
        {"resourceName": "good", "selectors": {"vendors": ["15b3"]}},
    ]}  # fmt: skip
    notes = sriov_notes({"config": json.dumps(config)}, {"n1": SNAP})
    assert [(n.severity, n.path.rsplit(".", 1)[-1]) for n in notes] == [
        ("warning", "selectors"), ("info", "resourceList[1]"),
    ]  # fmt: skip
    assert "the plugin leaves it out" in notes[0].message
    assert "selects 4 adapters" in notes[1].message


def test_webhook_refusals_come_first() -> None:
    config = {"resourceList": [{"resourceName": "_vf", "resourcePrefix": "x",
                                "selectors": {"vendors": ["15b3"]}}]}  # fmt: skip
    notes = sriov_notes({"config": json.dumps(config)}, {"n1": SNAP})
    assert notes[0].severity == "critical"
    assert "webhook refuses it: invalid resource name '_vf'" in notes[0].message
    (prefix,) = sriov_notes({"config": json.dumps({"resourceList": [
        {"resourceName": "vf", "resourcePrefix": "nvidia", "selectors": {"vendors": ["x"]}}]})},
        {})  # fmt: skip
    assert "is not an FQDN" in prefix.message
