"""The committed kubelet gRPC stubs (device plugin, DRA) are exactly what grpcio-tools generates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc_tools")

from proto import stubgen as generate
from proto.deviceplugin import api_pb2, pluginregistration_pb2
from proto.dra import api_pb2 as dra_pb2
from proto.dra import health_pb2, healthv1alpha1_pb2


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    fresh = generate.generate(tmp_path)
    committed = generate.generated_files(generate.REPO_ROOT)
    assert [p.name for p in fresh] == [p.name for p in committed]
    stale = [
        c.name for f, c in zip(fresh, committed, strict=True) if f.read_bytes() != c.read_bytes()
    ]
    assert not stale, f"stale generated stubs {stale}: run `make stubs` and commit the result"


@pytest.mark.parametrize(
    ("message", "field", "number"),
    [
        (api_pb2.RegisterRequest, "options", 4),
        (api_pb2.Device, "topology", 3),
        (api_pb2.ContainerAllocateResponse, "envs", 1),
        (api_pb2.ContainerAllocateResponse, "mounts", 2),
        (api_pb2.ContainerAllocateResponse, "devices", 3),
        (api_pb2.ContainerAllocateResponse, "annotations", 4),
        (api_pb2.ContainerAllocateResponse, "cdi_devices", 5),
        (api_pb2.ContainerPreferredAllocationRequest, "allocation_size", 3),
        (pluginregistration_pb2.PluginInfo, "supported_versions", 4),
        (pluginregistration_pb2.RegistrationStatus, "error", 2),
        (dra_pb2.Device, "cdi_device_ids", 4),
        (dra_pb2.Device, "share_id", 5),
        (dra_pb2.NodePrepareResourceResponse, "error", 2),
        (dra_pb2.Claim, "name", 3),
        (health_pb2.DeviceHealth, "health_check_timeout_seconds", 4),
        (health_pb2.DeviceHealth, "message", 5),
    ],
)
def test_field_numbers_are_the_upstream_ones(message: Any, field: str, number: int) -> None:
    assert message.DESCRIPTOR.fields_by_name[field].number == number


def test_wire_names_come_from_the_proto_packages() -> None:
    plugin = api_pb2.DESCRIPTOR.services_by_name["DevicePlugin"]
    assert plugin.full_name == "v1beta1.DevicePlugin"
    assert [m.name for m in plugin.methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    assert plugin.methods_by_name["ListAndWatch"].server_streaming
    watcher = pluginregistration_pb2.DESCRIPTOR.services_by_name["Registration"]
    assert watcher.full_name == "pluginregistration.Registration"


def test_dra_wire_names_are_the_kubelets() -> None:
    plugin = dra_pb2.DESCRIPTOR.services_by_name["DRAPlugin"]
    assert plugin.full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert [m.name for m in plugin.methods] == ["NodePrepareResources", "NodeUnprepareResources"]
    health = health_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"]
    assert health.full_name == "v1.DRAResourceHealth"
    assert health.methods_by_name["NodeWatchResources"].server_streaming
    assert [v.name for v in health_pb2.DESCRIPTOR.enum_types_by_name["HealthStatus"].values] == [
        "UNKNOWN",
        "HEALTHY",
        "UNHEALTHY",
    ]


def test_the_older_health_package_has_the_same_messages() -> None:
    older = healthv1alpha1_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"]
    assert older.full_name == "v1alpha1.DRAResourceHealth"
    for name, message in health_pb2.DESCRIPTOR.message_types_by_name.items():
        twin = healthv1alpha1_pb2.DESCRIPTOR.message_types_by_name[name]
        assert [(f.name, f.number, f.type) for f in message.fields] == [
            (f.name, f.number, f.type) for f in twin.fields
        ]
