"""aggregator.ctl.demodra: the demo's DRA views, from documents shaped like
`GET /api/v1/dra/slices` and the lab kubelet's lab-kubelet-dra.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aggregator.ctl.demodra import (
    agent_dra_args,
    dra_registered,
    kubelet_unhealthy,
    port_state,
    row_cells,
    slice_rows,
)

DRIVER = "rdma.nicfleet.io"


def device(name: str, state: str, **extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {
            "rdmaDevice": {"string": name.replace("-", "_")},
            "linkLayer": {"string": "InfiniBand"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:37"},
            "portState": {"string": state},
            **extra,
        },
    }


def a_slice(pool: str, *devices: dict[str, Any], driver: str = DRIVER) -> dict[str, Any]:
    return {"spec": {"driver": driver, "pool": {"name": pool}, "devices": list(devices)}}


def test_slice_rows_keep_only_our_driver_and_the_node() -> None:
    doc = {
        "items": [
            a_slice("n1", device("mlx5-0", "ACTIVE"), device("mlx5-3", "DOWN")),
            a_slice("n2", device("mlx5-0", "ACTIVE")),
            a_slice("n1", {"name": "gpu-0"}, driver="gpu.nvidia.com"),
        ]
    }
    rows = slice_rows(doc, "n1")
    assert [r["device"] for r in rows] == ["mlx5-0", "mlx5-3"]
    assert rows[1] == {
        "device": "mlx5-3",
        "rdma_device": "mlx5_3",
        "link_layer": "InfiniBand",
        "pcie_root": "pci0000:37",
        "port_state": "DOWN",
    }
    assert port_state(rows, "mlx5-3") == "DOWN"
    assert port_state(rows, "mlx5-9") is None
    assert slice_rows(None, "n1") == []


def test_a_missing_attribute_shows_as_a_dash() -> None:
    (row,) = slice_rows({"items": [a_slice("n1", {"name": "mlx5-0"})]}, "n1")
    assert row_cells(row) == ("mlx5-0", "-", "-", "-", "-")


def state(**driver: Any) -> dict[str, Any]:
    return {"registry": "/r", "drivers": {DRIVER: driver} if driver else {}}


@pytest.mark.parametrize(
    ("doc", "registered"),
    [
        pytest.param(None, False, id="no-file-yet"),
        pytest.param(state(), False, id="not-registered"),
        pytest.param(state(health_stream_open=True, devices=[]), False, id="no-devices-yet"),
        pytest.param(state(health_stream_open=False, devices=["mlx5-0"]), False, id="stream-ended"),
        pytest.param(state(health_stream_open=True, devices=["mlx5-0"]), True, id="registered"),
    ],
)
def test_dra_registered(doc: dict[str, Any] | None, registered: bool) -> None:
    assert dra_registered(doc) is registered


def test_kubelet_unhealthy_sorted_and_empty_without_the_driver() -> None:
    assert kubelet_unhealthy(state(unhealthy=["mlx5-3", "mlx5-1"])) == ["mlx5-1", "mlx5-3"]
    assert kubelet_unhealthy(state()) == []
    assert kubelet_unhealthy(None) == []


def test_agent_dra_args_keep_each_node_in_its_own_dirs() -> None:
    args = agent_dra_args(Path("/tmp/nf-x/n1"), Path("/w/n1.dra"))
    pairs = dict(zip(args[1::2], args[2::2], strict=False))
    assert args[0] == "--dra"
    assert pairs == {
        "--dra-claims": "dir",
        "--dra-claims-dir": "/w/n1.dra/claims",
        "--dra-state-dir": "/w/n1.dra/state",
        "--dra-plugins-dir": "/tmp/nf-x/n1/plugins",
        "--cdi-dir": "/w/n1.dra/cdi",
    }
