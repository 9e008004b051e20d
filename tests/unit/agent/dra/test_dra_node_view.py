"""`nicfleetctl node` shows the agent's DRA plugin line (aggregator.ctl.render), and no
"NOT registered" device plugin when the agent runs only the DRA plugin."""

from __future__ import annotations

import io

import pytest

from aggregator.ctl.render import console_for, render_node
from proto.http import NodeDetail, NodeSummary
from proto.messages.status import (
    DevicePluginStatus,
    DraClaimState,
    DraPluginStatus,
    ResourceStatus,
)

UID = "0b5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
DRA = DraPluginStatus(
    state="registered",
    prepared=(DraClaimState(uid=UID, namespace="ml", name="a", devices=("mlx5-0",)),),
    failed=(
        DraClaimState(uid=UID.replace("0b", "1b"), namespace="ml", name="b", error="x"),
        DraClaimState(uid=UID.replace("0b", "2b"), namespace="ml", name="c", error="y"),
    ),
)
RESOURCE = ResourceStatus(name="rdma/ib", advertised=8, healthy=8, registration="registered")


def node_view(status: DevicePluginStatus | None) -> str:
    summary = NodeSummary(
        name="n1",
        state="ready",
        devices=0,
        ports_total=0,
        ports_active=0,
        ports_down=(),
        link_layers=(),
        max_rate_gbps=None,
        gpus=0,
        firmware=(),
        agent_version="t",
        errors=0,
        last_seen=100.0,
        age_s=1.0,
    )
    detail = NodeDetail(
        summary=summary,
        first_seen=50.0,
        snapshot=None,
        snapshot_received_at=None,
        counters=None,
        counters_received_at=None,
        device_plugin=status,
        events=(),
    )
    out = io.StringIO()
    render_node(console_for(out, {}), detail)
    return out.getvalue()


@pytest.mark.parametrize(
    ("status", "dra_line", "device_plugin_line"),
    [
        pytest.param(
            DevicePluginStatus(node="n1", observed_at=1.0, dra=DRA),
            "DRA plugin: registered, 1 claims prepared, 2 failed",
            None,
            id="dra-only",
        ),
        pytest.param(
            DevicePluginStatus(
                node="n1", observed_at=1.0, registered=True, resources=(RESOURCE,), dra=DRA
            ),
            "DRA plugin: registered, 1 claims prepared, 2 failed",
            "Device plugin (config generation 0, registered):",
            id="both",
        ),
        pytest.param(
            DevicePluginStatus(node="n1", observed_at=1.0),
            None,
            "Device plugin (config generation 0, NOT registered):",
            id="device-plugin-only",
        ),
    ],
)
def test_the_plugin_lines(
    status: DevicePluginStatus, dra_line: str | None, device_plugin_line: str | None
) -> None:
    lines = node_view(status).splitlines()
    assert (dra_line in lines) if dra_line else not any("DRA plugin" in li for li in lines)
    if device_plugin_line:
        assert device_plugin_line in lines
    else:
        assert not any("Device plugin" in li for li in lines)
