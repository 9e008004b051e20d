"""The counter hot loop: descriptors opened once and re-read with pread, rediscovery when
asked or when a device goes away, no zero-filling, and the same values as a snapshot."""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.counters.reader import CounterReader
from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from proto.messages.counters import CounterBatch, PortCounters
from tests.support.sysfs_trees import (
    NODE_EXPORTER_SYS,
    PROCFS_SYS,
    BlockingSysfs,
    attrs,
    link,
    materialize,
    released,
    write,
)

PF0 = "devices/pci0000:00/0000:00:01.0/0000:3b:00.0"
PF1 = "devices/pci0000:00/0000:00:02.0/0000:5e:00.0"
MLX5_0 = f"{PF0}/infiniband/mlx5_0"
MLX5_1 = f"{PF1}/infiniband/mlx5_1"


def _device(root: Path, fn: str, name: str) -> str:
    ib = f"{fn}/infiniband/{name}"
    link(root, f"{ib}/device", "../../../" + fn.rsplit("/", 1)[-1])
    link(root, f"class/infiniband/{name}", f"../../{ib}")
    return ib


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """mlx5_0: one port with counters/ and hw_counters/; mlx5_1: a mlx4-style port 2
    with counters_ext/ only."""
    root = tmp_path / "sys"
    ib0 = _device(root, PF0, "mlx5_0")
    attrs(root, f"{ib0}/ports/1/counters", port_xmit_data="1000", port_rcv_data="2000",
          symbol_error="0")  # fmt: skip
    attrs(root, f"{ib0}/ports/1/hw_counters", out_of_buffer="7", lifespan="10")
    ib1 = _device(root, PF1, "mlx5_1")
    attrs(root, f"{ib1}/ports/1/counters", port_xmit_data="5")
    attrs(root, f"{ib1}/ports/2/counters_ext", port_xmit_data_64="9", port_rcv_data_64="3")
    return root


@pytest.fixture
def reader(root: Path) -> Iterator[CounterReader]:
    with CounterReader(Sysfs(root)) as counter_reader:
        yield counter_reader


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _ports(batch: CounterBatch) -> dict[tuple[str, int], PortCounters]:
    return {(p.device, p.port): p for p in batch.ports}


def _mlx5_0(reader: CounterReader, seq: int) -> PortCounters:
    return _ports(reader.collect(node="n", seq=seq, now=float(seq)))["mlx5_0", 1]


def test_first_sample_reads_every_group_raw(reader: CounterReader) -> None:
    batch = reader.collect(node="n1", seq=7, now=12.5)
    assert (batch.node, batch.seq, batch.collected_at, batch.interval_s) == ("n1", 7, 12.5, None)
    ports = _ports(batch)
    assert list(ports) == [("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_1", 2)]
    first = ports["mlx5_0", 1]
    assert first.counters == {"port_rcv_data": 2000, "port_xmit_data": 1000, "symbol_error": 0}
    assert first.hw_counters == {"lifespan": 10, "out_of_buffer": 7}
    assert (first.rx_bytes, first.tx_bytes) == (8000, 4000)  # 4-octet units
    ext = ports["mlx5_1", 2]
    assert (ext.counters, ext.counters_ext) == ({}, {"port_rcv_data_64": 3, "port_xmit_data_64": 9})
    assert (ext.rx_bytes, ext.tx_bytes) == (12, 36)
    assert (ports["mlx5_1", 1].rx_bytes, ports["mlx5_1", 1].tx_bytes) == (None, 20)
    assert (first.rates, first.saturated, first.resets) == ({}, (), ())  # agent.counters.rates' job
    assert batch.errors == ()
    assert reader.collect(node="n1", seq=8, now=13.0).interval_s == 0.5


def test_samples_reuse_descriptors(root: Path, reader: CounterReader) -> None:
    before = _open_fds()
    reader.collect(node="n", seq=1, now=1.0)
    assert reader.open_files == 8  # every counter file, lifespan included
    held = _open_fds()
    assert held == before + 8
    for seq in range(2, 7):
        reader.collect(node="n", seq=seq, now=float(seq))
        assert _open_fds() == held  # no open/close per sample, nothing leaked


