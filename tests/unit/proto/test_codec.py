"""Wire contract: every message type round-trips, old payloads decode, bad bytes give
one typed error naming the field."""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proto.codec import (
    MAX_PAYLOAD,
    WIRE_TYPES,
    CodecError,
    decode,
    encode,
    encode_map,
    from_json,
    to_json,
)
from proto.inventory import (
    Device,
    Gid,
    Gpu,
    GpuNicRelation,
    Interface,
    ModuleInfo,
    NodeSnapshot,
    Pcie,
    Platform,
    Port,
    ReadError,
    Sriov,
)
from proto.messages.alerts import Alert
from proto.messages.config import DesiredConfig, DevicePluginConfig, ResourceConfig, Selectors
from proto.messages.counters import CounterBatch, PortCounters
from proto.messages.events import LinkEvent
from proto.messages.status import DevicePluginStatus, ResourceStatus
from proto.messages.validation import ValidationResult
from tests.support.paths import REPO

DATA = REPO / "tests" / "data"


def full_snapshot() -> NodeSnapshot:
    port = Port(
        port=1,
        state="ACTIVE",
        state_id=4,
        phys_state="LinkUp",
        phys_state_id=5,
        link_layer="InfiniBand",
        rate_gbps=400.0,
        rate_lanes=4,
        rate_speed="NDR",
        lid=287,
        sm_lid=1024,
        gids=(Gid(index=0, gid="fe80:0000:0000:0000:58a2:e103:001b:2576", type="IB/RoCE v1"),),
        pkeys=("0xffff",),
        counters={"port_rcv_data": 10, "symbol_error": 0},
        hw_counters={"out_of_buffer": 3},
        rx_bytes=40,
        tx_bytes=0,
    )
    device = Device(
        name="mlx5_0",
        pci_address="0000:1a:00.0",
        vendor_id="0x15b3",
        device_id="0x1021",
        class_code="0x020700",
        driver="mlx5_core",
        numa_node=0,
        local_cpulist="0-15",
        node_guid="58a2:e103:001b:2576",
        fw_ver="28.41.1000",
        netdevs=("ib0",),
        interfaces=(Interface(name="ib0", port=1, mtu=4092, operstate="up", carrier=True),),
        char_devices=("/dev/infiniband/uverbs0",),
        pcie=Pcie(current_speed_gts=32.0, current_width=16, max_speed_gts=32.0, max_width=16),
        sriov=Sriov(totalvfs=8, numvfs=0),
        pci_path=("pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:17:01.0"),
        ports=(port,),
        errors=(ReadError(path="/class/infiniband/mlx5_0/hw_rev", error="ENOENT"),),
    )
    return NodeSnapshot(
        node="gpu-01.example.com",
        agent_version="0.1.0",
        seq=3,
        collected_at=1764460800.25,
        devices=(device,),
        gpus=(Gpu(pci_address="0000:18:00.0", numa_node=0, device_id="0x2330"),),
        gpu_nic_topology=(GpuNicRelation(gpu="0000:18:00.0", nic="mlx5_0", relation="PIX"),),
        modules={"mlx5_core": ModuleInfo(version="24.10", srcversion="ABCDEF")},
        platform=Platform(iommu=True, peermem=True),
        errors=(ReadError(path="/module/nvidia/version", error="ENOENT"),),
    )


ALL_MESSAGES: list[Any] = [
    pytest.param(full_snapshot(), id="snapshot"),
    pytest.param(
        CounterBatch(
            node="gpu-01",
            seq=9,
            collected_at=1.5,
            ports=(
                PortCounters(
                    device="mlx5_0",
                    port=1,
                    counters={"link_downed": 2},
                    rates={"counters/link_downed": 0.5},
                    saturated=("counters/symbol_error",),
                ),
            ),
        ),
        id="counter-batch",
    ),
    pytest.param(
        LinkEvent(
            node="gpu-01",
            seq=1,
            kind="port-state",
            device="mlx5_0",
            port=1,
            old_state="ACTIVE",
            new_state="DOWN",
            phys_state="Disabled",
            observed_at=2.0,
        ),
        id="link-event",
    ),
    pytest.param(
        DevicePluginStatus(
            node="gpu-01",
            config_generation=4,
            registered=True,
            resources=(ResourceStatus(name="rdma/ib", advertised=8, healthy=7),),
            observed_at=3.0,
        ),
        id="device-plugin-status",
    ),
    pytest.param(
        DesiredConfig(
            node="gpu-01",
            generation=2,
            device_plugin=DevicePluginConfig(
                config_list=(
                    ResourceConfig(
                        resource_name="ib",
                        rdma_hca_max=100,
                        selectors=Selectors(vendors=("15b3",), device_ids=("1021",)),
                    ),
                )
            ),
        ),
        id="desired-config",
    ),
    pytest.param(
        Alert(
            rule="port-down",
            severity="critical",
            state="firing",
            node="gpu-01",
            subject="mlx5_0/1",
            message="Port mlx5_0/1 is DOWN.",
            evidence={"state": "DOWN"},
            starts_at=4.0,
            fingerprint="abc",
        ),
        id="alert",
    ),
    pytest.param(
        ValidationResult(verdict="broken", started_at=5.0, finished_at=6.0),
        id="validation-result",
    ),
]


