"""The demo's DRA side: where each node's DRA plugin registers with its lab kubelet, when
the lab kubelet has it (registered, health stream open, devices listed), and the compact
views of `GET /api/v1/dra/slices` and the lab kubelet's DRA state file the demo prints and
puts in its JSON summary. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from proto.dranames import DRIVER

# What `nicfleet-agent lab kubelet --dra-registry DIR` writes in DIR
# (agent.lab.kubeletrun.DRA_STATE_FILE; nicfleetctl may not import the agent).
DRA_STATE: Final = "lab-kubelet-dra.json"
REGISTRY: Final = "plugins_registry"  # under each node's kubelet dir, as on a real node
PLUGINS: Final = "plugins"  # the kubelet's plugins dir: <driver>/dra.sock
SLICE_COLUMNS: Final = ("DEVICE", "RDMA-DEVICE", "LINK-LAYER", "PCIE-ROOT", "PORT-STATE")


def registry_dir(kubelet_dir: Path) -> Path:
    return kubelet_dir / REGISTRY


def agent_dra_args(kubelet_dir: Path, node_dir: Path) -> list[str]:
    """`nicfleet-agent run` options of a demo node's DRA plugin: sockets in the short
    kubelet dir, claims (read from a directory: the demo has no Kubernetes API), the
    checkpoint and CDI specs in the node's own dir under the workdir."""
    return [
        "--dra", "--dra-claims", "dir",
        "--dra-claims-dir", str(node_dir / "claims"),
        "--dra-state-dir", str(node_dir / "state"),
        "--dra-plugins-dir", str(kubelet_dir / PLUGINS),
        "--cdi-dir", str(node_dir / "cdi"),
    ]  # fmt: skip


def dra_registered(state: Mapping[str, Any] | None) -> bool:
    """The lab kubelet has our driver: registered, its health stream open, devices listed."""
    if state is None:
        return False
    driver = state.get("drivers", {}).get(DRIVER)
    return bool(driver and driver.get("health_stream_open") and driver.get("devices"))


def kubelet_unhealthy(state: Mapping[str, Any] | None) -> list[str]:
    """The devices the lab kubelet's last health message calls anything but Healthy."""
    driver = (state or {}).get("drivers", {}).get(DRIVER) or {}
    return sorted(driver.get("unhealthy", []))


def _attr(device: Mapping[str, Any], name: str) -> str:
    value = device.get("attributes", {}).get(name)
    if not isinstance(value, Mapping) or not value:
        return ""
    return str(next(iter(value.values())))


def slice_rows(slices: Mapping[str, Any] | None, node: str) -> list[dict[str, str]]:
    """Our devices in `node`'s pool, in slice order: the columns the demo shows."""
    rows: list[dict[str, str]] = []
    for item in (slices or {}).get("items", []):
        spec = item.get("spec", {})
        if spec.get("driver") != DRIVER or spec.get("pool", {}).get("name") != node:
            continue
        for device in spec.get("devices", []):
            rows.append(
                {
                    "device": str(device.get("name", "")),
                    "rdma_device": _attr(device, "rdmaDevice"),
                    "link_layer": _attr(device, "linkLayer"),
                    "pcie_root": _attr(device, "resource.kubernetes.io/pcieRoot"),
                    "port_state": _attr(device, "portState"),
                }
            )
    return rows


def port_state(rows: Sequence[Mapping[str, str]], device: str) -> str | None:
    return next((r["port_state"] for r in rows if r["device"] == device), None)


def row_cells(row: Mapping[str, str]) -> tuple[str, ...]:
    """One row's cells in SLICE_COLUMNS order ("-" for an attribute not published)."""
    keys = ("device", "rdma_device", "link_layer", "pcie_root", "port_state")
    return tuple(row[k] or "-" for k in keys)