def test_atomically_replaced_file_keeps_the_old_inode_until_rediscover(
    root: Path, reader: CounterReader
) -> None:
    path = root / MLX5_0 / "ports/1/counters/port_xmit_data"
    reader.collect(node="n", seq=1, now=1.0)
    tmp = path.with_name(".new")
    tmp.write_text("5000\n")
    os.replace(tmp, path)  # a new inode under the old name
    # The sample reads the descriptor opened at discovery, so it still sees the old file:
    # proof that nothing was opened by name again.
    assert _mlx5_0(reader, 2).counters["port_xmit_data"] == 1000
    reader.rediscover()
    assert _mlx5_0(reader, 3).counters["port_xmit_data"] == 5000


def test_in_place_rewrite_is_seen_by_pread(root: Path, reader: CounterReader) -> None:
    reader.collect(node="n", seq=1, now=1.0)
    with open(root / MLX5_0 / "ports/1/hw_counters/out_of_buffer", "r+") as f:
        f.write("9")  # what sysfs does: same file, new show() output
    assert _mlx5_0(reader, 2).hw_counters["out_of_buffer"] == 9


class RemovableSysfs(Sysfs):
    """On a real kernfs, a descriptor of a removed device's attribute reads ENODEV; an
    ordinary filesystem keeps serving the unlinked inode, so this fake says it instead."""

    removed: set[str]

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.removed = set()

    def _pread(self, fd: int, path: str, size: int) -> bytes:
        if any(path.startswith(f"/class/infiniband/{name}/") for name in self.removed):
            raise OSError(errno.ENODEV, "No such device")
        return super()._pread(fd, path, size)


def test_removed_device_is_rediscovered_at_once(root: Path) -> None:
    sysfs = RemovableSysfs(root)
    with CounterReader(sysfs) as reader:
        reader.collect(node="n", seq=1, now=1.0)
        before = _open_fds()
        (root / "class/infiniband/mlx5_1").unlink()
        sysfs.removed.add("mlx5_1")
        batch = reader.collect(node="n", seq=2, now=2.0)
        # The sample noticed ENODEV, rediscovered and read the new device set: the gone
        # device is absent, not half-read, and its descriptors were closed.
        assert [(p.device, p.port) for p in batch.ports] == [("mlx5_0", 1)]
        assert batch.errors == ()
        assert not reader.stale
        assert reader.open_files == 5
        assert _open_fds() == before - 3


def test_new_device_appears_on_rediscover(root: Path, reader: CounterReader) -> None:
    reader.collect(node="n", seq=1, now=1.0)
    ib = _device(root, "devices/pci0000:00/0000:00:03.0/0000:7f:00.0", "mlx5_2")
    attrs(root, f"{ib}/ports/1/counters", port_rcv_data="9")
    assert ("mlx5_2", 1) not in _ports(reader.collect(node="n", seq=2, now=2.0))
    reader.rediscover()
    assert reader.stale
    added = _ports(reader.collect(node="n", seq=3, now=3.0))["mlx5_2", 1]
    assert (added.counters, added.rx_bytes) == ({"port_rcv_data": 9}, 36)


def test_close_releases_every_descriptor(root: Path) -> None:
    before = _open_fds()
    reader = CounterReader(Sysfs(root))
    reader.collect(node="n", seq=1, now=1.0)
    assert _open_fds() == before + 8
    reader.close()
    assert (_open_fds(), reader.open_files, reader.stale) == (before, 0, True)
    assert len(reader.collect(node="n", seq=2, now=2.0).ports) == 3  # usable again
    reader.close()


@pytest.mark.parametrize(
    ("content", "error"),
    [
        pytest.param("N/A (no PMA)\n", "N/A (no PMA)", id="no-pma"),
        pytest.param("lots\n", "unparsable: 'lots'", id="word"),
        pytest.param("", "empty", id="empty"),
        pytest.param("-3\n", "unparsable: '-3'", id="negative"),
        pytest.param("9" * 70, "EFBIG", id="longer-than-a-counter"),
        pytest.param(b"\x00\xff\x10\n", "unparsable: '\\x00\ufffd\\x10'", id="binary"),
    ],
)
def test_bad_counter_is_an_error_never_a_zero(
    root: Path, reader: CounterReader, content: str | bytes, error: str
) -> None:
    write(root, f"{MLX5_0}/ports/1/counters/symbol_error", content)
    for seq in (1, 2):  # at discovery and from the held descriptor
        batch = reader.collect(node="n", seq=seq, now=float(seq))
        assert "symbol_error" not in _ports(batch)["mlx5_0", 1].counters
        assert [(e.path, e.error) for e in batch.errors] == [
            ("/class/infiniband/mlx5_0/ports/1/counters/symbol_error", error)
        ]
        assert _ports(batch)["mlx5_0", 1].counters["port_xmit_data"] == 1000


