"""ACS on a lab tree read with reduced privilege: `config` files cut to the 64 (128 for
CardBus) bytes a reader without CAP_SYS_ADMIN gets. Each such file is one host error that
says so, the bridge is not claimed either way, and nothing else in the snapshot moves."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from agent.lab.render import render
from agent.lab.spec import load_builtin
from proto.inventory import NodeSnapshot

PCI = "bus/pci/devices"
# h100-iommu-acs: GPU0 and mlx5_0 share a switch whose downstream ports have ACS on.
ACS_ON = ("0000:17:00.0", "0000:17:01.0")
UPSTREAM = "0000:16:00.0"
HIDDEN = (
    "extended config space not readable: needs CAP_SYS_ADMIN (read {} bytes, the header only), "
    "so ACS is unknown; enable deploy/overlays/acs"
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    render(load_builtin("h100-iommu-acs"), tmp_path)
    return tmp_path


def _snapshot(root: Path) -> NodeSnapshot:
    return collect_snapshot(Sysfs(root), node="lab", seq=1, now=0.0, agent_version="test")


def _cut(root: Path, address: str, size: int) -> str:
    """Truncate one function's config; return its path as the snapshot names it."""
    config = (root / PCI / address / "config").resolve()
    config.write_bytes(config.read_bytes()[:size])
    return "/" + str(config.relative_to(root))


@pytest.mark.parametrize(
    ("cuts", "acs", "error"),
    [
        pytest.param({}, ACS_ON, None, id="privileged-full-4096"),
        pytest.param({ACS_ON[0]: 64}, ACS_ON[1:], HIDDEN.format(64), id="one-bridge-header-only"),
        pytest.param({ACS_ON[0]: 64, ACS_ON[1]: 64}, (), HIDDEN.format(64), id="both-header-only"),
        pytest.param({ACS_ON[1]: 128}, ACS_ON[:1], HIDDEN.format(128), id="cardbus-sized-read"),
        pytest.param({UPSTREAM: 64}, ACS_ON, HIDDEN.format(64), id="upstream-port-header-only"),
        pytest.param({ACS_ON[0]: 100}, ACS_ON[1:], "unparsable: truncated to 100 bytes",
                     id="odd-length-is-not-privilege"),
        pytest.param({ACS_ON[0]: 256}, ACS_ON[1:], None, id="256-bytes-no-extended-space"),
    ],
)  # fmt: skip
def test_header_only_config_is_reported_not_guessed(
    root: Path, cuts: dict[str, int], acs: tuple[str, ...], error: str | None
) -> None:
    clean = _snapshot(root)
    paths = {_cut(root, address, size) for address, size in cuts.items()}
    snap = _snapshot(root)
    assert snap.platform.acs_enabled_bridges == acs
    if error is None:
        assert snap.errors == ()
    else:
        assert {(e.path, e.error) for e in snap.errors} == {(p, error) for p in paths}
    assert (snap.devices, snap.gpus, snap.gpu_nic_topology) == (
        clean.devices, clean.gpus, clean.gpu_nic_topology,
    )  # fmt: skip


def test_a_wholly_unprivileged_host_names_every_bridge_it_could_not_judge(root: Path) -> None:
    """Every `config` in the tree cut to 64 bytes, as an agent without CAP_SYS_ADMIN reads
    them: one error per bridge on a GPU<->NIC path, each saying what is missing."""
    for config in root.glob("devices/**/config"):
        config.write_bytes(config.read_bytes()[:64])
    snap = _snapshot(root)
    assert snap.platform.acs_enabled_bridges == ()
    assert snap.errors
    assert {e.error for e in snap.errors} == {HIDDEN.format(64)}
    assert {e.path.rsplit("/", 2)[-2] for e in snap.errors} >= {*ACS_ON, UPSTREAM}
