"""The console scripts as a user runs them: exit codes, messages, no tracebacks, no
leftover processes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from aggregator.bus.natsserver import NatsServer
from proto.codec import from_json
from proto.inventory import NodeSnapshot
from tests.support.paths import FIXTURES, REPO
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_agent_snapshot_of_missing_root_is_one_clear_error(tmp_path: Path) -> None:
    done = run("-m", "agent", "snapshot", "--sysfs-root", str(tmp_path / "nope"))
    assert done.returncode == 2
    assert "--sysfs-root" in done.stderr
    assert str(tmp_path / "nope") in done.stderr
    assert "Traceback" not in done.stderr


def test_agent_snapshot_rejects_bad_node_name(tmp_path: Path) -> None:
    done = run("-m", "agent", "snapshot", "--sysfs-root", str(tmp_path), "--node-name", "Bad_Name")
    assert done.returncode == 2
    assert "--node-name" in done.stderr
    assert "Traceback" not in done.stderr


def test_agent_snapshot_of_captured_tree_prints_a_decodable_snapshot() -> None:
    root = FIXTURES / "captured" / "procfs-sys"
    done = run("-m", "agent", "snapshot", "--sysfs-root", str(root), "--node-name", "captured")
    assert done.returncode == 0, done.stderr
    snap = from_json(done.stdout, NodeSnapshot)
    assert [a.name for a in snap.devices] == ["hfi1_0", "mlx4_0", "mlx5_0"]


def test_aggregator_rejects_bad_listen_address() -> None:
    done = run("-m", "aggregator", "run", "--listen", "localhost")
    assert done.returncode == 2
    assert "HOST:PORT" in done.stderr
    assert "Traceback" not in done.stderr


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


def test_demo_json_summary_and_no_leftover_processes(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    args = ("demo", "-o", "json", "--workdir", str(workdir), "--traffic-load", "0")
    done = run("-m", "aggregator.ctl", *args, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert sorted(n["name"] for n in summary["nodes"]) == [
        "gpu-ib-01",
        "gpu-ib-02",
        "gpu-roce-01",
        "gpu-roce-02",
    ]
    assert all(n["state"] == "ready" for n in summary["nodes"])
    downs = [e for e in summary["events"] if e["new_state"] == "DOWN"]
    assert downs and downs[0]["device"] == "mlx5_3" and downs[0]["port"] == 1
    assert isinstance(summary["fault_to_aggregator_ms"], int | float)
    assert summary["fault_to_aggregator_ms"] >= 0
    faulted = next(n for n in summary["nodes"] if n["name"] == "gpu-ib-01")
    assert "mlx5_3/1" in faulted["ports_down"]
    assert _processes_mentioning(str(workdir)) == []
    # Every node's device plugin registered with its lab kubelet and advertises.
    resources = summary["resources"]
    assert resources["rdma/ib"]["nodes"] == ["gpu-ib-01", "gpu-ib-02"]
    assert resources["rdma/roce"]["nodes"] == ["gpu-roce-01", "gpu-roce-02"]
    # The faulted adapter's rail breaks at its port; the cluster links are unknown, not faked.
    rail = summary["traces"]["gpu-ib-01 rdma/ib_rail1"]
    assert (rail["ok"], rail["first_broken"]) == (False, "rdma-device")
    assert "mlx5_3/1" in rail["cause"]
    assert rail["links"][:4] == [
        ["agent", "ok"], ["adapter", "ok"], ["driver", "ok"], ["rdma-device", "broken"],
    ]  # fmt: skip
    links = dict(rail["links"])
    assert (links["char-devices"], links["device-plugin"], links["advertised"]) == (
        "ok", "ok", "broken",
    )  # fmt: skip
    assert rail["unknown"]["allocatable"] == {"cluster": "no cluster"}
    assert rail["unknown"]["pods"] == {"cluster": "no cluster"}
    whole = summary["traces"]["gpu-ib-01 rdma/ib"]
    # One of its eight adapters down: still usable, with reduced capacity.
    assert (whole["ok"], whole["verdict"]) == (False, "degraded")
    assert dict(whole["links"])["char-devices"] == "ok"
    assert summary["lab_kubelets"]["gpu-ib-01"] == {
        "rdma/ib": {"capacity": 8, "allocatable": 7},
        "rdma/ib_rail1": {"capacity": 8, "allocatable": 0},
    }
    # The DRA plugins registered too: the faulted node's slice, before and after the fault.
    dra = summary["dra"]
    assert (dra["node"], dra["device"]) == ("gpu-ib-01", "mlx5-3")
    before = {r["device"]: r for r in dra["slices_before"]}
    after = {r["device"]: r for r in dra["slices_after"]}
    assert len(before) == 12 and before.keys() == after.keys()
    assert before["mlx5-3"] == {
        "device": "mlx5-3", "rdma_device": "mlx5_3", "link_layer": "InfiniBand",
        "pcie_root": "pci0000:37", "port_state": "ACTIVE",
    }  # fmt: skip
    assert after["mlx5-3"]["port_state"] == "DOWN"
    assert after["mlx5-0"] == before["mlx5-0"]
    assert "mlx5-3" in dra["kubelet_unhealthy"]
    assert "mlx5-3" not in dra["kubelet_unhealthy_before"]
    sockets = summary["socket_dir"]
    assert len(sockets) < 40 and not Path(sockets).exists()
    assert _processes_mentioning(sockets) == []


def test_demo_serve_stops_every_process_on_sigterm(tmp_path: Path) -> None:
    """Started in the background (SIGINT ignored, as a shell does) and ended with SIGTERM."""
    workdir, out = tmp_path / "demo", tmp_path / "demo.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aggregator.ctl", "demo", "--serve", "--workdir", str(workdir)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
    try:
        deadline = time.monotonic() + 300
        while b"Press Ctrl-C" not in out.read_bytes():
            assert proc.poll() is None, out.read_text()[-3000:]
            assert time.monotonic() < deadline, "demo --serve did not come up"
            time.sleep(0.1)
        text = out.read_text()
        assert "Status page: http://127.0.0.1:" in text
        assert f"--root {workdir / 'gpu-ib-02'} --device mlx5_0" in text
        assert "rdma/ib_rail1 on gpu-ib-01: broken at link 3 (rdma-device)" in text
        sockets = text.split("Kubelet and device-plugin sockets: ", 1)[1].split()[0]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, out.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "all processes stopped" in out.read_text()
    assert _processes_mentioning(str(workdir)) == []
    assert _processes_mentioning(sockets) == [] and not Path(sockets).exists()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_demo_children_die_with_a_sigkilled_demo(tmp_path: Path) -> None:
    """SIGKILL leaves the demo no chance to stop anything: its children (aggregator and its
    nats-server, lab kubelet, agents, lab traffic) stop on the parent-death signal."""
    workdir, out = tmp_path / "demo", tmp_path / "demo.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aggregator.ctl", "demo", "--serve", "--workdir", str(workdir)],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:

        def up() -> bool:
            assert proc.poll() is None, out.read_text()[-3000:]
            return b"Press Ctrl-C" in out.read_bytes()

        asyncio.run(wait_until(up, timeout=300, interval=0.2, what="demo --serve"))
        sockets = out.read_text().split("Kubelet and device-plugin sockets: ", 1)[1].split()[0]

        def children() -> list[int]:
            return _processes_mentioning(str(workdir)) + _processes_mentioning(sockets)

        names = " ".join(_cmdline(pid) for pid in children())
        for part in ("aggregator run", "nats-server", "lab kubelet", "agent run", "lab traffic"):
            assert part in names, f"{part} not running: {names}"
        proc.kill()
        assert proc.wait(timeout=30) == -signal.SIGKILL
        gone = wait_until(
            lambda: children() == [],
            timeout=60,
            interval=0.2,
            what="every child of the killed demo to exit",
        )
        asyncio.run(gone)
        # What the killed demo could not do itself: its kubelet and plugin socket dir.
        shutil.rmtree(sockets)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in _processes_mentioning(str(workdir)):  # never leave one behind
            os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_aggregator_rejects_bad_policy_file_naming_the_field(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "apiVersion: nicfleet.io/v1alpha1\nkind: NicFleetPolicy\nmetadata: {name: p}\n"
        "spec: {expect: {minRateGbps: fast}}\n"
    )
    done = run("-m", "aggregator", "run", "--policy", str(policy))
    assert done.returncode == 2
    assert "$.spec.expect.minRateGbps" in done.stderr
    assert "Traceback" not in done.stderr


def test_aggregator_process_serves_policy_and_stops_cleanly_on_sigterm(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "aggregator", "run", "--nats-url", nats_server.url,
         "--listen", "127.0.0.1:0", "--ready-file", str(ready),
         "--policy", str(REPO / "deploy" / "examples" / "policy.yaml")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "aggregator never became ready"
            time.sleep(0.02)
        api = json.loads(ready.read_text())["api_url"]
        with httpx.Client(base_url=api) as client:
            assert client.get("/readyz").status_code == 200
            policies = client.get("/api/v1/policy").json()
        assert policies["count"] == 1
        assert policies["items"][0]["spec"]["expect"]["maxGpuNicRelation"] == "PXB"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
        if proc.stderr:
            proc.stderr.close()
    assert code == 0
    assert not ready.exists()  # removed on shutdown