@pytest.mark.parametrize(
    ("make", "error"),
    [
        pytest.param(lambda p: p.mkdir(), "EISDIR", id="directory"),
        pytest.param(lambda p: os.mkfifo(p), "not a regular file", id="fifo"),
        pytest.param(lambda p: p.symlink_to("gone"), "ELOOP", id="dangling-link"),
    ],
)
def test_non_files_are_read_per_sample_and_reported(
    root: Path, reader: CounterReader, make: object, error: str
) -> None:
    target = root / MLX5_0 / "ports/1/counters/bad"
    make(target)  # type: ignore[operator]
    for seq in (1, 2):
        batch = reader.collect(node="n", seq=seq, now=float(seq))
        bad = [e.error for e in batch.errors if e.path.endswith("/counters/bad")]
        assert bad == [error]
    assert reader.open_files == 8  # the bad one is not held open


def test_files_past_the_descriptor_budget_are_read_per_sample(root: Path) -> None:
    with CounterReader(Sysfs(root), max_open=3) as reader:
        for seq in (1, 2):
            batch = reader.collect(node="n", seq=seq, now=float(seq))
            assert reader.open_files == 3
            assert batch.errors == ()
            assert _ports(batch)["mlx5_1", 2].counters_ext == {
                "port_rcv_data_64": 3, "port_xmit_data_64": 9,
            }  # fmt: skip


def test_running_out_of_descriptors_is_recorded_not_raised(root: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    reader = CounterReader(Sysfs(root), timeout=None)  # inline: no thread to start
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (_open_fds() + 4, hard))
        batch = reader.collect(node="n", seq=1, now=1.0)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        reader.close()
    values = {(p.device, p.port, name) for p in batch.ports for name in p.counters_ext}
    values |= {(p.device, p.port, name) for p in batch.ports for name in p.counters}
    values |= {(p.device, p.port, name) for p in batch.ports for name in p.hw_counters}
    assert len(values) + len(batch.errors) == 8
    assert {e.error for e in batch.errors} <= {"EMFILE"}
    assert _ports(batch)["mlx5_0", 1].counters["port_xmit_data"] == 1000


def test_hung_counter_read_is_bounded(root: Path) -> None:
    with released(BlockingSysfs(root, "/hw_counters/out_of_buffer")) as sysfs:
        reader = CounterReader(sysfs, timeout=1.0)  # the retry must fit, even stalled
        try:
            batch = reader.collect(node="n", seq=1, now=1.0)
        finally:
            reader.close()
    port = _ports(batch)["mlx5_0", 1]
    assert port.hw_counters == {"lifespan": 10}
    assert port.counters["port_xmit_data"] == 1000
    assert [(e.path, e.error) for e in batch.errors] == [
        ("/class/infiniband/mlx5_0/ports/1/hw_counters/out_of_buffer", "ETIMEDOUT")
    ]
    assert len(batch.ports) == 3


@pytest.fixture(scope="module")
def node_exporter_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return materialize(NODE_EXPORTER_SYS, tmp_path_factory.mktemp("ne") / "sys")


@pytest.mark.parametrize("tree", [pytest.param("procfs", id="procfs"), pytest.param("ne", id="ne")])
def test_batch_matches_the_snapshot_port_counters(tree: str, node_exporter_root: Path) -> None:
    sysfs = Sysfs(PROCFS_SYS if tree == "procfs" else node_exporter_root)
    snapshot = collect_snapshot(sysfs, node="n", seq=1, now=0.0, agent_version="t")
    with CounterReader(sysfs) as reader:
        batch = reader.collect(node="n", seq=1, now=0.0)
    assert [
        (p.device, p.port, p.counters, p.counters_ext, p.hw_counters, p.rx_bytes, p.tx_bytes)
        for p in batch.ports
    ] == [
        (d.name, p.port, p.counters, p.counters_ext, p.hw_counters, p.rx_bytes, p.tx_bytes)
        for d in snapshot.devices
        for p in d.ports
    ]
    counter_errors = {e for d in snapshot.devices for e in d.errors if "counters" in e.path}
    assert set(batch.errors) == counter_errors
