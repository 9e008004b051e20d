"""Faults change exactly the files they claim, in kernel format, in place by default;
bad targets fail with a FaultError naming the path; counter resets, ACS edits, RDMA device
removal and re-add; plus the `lab fault` CLI."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.host import parse
from agent.lab import pciconfig
from agent.lab.cli import lab
from agent.lab.faults import (
    Change,
    FaultError,
    bump_counter,
    counter_reset,
    padded,
    pcie_width_drop,
    port_down,
    port_up,
    set_acs,
    write_in_place,
)
from agent.lab.hotplug import device_add, device_remove
from agent.lab.render import render
from agent.lab.spec import load_builtin, parse_spec

IB = "class/infiniband"


@pytest.fixture
def ib(tmp_path: Path) -> Path:
    """a100-ib-4nic: four single-port IB devices, IPoIB ib0..ib3."""
    render(load_builtin("a100-ib-4nic"), tmp_path)
    return tmp_path


@pytest.fixture
def eth(tmp_path: Path) -> Path:
    """roce-cx6dx-2: one dual-port ConnectX-6 Dx (mlx5_0/mlx5_1 on d8:00.0/.1)."""
    render(load_builtin("roce-cx6dx-2"), tmp_path)
    return tmp_path


def _read(root: Path, path: str) -> str:
    return (root / path).read_text()


def test_port_down_changes_state_phys_state_and_netdev(ib: Path) -> None:
    before = time.time()
    record = port_down(ib, "mlx5_1", 1)
    assert before <= record.injected_at <= time.time()
    assert (record.fault, record.target) == ("port-down", "mlx5_1/1")
    assert record.changes == (
        Change(path=f"{IB}/mlx5_1/ports/1/state", old="4: ACTIVE", new="1: DOWN"),
        Change(path=f"{IB}/mlx5_1/ports/1/phys_state", old="5: LinkUp", new="3: Disabled"),
        Change(path="class/net/ib1/operstate", old="up", new="down"),
        Change(path="class/net/ib1/carrier", old="1", new="0"),
    )
    assert _read(ib, f"{IB}/mlx5_1/ports/1/state") == "1: DOWN\n"
    assert _read(ib, f"{IB}/mlx5_1/ports/1/phys_state") == "3: Disabled\n"
    assert _read(ib, "class/net/ib1/operstate") == "down\n"
    assert _read(ib, "class/net/ib1/carrier") == "0\n"
    # nothing else moved
    assert _read(ib, f"{IB}/mlx5_0/ports/1/state") == "4: ACTIVE\n"
    assert _read(ib, "class/net/ib0/operstate") == "up\n"


def test_port_up_restores_a_down_port(ib: Path) -> None:
    port_down(ib, "mlx5_2", 1)
    record = port_up(ib, "mlx5_2", 1)
    # Written in this order: the link trains (DOWN/LinkUp, a state the hardware passes
    # through), then the port goes ACTIVE; a poll in between never reads ACTIVE/Disabled.
    assert [c.new for c in record.changes] == ["5: LinkUp", "4: ACTIVE", "up", "1"]
    assert _read(ib, f"{IB}/mlx5_2/ports/1/state") == "4: ACTIVE\n"
    assert _read(ib, f"{IB}/mlx5_2/ports/1/phys_state") == "5: LinkUp\n"
    assert _read(ib, "class/net/ib2/carrier") == "1\n"


def test_port_down_on_one_function_of_a_dual_port_card(eth: Path) -> None:
    port_down(eth, "mlx5_1", 1)
    assert _read(eth, "class/net/enp216s0f1np1/operstate") == "down\n"
    assert _read(eth, "class/net/enp216s0f0np0/operstate") == "up\n"
    assert _read(eth, f"{IB}/mlx5_0/ports/1/state") == "4: ACTIVE\n"


@pytest.mark.parametrize(
    ("name", "delta", "path", "new"),
    [
        pytest.param("port_rcv_errors", 5, "counters/port_rcv_errors", "5", id="pma"),
        pytest.param("out_of_buffer", 7, "hw_counters/out_of_buffer", "7", id="hw-by-name"),
        pytest.param("hw_counters/rp_cnp_handled", 3, "hw_counters/rp_cnp_handled", "3", id="hw"),
        pytest.param(
            "counters/port_xmit_data",
            2**40,
            "counters/port_xmit_data",
            "1099511627776",
            id="64-bit-data",
        ),
        pytest.param("symbol_error", 70_000, "counters/symbol_error", "65535", id="saturates-16"),
        pytest.param("link_downed", 300, "counters/link_downed", "255", id="saturates-8"),
        pytest.param(
            "out_of_sequence", 2**32 + 2, "hw_counters/out_of_sequence", "2", id="wraps-32"
        ),
        pytest.param("port_rcv_errors", 0, "counters/port_rcv_errors", "0", id="zero-delta"),
    ],
)
def test_bump_counter(eth: Path, name: str, delta: int, path: str, new: str) -> None:
    record = bump_counter(eth, "mlx5_0", 1, name, delta)
    full = f"{IB}/mlx5_0/ports/1/{path}"
    assert record.changes == (Change(path=full, old="0", new=new),)
    assert record.target == f"mlx5_0/1/{path}"
    assert _read(eth, full) == f"{new}\n"


def test_bump_counter_accumulates(eth: Path) -> None:
    bump_counter(eth, "mlx5_0", 1, "port_rcv_errors", 2)
    record = bump_counter(eth, "mlx5_0", 1, "port_rcv_errors", 3)
    assert (record.changes[0].old, record.changes[0].new) == ("2", "5")


def test_pcie_width_drop_retrains_both_ends_of_the_link(eth: Path) -> None:
    record = pcie_width_drop(eth, "0000:d8:00.1", 8)
    ends = ["0000:d7:01.0", "0000:d8:00.0", "0000:d8:00.1"]  # root port, both functions
    assert [c.path for c in record.changes] == [
        f"bus/pci/devices/{a}/{f}" for a in ends for f in ("current_link_width", "config")
    ]
    assert {(c.old, c.new) for c in record.changes} == {("16", "8")}
    for address in ends:
        assert _read(eth, f"bus/pci/devices/{address}/current_link_width") == "8\n"
        assert _read(eth, f"bus/pci/devices/{address}/max_link_width") == "16\n"
        config = (eth / f"bus/pci/devices/{address}/config").read_bytes()
        exp = pciconfig.find_capability(config, pciconfig.CAP_EXP)
        assert exp is not None
        assert int.from_bytes(config[exp + 0x12 : exp + 0x14], "little") >> 4 & 0x3F == 8
    assert _read(eth, "bus/pci/devices/0000:3b:00.0/current_link_width") == "16\n"


@pytest.mark.parametrize(
    ("call", "path_end", "message"),
    [
        pytest.param(
            lambda r: port_down(r, "mlx5_9", 1),
            f"{IB}/mlx5_9",
            "no such RDMA device",
            id="no-device",
        ),
        pytest.param(
            lambda r: port_up(r, "mlx5_0", 2), f"{IB}/mlx5_0/ports/2", "no such port", id="no-port"
        ),
        pytest.param(
            lambda r: port_down(r, "../x", 1),
            "../x",
            "not an RDMA device name",
            id="device-name-escapes",
        ),
        pytest.param(
            lambda r: bump_counter(r, "mlx5_0", 1, "nope", 1),
            "hw_counters/nope",
            "no such counter",
            id="no-counter",
        ),
        pytest.param(
            lambda r: bump_counter(r, "mlx5_0", 1, "../state", 1),
            "../state",
            "expected a counter name",
            id="counter-path-escapes",
        ),
        pytest.param(
            lambda r: counter_reset(r, "mlx5_0", 3),
            f"{IB}/mlx5_0/ports/3",
            "no such port",
            id="reset-no-port",
        ),
        pytest.param(
            lambda r: set_acs(r, "0000:d8:00.0", 0x1D),
            "0000:d8:00.0/config",
            "no ACS extended capability",
            id="acs-on-an-endpoint",
        ),
        pytest.param(
            lambda r: set_acs(r, "0000:d7:01.0", 0x10000),
            "0000:d7:01.0/config",
            "not a 16-bit value",
            id="acs-too-wide",
        ),
        pytest.param(
            lambda r: device_remove(r, "mlx5_5"), f"{IB}/mlx5_5", "no such RDMA", id="rm-none"
        ),
        pytest.param(
            lambda r: device_add(r, "mlx5_0"),
            ".lab-removed/mlx5_0",
            "no device of that name was removed",
            id="add-not-removed",
        ),
        pytest.param(
            lambda r: bump_counter(r, "mlx5_0", 1, "port_rcv_errors", -1),
            "port_rcv_errors",
            "delta must be >= 0",
            id="negative-delta",
        ),
        pytest.param(
            lambda r: pcie_width_drop(r, "0000:99:00.0", 8),
            "bus/pci/devices/0000:99:00.0",
            "no such PCI device",
            id="no-pci-device",
        ),
        pytest.param(
            lambda r: pcie_width_drop(r, "d8:00.0", 8),
            "d8:00.0",
            "not a PCI address",
            id="bad-address",
        ),
        pytest.param(
            lambda r: pcie_width_drop(r, "0000:d8:00.0", 32),
            "0000:d8:00.0/current_link_width",
            "width 32 not in 1..16",
            id="wider-than-max",
        ),
        pytest.param(
            lambda r: port_down(r / "absent", "mlx5_0", 1),
            "absent",
            "no such directory",
            id="no-tree",
        ),
    ],
)
def test_bad_target_names_the_path(
    eth: Path, call: Callable[[Path], object], path_end: str, message: str
) -> None:
    with pytest.raises(FaultError, match=message) as info:
        call(eth)
    assert info.value.path.endswith(path_end)


def test_non_numeric_counter_is_refused(eth: Path) -> None:
    (eth / IB / "mlx5_0/ports/1/counters/symbol_error").write_text("N/A (no PMA)\n")
    with pytest.raises(FaultError, match="does not hold a number"):
        bump_counter(eth, "mlx5_0", 1, "symbol_error", 1)


def test_atomic_write_replaces_the_file_and_leaves_no_temp_files(eth: Path) -> None:
    state = eth / IB / "mlx5_0/ports/1/state"
    inode = state.stat().st_ino
    port_down(eth, "mlx5_0", 1, atomic=True)
    assert state.stat().st_ino != inode
    assert os.listdir(eth / ".lab-tmp") == []
    assert not any(name.startswith(".") for name in os.listdir(state.parent))


def test_in_place_write_reaches_an_open_descriptor(eth: Path) -> None:
    counter = eth / IB / "mlx5_0/ports/1/counters/port_rcv_errors"
    fd = os.open(counter, os.O_RDONLY)
    try:
        bump_counter(eth, "mlx5_0", 1, "port_rcv_errors", 12345, atomic=False)
        assert os.pread(fd, 64, 0) == b"12345\n"
        port_down(eth, "mlx5_0", 1, atomic=False)
        bump_counter(eth, "mlx5_0", 1, "port_rcv_errors", 0, atomic=False)
        assert os.pread(fd, 64, 0) == b"12345\n"
    finally:
        os.close(fd)
    assert (eth / IB / "mlx5_0/ports/1/state").read_text() == "1: DOWN\n"


def test_concurrent_reader_never_sees_a_partial_value(eth: Path) -> None:
    counter = eth / IB / "mlx5_0/ports/1/counters/port_xmit_data"
    seen: set[str] = set()
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            seen.add(counter.read_text())

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for _ in range(300):  # 0 -> 999...9 and back to a short value never tears
            bump_counter(eth, "mlx5_0", 1, "port_xmit_data", 999_999_999_999, atomic=True)
    finally:
        done.set()
        thread.join(timeout=10)
    assert all(text.endswith("\n") and text[:-1].isdigit() for text in seen), seen - {""}
    assert all(int(text) % 999_999_999_999 == 0 for text in seen)


@pytest.mark.parametrize(
    ("old", "new", "parse"),
    [
        pytest.param(b"4: ACTIVE\n", b"1: DOWN\n", parse.parse_port_state, id="port-state"),
        pytest.param(b"5: LinkUp\n", b"3: Disabled\n", parse.parse_phys_state, id="longer"),
        pytest.param(b"1234567\n", b"0\n", parse.parse_counter, id="counter-reset"),
    ],
)
def test_in_place_shrink_reads_as_the_new_value_midway(
    eth: Path, old: bytes, new: bytes, parse: Callable[[str], object]
) -> None:
    """Shrinking in place is pad, then truncate: a reader between the two (the agent's
    pread) parses the new value, never the new head followed by the old tail."""
    midway = padded(new, len(old)) if len(new) < len(old) else new
    assert len(midway) == max(len(old), len(new))
    assert parse(midway.decode()) == parse(new.decode())
    path = eth / IB / "mlx5_0/ports/1/counters/symbol_error"
    path.write_bytes(old)
    fd = os.open(path, os.O_RDONLY)
    try:
        write_in_place(path, new)
        assert os.pread(fd, 64, 0) == new
    finally:
        os.close(fd)


def test_cli_fault_prints_one_json_line(eth: Path) -> None:
    runner = CliRunner()
    done = runner.invoke(lab, ["fault", "port-down", "--root", str(eth), "--device", "mlx5_1"])
    assert done.exit_code == 0, done.output
    lines = done.stdout.splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert (record["fault"], record["target"]) == ("port-down", "mlx5_1/1")
    assert record["changes"][0] == {
        "path": f"{IB}/mlx5_1/ports/1/state",
        "old": "4: ACTIVE",
        "new": "1: DOWN",
    }
    assert isinstance(record["injected_at"], float)
    args = ["fault", "counter", "--root", str(eth), "--device", "mlx5_0", "--name", "out_of_buffer"]
    record = json.loads(runner.invoke(lab, [*args, "--delta", "4", "--in-place"]).stdout)
    assert record["changes"][0]["new"] == "4"
    args = ["fault", "pcie-width", "--root", str(eth), "--address", "0000:d8:00.0", "--width", "4"]
    assert json.loads(runner.invoke(lab, args).stdout)["fault"] == "pcie-width"
    args = ["fault", "port-up", "--root", str(eth), "--device", "mlx5_1", "--port", "1"]
    assert json.loads(runner.invoke(lab, args).stdout)["changes"][1]["new"] == "4: ACTIVE"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["acs", "--address", "0000:d7:01.0", "--control", "x"], "not a number", id="acs-control"
        ),
        pytest.param(["device-add", "--device", "mlx5_0"], "was removed", id="add"),
        pytest.param(["port-down", "--device", "mlx5_7"], "no such RDMA device", id="device"),
        pytest.param(["counter", "--device", "mlx5_0", "--name", "x"], "no such counter", id="ctr"),
        pytest.param(
            ["pcie-width", "--address", "0000:d8:00.0", "--width", "64"], "width 64", id="width"
        ),
    ],
)
def test_cli_fault_bad_input_exits_2(eth: Path, args: list[str], message: str) -> None:
    done = CliRunner().invoke(lab, ["fault", *args[:1], "--root", str(eth), *args[1:]])
    assert done.exit_code == 2
    assert done.stderr.startswith("error: ")
    assert message in done.stderr
    assert done.stdout == ""


# --- counter reset, legacy counters ------------------------------------------------------


def test_counter_reset_zeroes_what_moved_and_keeps_lifespan(eth: Path) -> None:
    bump_counter(eth, "mlx5_0", 1, "port_rcv_errors", 5)
    bump_counter(eth, "mlx5_0", 1, "port_xmit_data", 1000)
    bump_counter(eth, "mlx5_0", 1, "out_of_buffer", 7)
    record = counter_reset(eth, "mlx5_0", 1)
    port = f"{IB}/mlx5_0/ports/1"
    assert (record.fault, record.target) == ("counter-reset", "mlx5_0/1")
    assert record.changes == (
        Change(path=f"{port}/counters/port_rcv_errors", old="5", new="0"),
        Change(path=f"{port}/counters/port_xmit_data", old="1000", new="0"),
        Change(path=f"{port}/hw_counters/out_of_buffer", old="7", new="0"),
    )
    assert _read(eth, f"{port}/hw_counters/lifespan") == "10\n"
    assert counter_reset(eth, "mlx5_0", 1).changes == ()


def test_counter_reset_of_every_port_skips_unreadable_values(eth: Path) -> None:
    (eth / IB / "mlx5_1/ports/1/counters/symbol_error").write_text("N/A (no PMA)\n")
    bump_counter(eth, "mlx5_1", 1, "link_downed", 2)
    record = counter_reset(eth, "mlx5_1")
    assert record.target == "mlx5_1"
    assert [c.path.rsplit("/", 1)[1] for c in record.changes] == ["link_downed"]
    assert _read(eth, f"{IB}/mlx5_1/ports/1/counters/symbol_error") == "N/A (no PMA)\n"


LEGACY = """
name: legacy
numa_nodes: {0: "0-3"}
host_bridges: [{name: "pci0000:00", root_ports: ["0000:00:01.0"]}]
adapters:
  - {name: mlx5_0, model: ConnectX-6, address: "0000:01:00.0", parent: "0000:00:01.0",
     node_guid: "0x0002c90300a1b2c0", fw_ver: "20.39.1002", board_id: MT_0000000223,
     counters_ext: true, ports: [{rate: 4X HDR}]}