def test_every_wire_type_is_covered() -> None:
    covered = {type(p.values[0]) for p in ALL_MESSAGES}
    assert covered == set(WIRE_TYPES)


@pytest.mark.parametrize("message", ALL_MESSAGES)
def test_round_trip_msgpack_and_json(message: msgspec.Struct) -> None:
    assert decode(encode(message), type(message)) == message
    assert from_json(to_json(message), type(message)) == message


@pytest.mark.parametrize("message", ALL_MESSAGES)
def test_every_top_level_message_has_schema_and_version(message: msgspec.Struct) -> None:
    raw = msgspec.msgpack.decode(encode_map(message))
    assert raw["schema"] == f"nicfleet.v1.{type(message).__name__}"
    assert raw["version"] == 1
    packed = msgspec.msgpack.decode(encode(message))
    if isinstance(message, CounterBatch):  # sent packed: [schema, version, ...]
        assert packed[:2] == ["nicfleet.v1.PackedCounterBatch", 1]
    else:
        assert packed == raw


def test_older_minimal_snapshot_still_decodes() -> None:
    snap = decode((DATA / "snapshot-v1-minimal.msgpack").read_bytes(), NodeSnapshot)
    assert snap.node == "gpu-old-01"
    assert snap.devices[0].ports[0].state == "ACTIVE"
    assert snap.devices[0].ports[0].counters == {}
    assert snap.errors == ()
    assert snap.devices[0].pcie is None
    assert snap.platform.iommu is None


def test_unknown_fields_are_ignored() -> None:
    batch = decode((DATA / "counters-v1-minimal.msgpack").read_bytes(), CounterBatch)
    assert batch.ports[0].counters == {"port_rcv_data": 123, "symbol_error": 0}
    assert batch.ports[0].rates == {}
    raw = msgspec.msgpack.decode(encode(full_snapshot()))
    raw["devices"][0]["ports"][0]["brand_new"] = [1, 2, 3]
    raw["from_the_future"] = {"a": 1}
    assert decode(msgspec.msgpack.encode(raw), NodeSnapshot) == full_snapshot()


def _mutated(path: tuple[Any, ...], value: Any) -> bytes:
    raw = msgspec.msgpack.decode(encode(full_snapshot()))
    target = raw
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return msgspec.msgpack.encode(raw)


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        pytest.param(_mutated(("seq",), "three"), "$.seq", id="wrong-type-top"),
        pytest.param(
            _mutated(("devices", 0, "ports", 0, "lid"), "0x1f"),
            "$.devices[0].ports[0].lid",
            id="wrong-type-nested",
        ),
        pytest.param(
            _mutated(("devices", 0, "ports", 0, "state"), "SLEEPY"),
            "$.devices[0].ports[0].state",
            id="bad-literal",
        ),
        pytest.param(_mutated(("schema",), "nicfleet.v1.Alert"), "$.schema", id="other-schema"),
        pytest.param(
            msgspec.msgpack.encode({"schema": "nicfleet.v1.NodeSnapshot"}), "$", id="missing"
        ),
        pytest.param(encode(full_snapshot())[:-5], "$", id="truncated"),
        pytest.param(b"\xc1\xff\x00garbage", "$", id="garbage"),
        pytest.param(b"", "$", id="empty"),
        pytest.param(msgspec.msgpack.encode([1, 2, 3]), "$", id="array-not-map"),
    ],
)
def test_bad_payloads_raise_codec_error_naming_the_field(payload: bytes, path: str) -> None:
    with pytest.raises(CodecError) as info:
        decode(payload, NodeSnapshot)
    assert info.value.type_name == "NodeSnapshot"
    assert info.value.path == path
    assert path in str(info.value)


def test_missing_field_is_named() -> None:
    with pytest.raises(CodecError, match="node"):
        decode(msgspec.msgpack.encode({"schema": "nicfleet.v1.NodeSnapshot"}), NodeSnapshot)


def test_oversize_payload_is_refused_before_decoding() -> None:
    with pytest.raises(CodecError, match="exceeds"):
        decode(b"\x00" * (MAX_PAYLOAD + 1), NodeSnapshot)


def test_bad_json_is_a_codec_error() -> None:
    with pytest.raises(CodecError, match=r"\$\.generation"):
        from_json(
            b'{"schema":"nicfleet.v1.DesiredConfig","node":"a","generation":"x"}', DesiredConfig
        )


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_random_bytes_never_escape_as_anything_but_codec_error(data: bytes) -> None:
    for type_ in WIRE_TYPES:
        with contextlib.suppress(CodecError):
            decode(data, type_)


def test_device_plugin_config_uses_upstream_field_names() -> None:
    doc = (
        b'{"periodicUpdateInterval": 300, "configList": [{"resourceName": "hca_shared_a",'
        b' "rdmaHcaMax": 1000, "selectors": {"vendors": ["15b3"], "deviceIDs": ["1017"],'
        b' "ifNames": ["ens1f0"]}}]}'
    )
    config = from_json(doc, DevicePluginConfig)
    assert config.periodic_update_interval == 300
    resource = config.config_list[0]
    assert (resource.resource_name, resource.resource_prefix, resource.rdma_hca_max) == (
        "hca_shared_a",
        "rdma",
        1000,
    )
    assert resource.selectors is not None
    assert resource.selectors.device_ids == ("1017",)
    assert resource.selectors.if_names == ("ens1f0",)
