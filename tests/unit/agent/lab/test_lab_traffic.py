"""Lab traffic: a bounded, varying share of each ACTIVE port's rate in its data and packet
counters, written in place (the agent's held descriptors see it), none on a DOWN port,
error counters untouched; `drive` stops when told; the `lab traffic` command."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.counters.reader import CounterReader
from agent.host.sysfs import Sysfs
from agent.lab import traffic
from agent.lab.cli import lab
from agent.lab.faults import port_down
from agent.lab.render import render
from agent.lab.spec import load_builtin
from tests.support.waits import wait_until

IB = "class/infiniband"
HDR = traffic.Port("mlx5_0", 1, 200.0)


@pytest.fixture
def ib(tmp_path: Path) -> Path:
    """a100-ib-4nic: four single-port HDR (200 Gb/s) devices."""
    render(load_builtin("a100-ib-4nic"), tmp_path)
    return tmp_path


def _counter(root: Path, device: str, name: str) -> int:
    return int((root / IB / device / "ports/1/counters" / name).read_text())


def test_offered_load_swings_around_its_mean_within_bounds() -> None:
    mean = 200e9 / 8 * 0.1
    samples = [traffic.offered_bytes(HDR, 0.1, t / 10, receive=False) for t in range(600)]
    assert all(mean * 0.8 <= s <= mean * 1.2 for s in samples)
    assert sum(samples) / len(samples) == pytest.approx(mean, rel=0.01)
    assert max(samples) - min(samples) > mean * 0.3  # a wave, not a flat line
    other = traffic.Port("mlx5_1", 1, 200.0)
    assert traffic.offered_bytes(other, 0.1, 0.0, receive=False) != samples[0]
    assert traffic.offered_bytes(HDR, 0.0, 5.0, receive=True) == 0.0


@pytest.mark.parametrize(
    ("load", "interval"),
    [pytest.param(1.5, 1.0, id="load"), pytest.param(0.1, 0.01, id="interval")],
)
def test_settings_are_bounded(load: float, interval: float) -> None:
    with pytest.raises(ValueError, match=r"is not in 0\.\.1|is below 0\.1 s"):
        traffic.TrafficSettings(load=load, interval_s=interval)


def test_tick_moves_active_ports_in_place_and_leaves_errors_alone(ib: Path) -> None:
    port_down(ib, "mlx5_1", 1)
    with CounterReader(Sysfs(ib)) as reader:
        reader.collect(node="lab", seq=1, now=1.0)
        assert [p.device for p in traffic.active_ports(ib)] == ["mlx5_0", "mlx5_2", "mlx5_3"]
        moved = traffic.Traffic().tick(ib, 0.1, at=0.0, seconds=1.0)
        assert moved == 3 * 6  # data, packets and unicast packets, both ways
        ports = {p.device: p for p in reader.collect(node="lab", seq=2, now=2.0).ports}
    sent = traffic.offered_bytes(HDR, 0.1, 0.0, receive=False)
    assert ports["mlx5_0"].tx_bytes == int(sent / traffic.WORD_BYTES) * traffic.WORD_BYTES
    packets = _counter(ib, "mlx5_0", "port_xmit_packets")
    assert packets == int(sent / traffic.PACKET_BYTES) > 0
    assert _counter(ib, "mlx5_0", "unicast_xmit_packets") == packets
    assert (ports["mlx5_1"].tx_bytes, ports["mlx5_1"].rx_bytes) == (0, 0)  # DOWN: no traffic
    assert all(v == 0 for k, v in ports["mlx5_0"].counters.items() if "err" in k)


async def test_drive_runs_until_stopped(ib: Path) -> None:
    stop = threading.Event()
    settings = traffic.TrafficSettings(load=0.01, interval_s=0.1)
    thread = threading.Thread(target=traffic.drive, args=([ib], settings, stop))
    thread.start()
    try:
        await wait_until(lambda: _counter(ib, "mlx5_3", "port_rcv_data") > 0, what="traffic")
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_lab_traffic_command_stops_after_its_duration(ib: Path) -> None:
    args = ["traffic", "--root", str(ib), "--interval", "0.1", "--duration", "0.5"]
    done = CliRunner().invoke(lab, args)
    assert done.exit_code == 0, done.output
    assert _counter(ib, "mlx5_0", "port_xmit_data") > 0
    missing = CliRunner().invoke(lab, ["traffic", "--root", str(ib / "nope")])
    assert missing.exit_code == 2
