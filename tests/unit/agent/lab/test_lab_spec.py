"""Lab node specs: built-ins load, defaults are what the docs say, and every malformed
spec is refused with an error that names the file and the field."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agent.lab.nodespec import Module, NodeSpec, guid_text, parse_cpulist
from agent.lab.spec import (
    SpecError,
    builtin_specs,
    load_builtin,
    load_spec,
    parse_spec,
    with_node_name,
)

# Small but complete: a switch with a GPU and an IB NIC on socket 0, a dual-port RoCE card
# (two functions, one RDMA device each) on socket 1.
BASE: dict[str, Any] = {
    "name": "lab-1",
    "numa_nodes": {0: "0-3", 1: "4-7"},
    "host_bridges": [
        {"name": "pci0000:15", "numa_node": 0, "root_ports": ["0000:15:01.0"]},
        {"name": "pci0000:97", "numa_node": 1, "root_ports": ["0000:97:01.0"]},
    ],
    "switches": [
        {
            "parent": "0000:15:01.0",
            "upstream": "0000:16:00.0",
            "downstream": ["0000:17:00.0", "0000:17:01.0"],
        }
    ],
    "gpus": [{"address": "0000:18:00.0", "parent": "0000:17:00.0", "model": "H100 SXM5"}],
    "adapters": [
        {
            "name": "mlx5_0",
            "model": "ConnectX-7",
            "address": "0000:19:00.0",
            "parent": "0000:17:01.0",
            "node_guid": "0x58a2e103001b2576",
            "fw_ver": "28.41.1000",
            "board_id": "MT_0000000838",
            "ports": [{"rate": "4X NDR", "lid": 287, "sm_lid": 1024, "netdev": "ib0"}],
        },
        *[
            {
                "name": f"mlx5_{fn + 1}",
                "model": "ConnectX-6 Dx",
                "address": f"0000:98:00.{fn}",
                "parent": "0000:97:01.0",
                "node_guid": f"58a2:e103:0059:2a0{fn}",
                "sys_image_guid": "58a2:e103:0059:2a00",
                "fw_ver": "22.38.1002",
                "board_id": "MT_0000000359",
                "ports": [
                    {
                        "link_layer": "Ethernet",
                        "rate": "4X EDR",
                        "netdev": {"name": f"enp152s0f{fn}np{fn}", "ipv4": [f"10.0.0.{fn + 1}"]},
                    }
                ],
            }
            for fn in (0, 1)
        ],
    ],
}


def _yaml(doc: dict[str, Any]) -> bytes:
    return msgspec.yaml.encode(doc)


def _with(change: Callable[[dict[str, Any]], object]) -> bytes:
    doc = copy.deepcopy(BASE)
    change(doc)
    return _yaml(doc)


def test_base_spec_parses_with_documented_defaults() -> None:
    spec = parse_spec(_yaml(BASE), "base.yaml")
    ib, eth0, eth1 = spec.adapters
    port = ib.ports[0]
    assert (port.state, port.effective_phys_state(), port.link_layer) == (
        "ACTIVE",
        "LinkUp",
        "InfiniBand",
    )
    assert port.effective_cap_mask() == "0xa751e848"
    assert port.pkeys == ["0xffff"]
    assert port.netdev_spec() is not None and port.netdev_spec().name == "ib0"  # type: ignore[union-attr]
    assert ib.effective_class() == "0x020700"
    assert eth0.effective_class() == "0x020000"
    assert eth0.ports[0].effective_cap_mask() == "0x00010000"
    assert ib.numbered_ports()[0][0] == 1
    assert ib.sys_image_guid is None  # rendered as node_guid
    assert guid_text(eth1.sys_image_guid or "") == "58a2:e103:0059:2a00"


def test_down_port_defaults_to_disabled() -> None:
    def down(doc: dict[str, Any]) -> None:
        doc["adapters"][0]["ports"][0]["state"] = "DOWN"

    port = parse_spec(_with(down)).adapters[0].ports[0]
    assert port.effective_phys_state() == "Disabled"


@pytest.mark.parametrize("name", builtin_specs())
def test_builtin_specs_load_and_are_named_after_their_file(name: str) -> None:
    spec = load_builtin(name)
    assert isinstance(spec, NodeSpec)
    assert spec.name == name
    assert spec.description


def test_builtin_specs_are_the_shipped_six() -> None:
    assert builtin_specs() == [
        "a100-ib-4nic", "cx8-dd-lag", "h100-ib-12nic", "h100-iommu-acs", "roce-cx6dx",
        "roce-cx6dx-2",
    ]  # fmt: skip


def test_new_keys_parse_with_documented_defaults() -> None:
    def extend(doc: dict[str, Any]) -> None:
        doc["iommu"] = True
        doc["modules"] = {"mlx5_core": None, "nv_peer_mem": {"version": "1.3-0"}}
        doc["switches"][0]["acs"] = "enabled"
        doc["switches"][0]["downstream"][1] = {"address": "0000:17:01.0", "acs": {"control": 0}}
        doc["adapters"][0]["sriov"] = {"totalvfs": 8, "numvfs": 2}
        doc["adapters"][0]["counters_ext"] = True

    spec = parse_spec(_with(extend))
    assert spec.iommu
    assert spec.modules["mlx5_core"] is None
    assert isinstance(spec.modules["nv_peer_mem"], Module)
    assert spec.modules["nv_peer_mem"].srcversion is msgspec.UNSET  # derived when rendered
    assert spec.switches[0].acs == "enabled"
    sriov = spec.adapters[0].sriov
    assert sriov is not None and (sriov.driver, sriov.rdma) == ("mlx5_core", False)
    assert parse_spec(_yaml(BASE)).iommu is False


def _colliding_vf(doc: dict[str, Any]) -> None:
    """mlx5_0 at 19:00.0 with 8 VFs (devfn 1..8) and another card at 19:01.0 (devfn 8)."""
    doc["adapters"][0]["sriov"] = {"totalvfs": 8}
    other = copy.deepcopy(doc["adapters"][0])
    other.update(name="mlx5_9", address="0000:19:01.0", node_guid="0x58a2e103001b2577")
    other["ports"] = [{"rate": "4X NDR"}]
    del other["sriov"]
    doc["adapters"].append(other)


def test_h100_spec_carries_the_ibstat_values_of_the_fixture() -> None:
    spec = load_builtin("h100-ib-12nic")
    by_name = {a.name: a for a in spec.adapters}
    assert [a.name for a in spec.adapters] == [f"mlx5_{i}" for i in range(12)]
    assert guid_text(by_name["mlx5_10"].node_guid) == "58a2:e103:001a:691e"
    assert [by_name[f"mlx5_{i}"].ports[0].lid for i in (0, 3, 4, 5, 6, 9, 10, 11)] == [
        287, 286, 239, 238, 285, 457, 284, 254,
    ]  # fmt: skip
    assert {by_name[n].ports[0].state for n in ("mlx5_1", "mlx5_2")} == {"DOWN"}
    assert by_name["mlx5_2"].sys_image_guid == by_name["mlx5_1"].node_guid
    assert by_name["mlx5_8"].ports[0].rate == "4X EDR"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("0x58a2e103001b2576", "58a2:e103:001b:2576", id="ibstat-form"),
        pytest.param("58a2:e103:001b:2576", "58a2:e103:001b:2576", id="sysfs-form"),
    ],
)
def test_guid_text(text: str, expected: str) -> None:
    assert guid_text(text) == expected


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        pytest.param("0-3,8", [0, 1, 2, 3, 8], id="range-and-single"),
        pytest.param("4,6,8", [4, 6, 8], id="singles"),
        pytest.param("2-3,0-1", [0, 1, 2, 3], id="unordered"),
    ],
)
def test_parse_cpulist(text: str, cpus: list[int]) -> None:
    assert parse_cpulist(text) == cpus


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    """A change that sets doc[a][0][b]... (path like 'adapters.2.ports.0.rate')."""

    def change(doc: dict[str, Any]) -> None:
        *parents, leaf = [int(p) if p.isdigit() else p for p in path.split(".")]
        target: Any = doc
        for key in parents:
            target = target[key]
        if value is _DELETE:
            del target[leaf]
        else:
            target[leaf] = value

    return change


_DELETE = object()
_UPSTREAM_AS_PARENT = _set("gpus.0.parent", "0000:16:00.0")
_DUPLICATE = _set("adapters.1.address", "0000:19:00.0")


@pytest.mark.parametrize(
    ("change", "path", "fragment"),
    [
        pytest.param(
            _set("adapters.2.ports.0.rate", 400),
            "$.adapters[2].ports[0].rate",
            "Expected `str`, got `int`",
            id="wrong-type",
        ),
        pytest.param(
            _set("adapters.2.ports.0.rate", "400 Gb/sec"),
            "$.adapters[2].ports[0].rate",
            "matching regex",
            id="rate-not-lanes-and-speed",
        ),
        pytest.param(
            _set("adapters.0.fw_ver", _DELETE),
            "$.adapters[0]",
            "missing required field `fw_ver`",
            id="missing-required-field",
        ),
        pytest.param(
            _set("adapters.0.ports.0.speed", "NDR"),
            "$.adapters[0].ports[0]",
            "unknown field `speed`",
            id="unknown-field",
        ),
        pytest.param(
            _set("adapters.0.ports.0.state", "UP"),
            "$.adapters[0].ports[0].state",
            "Invalid enum value 'UP'",
            id="unknown-port-state",
        ),
        pytest.param(
            _set("adapters.0.address", "19:00.0"),
            "$.adapters[0].address",
            "matching regex",
            id="bad-pci-address",
        ),
        pytest.param(
            _set("adapters.0.node_guid", "58a2e103001b2576"),
            "$.adapters[0].node_guid",
            "matching regex",
            id="bad-guid",
        ),
        pytest.param(
            _set("adapters.0.fw_ver", "28.41.1000\n"),
            "$.adapters[0].fw_ver",
            "matching regex",
            id="newline-in-a-one-line-file",
        ),
        pytest.param(
            _set("gpus.0.parent", "0000:99:00.0"),
            "$.gpus[0].parent",
            "unknown parent '0000:99:00.0'",
            id="unknown-parent",
        ),
        pytest.param(
            _UPSTREAM_AS_PARENT,
            "$.gpus[0].parent",
            "0000:16:00.0 is a upstream",
            id="parent-is-switch-upstream-port",
        ),
        pytest.param(
            _set("adapters.0.parent", "0000:18:00.0"),
            "$.adapters[0].parent",
            "0000:18:00.0 is a endpoint",
            id="parent-is-an-endpoint",
        ),
        pytest.param(
            _DUPLICATE,
            "$.adapters[1].address",
            "duplicate PCI address 0000:19:00.0 (first declared at $.adapters[0].address)",
            id="duplicate-address",
        ),
        pytest.param(
            _set("adapters.0.address", "0000:18:00.1"),
            "$.adapters[0].address",
            "bus 0000:18 already hangs below 0000:17:00.0, not 0000:17:01.0",
            id="bus-claimed-by-two-bridges",
        ),
        pytest.param(
            _set("host_bridges.1.root_ports.0", "0000:96:01.0"),
            "$.host_bridges[1].root_ports[0]",
            "not on bus 0000:97 of pci0000:97",
            id="root-port-off-the-root-bus",
        ),
        pytest.param(
            _set("name", "Lab_1"),
            "$.name",
            "not a DNS-1123 subdomain",
            id="node-name-not-dns-1123",
        ),
        pytest.param(
            _set("host_bridges.0.numa_node", 3),
            "$.host_bridges[0].numa_node",
            "NUMA node 3 is not declared",
            id="undeclared-numa-node",
        ),
        pytest.param(
            _set("numa_nodes.1", "3-7"),
            "$.numa_nodes[1]",
            "CPU 3 is already in NUMA node 0",
            id="numa-nodes-share-a-cpu",
        ),
        pytest.param(
            _set("adapters.2.sys_image_guid", "0x58a2e10300592a07"),
            "$.adapters[2].sys_image_guid",
            "functions of one card share sys_image_guid; mlx5_1 has 58a2:e103:0059:2a00",
            id="card-functions-disagree-on-image-guid",
        ),
        pytest.param(
            _set("adapters.2.name", "mlx5_1"),
            "$.adapters[2].name",
            "duplicate RDMA device name 'mlx5_1'",
            id="duplicate-rdma-device",
        ),
        pytest.param(
            _set("adapters.2.ports.0.netdev", "ib0"),
            "$.adapters[2].ports[0].netdev",
            "duplicate netdev name 'ib0'",
            id="duplicate-netdev",
        ),
        pytest.param(
            _set("adapters.1.ports.0.lid", 5),
            "$.adapters[1].ports[0].lid",
            "an Ethernet (RoCE) port has no LID",
            id="lid-on-ethernet-port",
        ),
        pytest.param(
            _set("adapters.1.ports.0.netdev.ipv4", ["10.0.0.300"]),
            "$.adapters[1].ports[0].netdev.ipv4[0]",
            "not an IPv4 address",
            id="bad-ipv4",
        ),
        pytest.param(
            _set("adapters.0.ports.0.counters", {"../x": 1}),
            "$.adapters[0].ports[0].counters",
            "matching regex",
            id="counter-name-with-slash",
        ),
        pytest.param(
            _set("switches.0.upstream", {"address": "0000:16:00.0", "acs": "enabled"}),
            "$.switches[0].upstream.acs",
            "ACS belongs to downstream ports",
            id="acs-on-upstream-port",
        ),
        pytest.param(
            _set("switches.0.acs", {"control": 0x20}),
            "$.switches[0].acs.control",
            "control 0x20 sets bits the capability 0x5f lacks",
            id="acs-control-beyond-capability",
        ),
        pytest.param(
            _set(
                "host_bridges.0.root_ports.0", {"address": "0000:15:01.0", "acs": {"control": 0x40}}
            ),
            "$.host_bridges[0].root_ports[0].acs.control",
            "capability 0x1f lacks",
            id="root-port-has-no-direct-translated",
        ),
        pytest.param(
            _set("switches.0.acs", "on"),
            "$.switches[0].acs",
            "Invalid enum value 'on'",
            id="acs-unknown-word",
        ),
        pytest.param(
            _set("adapters.0.sriov", {"totalvfs": 2, "numvfs": 3}),
            "$.adapters[0].sriov.numvfs",
            "numvfs 3 exceeds totalvfs 2",
            id="more-vfs-than-total",
        ),
        pytest.param(
            _set("adapters.1.sriov", {"totalvfs": 255}),
            "$.adapters[1].sriov.totalvfs",
            "255 VFs from devfn 0x02 do not fit on bus 0000:98",
            id="vfs-off-the-bus",
        ),
        pytest.param(
            _colliding_vf,
            "$.adapters[0].sriov.totalvfs",
            "VF routing ID 0000:19:01.0 collides with $.adapters[3].address",
            id="vf-collides-with-a-declared-function",
        ),
        pytest.param(
            _set("adapters.0.sriov", {"totalvfs": 2, "rdma": True, "driver": "vfio-pci"}),
            "$.adapters[0].sriov.rdma",
            "need the VFs bound to mlx5_core",
            id="vf-rdma-without-mlx5",
        ),
        pytest.param(
            _set("adapters.0.ports.0.counters_ext", {"port_xmit_data_64": 1}),
            "$.adapters[0].ports[0].counters_ext",
            "set counters_ext: true on the adapter first",
            id="counters-ext-values-without-the-layout",
        ),
        pytest.param(
            _set("modules", {"mlx5_core": {"srcversion": "abc"}}),
            "$.modules[...].srcversion",
            "matching regex",
            id="srcversion-not-23-hex-digits",
        ),
    ],
)
def test_malformed_spec_names_the_field(
    change: Callable[[dict[str, Any]], None], path: str, fragment: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(_with(change), "spec.yaml")
    assert (info.value.file, info.value.path) == ("spec.yaml", path)
    assert fragment in info.value.message
    assert str(info.value).startswith(f"spec.yaml: {path}: ")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param(b"node: [lab-1\n", "invalid YAML", id="bad-yaml"),
        pytest.param(b"- 1\n- 2\n", "Expected `object`, got `array`", id="not-a-mapping"),
        pytest.param(b"", "Expected `object`, got `null`", id="empty-document"),
    ],
)
def test_unparseable_document_is_reported_at_the_root(text: bytes, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(text, "broken.yaml")
    assert info.value.path == "$"
    assert fragment in info.value.message


def test_load_spec_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_bytes(_with(_set("adapters.0.ports.0.rate", "fast")))
    with pytest.raises(SpecError, match=r"node\.yaml: \$\.adapters\[0\]\.ports\[0\]\.rate: "):
        load_spec(path)
    path.write_bytes(_yaml(BASE))
    assert load_spec(path).name == "lab-1"


def test_load_spec_of_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read spec") as info:
        load_spec(tmp_path / "absent.yaml")
    assert info.value.file == str(tmp_path / "absent.yaml")


def test_unknown_builtin_lists_the_known_ones() -> None:
    with pytest.raises(SpecError, match=r"no built-in spec 'nope' \(known: a100-ib-4nic, "):
        load_builtin("nope")


def test_with_node_name_renames_and_validates() -> None:
    spec = load_builtin("roce-cx6dx")
    renamed = with_node_name(spec, "gpu-roce-01")
    assert renamed.name == "gpu-roce-01"
    assert renamed.adapters == spec.adapters
    with pytest.raises(SpecError, match=r"--node-name: \$\.name: .*DNS-1123"):
        with_node_name(spec, "GPU_01")