"""


def test_legacy_data_counter_moves_in_both_directories(tmp_path: Path) -> None:
    render(parse_spec(LEGACY), tmp_path)
    record = bump_counter(tmp_path, "mlx5_0", 1, "port_xmit_data", 2**33)
    port = f"{IB}/mlx5_0/ports/1"
    assert record.changes == (
        Change(path=f"{port}/counters/port_xmit_data", old="0", new=str(2**32 - 1)),
        Change(path=f"{port}/counters_ext/port_xmit_data_64", old="0", new=str(2**33)),
    )
    record = bump_counter(tmp_path, "mlx5_0", 1, "counters_ext/port_unicast_rcv_packets", 3)
    assert [c.new for c in record.changes] == ["3"]  # no 32-bit twin in counters/
    reset = counter_reset(tmp_path, "mlx5_0", 1)
    assert [c.path.split("/ports/1/")[1] for c in reset.changes] == [
        "counters/port_xmit_data",
        "counters_ext/port_unicast_rcv_packets",
        "counters_ext/port_xmit_data_64",
    ]


# --- ACS ---------------------------------------------------------------------------------


def test_set_acs_rewrites_the_control_register(eth: Path) -> None:
    config = eth / "bus/pci/devices/0000:d7:01.0/config"
    record = set_acs(eth, "0000:d7:01.0", 0x1D)
    assert record.changes == (
        Change(path="bus/pci/devices/0000:d7:01.0/config", old="0x0000", new="0x001d"),
    )
    data = config.read_bytes()
    assert len(data) == 4096 and pciconfig.acs_control(data) == 0x1D
    assert set_acs(eth, "0000:d7:01.0", 0, atomic=False).changes[0].new == "0x0000"


# --- device removal ----------------------------------------------------------------------


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if not rel.startswith(".lab-"):
                out[rel] = "-> " + os.readlink(path) if path.is_symlink() else ""
    return out


def test_device_remove_and_add(ib: Path) -> None:
    before = _tree(ib)
    fn = (ib / IB / "mlx5_1/device").resolve()
    record = device_remove(ib, "mlx5_1")
    assert record.fault == "device-remove"
    assert [c.path for c in record.changes][:1] == [f"{IB}/mlx5_1"]
    assert {(c.old, c.new) for c in record.changes} == {("present", "absent")}
    assert sorted(os.listdir(ib / IB)) == ["mlx5_0", "mlx5_2", "mlx5_3"]
    assert not (fn / "infiniband").exists()
    assert not (fn / "infiniband_verbs").exists() and not (fn / "infiniband_mad").exists()
    assert "uverbs1" not in os.listdir(ib / "class/infiniband_verbs")
    assert "umad1" not in os.listdir(ib / "class/infiniband_mad")
    assert (ib / "class/net/ib1/operstate").read_text() == "up\n"  # the netdev stays
    assert (fn / "vendor").is_file()  # and so does the PCI function
    with pytest.raises(FaultError, match="no such RDMA device"):
        device_remove(ib, "mlx5_1")
    added = device_add(ib, "mlx5_1")
    assert {(c.old, c.new) for c in added.changes} == {("absent", "present")}
    assert _tree(ib) == before
    assert (ib / IB / "mlx5_1/ports/1/state").read_text() == "4: ACTIVE\n"
    assert not (ib / ".lab-removed/mlx5_1").exists()


def test_cli_new_faults(eth: Path) -> None:
    runner = CliRunner()
    root = ["--root", str(eth)]
    bump_counter(eth, "mlx5_0", 1, "port_rcv_errors", 1)
    done = runner.invoke(lab, ["fault", "counter-reset", *root, "--device", "mlx5_0"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["changes"][0]["old"] == "1"
    args = ["fault", "acs", *root, "--address", "0000:d7:01.0", "--control", "0x1d"]
    assert json.loads(runner.invoke(lab, args).stdout)["changes"][0]["new"] == "0x001d"
    done = runner.invoke(lab, ["fault", "device-remove", *root, "--device", "mlx5_1"])
    assert json.loads(done.stdout)["fault"] == "device-remove"
    assert not (eth / IB / "mlx5_1").exists()
    done = runner.invoke(lab, ["fault", "device-add", *root, "--device", "mlx5_1"])
    assert json.loads(done.stdout)["fault"] == "device-add"
    assert (eth / IB / "mlx5_1").is_dir()
