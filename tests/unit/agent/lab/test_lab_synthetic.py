"""Synthetic benchmark specs: valid (they survive a YAML round trip through the loader's
checks) at 2, 16 and 64 cards, shaped like mlx5 hardware, bounded by real counter names,
and rendered into the tree the benchmark reads."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agent.lab.models import ALL_HW_COUNTERS, PMA_COUNTERS
from agent.lab.nodespec import guid_text
from agent.lab.render import render
from agent.lab.spec import parse_spec
from agent.lab.synthetic import synthetic_spec


@pytest.mark.parametrize("cards", [2, 16, 64])
def test_synthetic_spec_is_valid_and_mlx5_shaped(cards: int) -> None:
    spec = synthetic_spec(cards)
    assert parse_spec(msgspec.yaml.encode(spec), "roundtrip") == spec
    assert len(spec.adapters) == 2 * cards  # dual-port cards: two functions, two devices
    assert [a.name for a in spec.adapters] == [f"mlx5_{n}" for n in range(2 * cards)]
    addresses = [a.address for a in spec.adapters]
    assert addresses == sorted(addresses)  # mlx5_N numbered in PCI order
    per_card = Counter(a.address[:-2] for a in spec.adapters)
    assert set(per_card.values()) == {2}
    images: dict[str, set[str]] = {a.address[:-2]: set() for a in spec.adapters}
    for a in spec.adapters:
        images[a.address[:-2]].add(guid_text(a.sys_image_guid or a.node_guid))
    assert all(len(v) == 1 for v in images.values())
    assert len({a.node_guid for a in spec.adapters}) == 2 * cards
    assert len(spec.gpus) == 8
    assert Counter(hb.numa_node for hb in spec.host_bridges) == {0: 4, 1: 4} or cards == 64
    assert all(len(sw.downstream) <= 32 for sw in spec.switches)
    port = spec.adapters[0].ports[0]
    assert port.counter_names == list(PMA_COUNTERS)
    assert port.hw_counter_names == [*ALL_HW_COUNTERS, "lifespan"]


def test_synthetic_sixteen_cards_renders_the_benchmark_node(tmp_path: Path) -> None:
    render(synthetic_spec(16), tmp_path)
    devices = sorted(os.listdir(tmp_path / "class/infiniband"))
    assert len(devices) == 32
    port = tmp_path / "class/infiniband/mlx5_31/ports/1"
    assert len(os.listdir(port / "counters")) == 21
    assert len(os.listdir(port / "hw_counters")) == 30
    assert (port / "state").read_text() == "4: ACTIVE\n"
    assert (port / "rate").read_text() == "400 Gb/sec (4X NDR)\n"
    gpus = [d for d in os.listdir(tmp_path / "bus/pci/devices")
            if (tmp_path / "bus/pci/devices" / d / "vendor").read_text() == "0x10de\n"]  # fmt: skip
    assert len(gpus) == 8
    # GPU k and its switch's cards share the upstream port: PIX, as on an HGX board.
    gpu0 = (tmp_path / "bus/pci/devices" / sorted(gpus)[0]).resolve()
    nic0 = (tmp_path / "class/infiniband/mlx5_0/device").resolve()
    assert gpu0.parent.parent == nic0.parent.parent


def test_synthetic_options() -> None:
    small = synthetic_spec(1, ports_per_adapter=1, hw_counters=0, counters=5, gpus=0,
                           link_layer="Ethernet", peermem="nv_peer_mem")  # fmt: skip
    port = small.adapters[0].ports[0]
    assert (port.link_layer, port.lid, port.hw_counter_names) == ("Ethernet", 0, [])
    assert port.counter_names == list(PMA_COUNTERS)[:5]
    assert port.netdev == "enp19s0f0np0"
    assert "nv_peer_mem" in small.modules and "nvidia_peermem" not in small.modules
    assert "nvidia_peermem" not in synthetic_spec(1, peermem=None).modules
    assert len(synthetic_spec(128, gpus=8).adapters) == 256


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"adapters": 0}, "adapters must be 1..128", id="no-cards"),
        pytest.param({"adapters": 129}, "adapters must be 1..128", id="too-many"),
        pytest.param({"adapters": 2, "counters": 25}, "counters must be 0..21", id="counters"),
        pytest.param({"adapters": 2, "hw_counters": 31}, "hw_counters must be 0..30", id="hw"),
        pytest.param({"adapters": 2, "ports_per_adapter": 9}, "1..8", id="functions"),
        pytest.param({"adapters": 128, "gpus": 32}, "do not fit one PCI domain", id="buses"),
    ],
)
def test_synthetic_bounds(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        synthetic_spec(**kwargs)
