"""`nicfleet-agent verify` as a process: verdicts and exit codes on lab trees with a fake
dev root, the pair test failing fast on bad evidence, the real pyverbs on a host without
RDMA devices, and the result published on NATS from a validation pod."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import struct
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import nats
import pytest

from agent.lab.faults import port_down
from agent.lab.render import render
from agent.lab.spec import load_builtin
from agent.verify.pair.handshake import Abort, decode_body
from aggregator.bus.natsserver import NatsServer
from proto.codec import decode, from_json
from proto.messages.validation import ValidationResult
from proto.runtime.natsflush import flush_in_order
from tests.support.paths import REPO

pytestmark = pytest.mark.integration

DEBIAN_DIST = Path("/usr/lib/python3/dist-packages")
NO_RDMA_DEVICES = not any(Path("/sys/class/infiniband").glob("*"))
requires_debian_pyverbs = pytest.mark.skipif(
    not (DEBIAN_DIST / "pyverbs").is_dir(),
    reason="pyverbs not importable: install Debian's python3-pyverbs",
)


@pytest.fixture(scope="module")
def ib_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lab") / "ib"
    render(load_builtin("a100-ib-4nic"), root)
    return root


@pytest.fixture
def dev(tmp_path: Path) -> Path:
    base = tmp_path / "dev" / "infiniband"
    base.mkdir(parents=True)
    for name in ("uverbs0", "rdma_cm", "umad0"):
        os.mkfifo(base / name)
    return tmp_path / "dev"


def base_env(**extra: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "NODE_NAME": "gpu-01", "POD_NAME": "pod-a", **extra}


def verify_cmd(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "agent", "verify", *map(str, args)]


def run(
    *args: str | Path, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(verify_cmd(*args), capture_output=True, text=True, timeout=60,
                          env=dict(env or base_env()), cwd=REPO, check=False)  # fmt: skip


def test_rdma_path_exits_zero_with_json(ib_tree: Path, dev: Path) -> None:
    done = run("--sysfs-root", ib_tree, "--dev-root", dev, "-o", "json",
               env=base_env(NICFLEET_RDMA_DEVICES="mlx5_0"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = from_json(done.stdout, ValidationResult)
    assert (result.verdict, result.reasons) == ("rdma-path", ())
    assert (result.node, result.pod, result.validation_id, result.role) == ("gpu-01", "pod-a",
                                                                            None, None)  # fmt: skip
    assert result.evidence.injected.matches is True
    assert result.evidence.verbs.checked is False  # a lab tree: verbs would describe this host
    assert result.pair_test is None
    assert result.started_at <= result.finished_at


def test_ordinary_interface_only_exits_three_with_the_reason(ib_tree: Path, tmp_path: Path) -> None:
    done = run("--sysfs-root", ib_tree, "--dev-root", tmp_path / "empty-dev")
    assert done.returncode == 3, done.stderr
    assert done.stdout.startswith("verdict: ordinary-interface-only\n")
    assert (
        "no-rdma-device-in-pod" in done.stdout
        and "(missing: /dev/infiniband/uverbs*)" in done.stdout
    )


def test_broken_exits_one_naming_every_reason(tmp_path: Path, dev: Path) -> None:
    tree = tmp_path / "down"
    render(load_builtin("a100-ib-4nic"), tree)
    port_down(tree, "mlx5_0", 1)
    done = run("--sysfs-root", tree, "--dev-root", dev,
               env=base_env(NICFLEET_RDMA_DEVICES="mlx5_0,mlx5_7"))  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "verdict: broken" in done.stdout
    assert (
        "injected-device-not-visible" in done.stdout
        and "/sys/class/infiniband/mlx5_7" in done.stdout
    )
    assert "port-down" in done.stdout and "mlx5_0 port ACTIVE" in done.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        pytest.param(["--serve", "--peer", "a"], "--serve and --peer exclude", id="serve-and-peer"),
        pytest.param(["--peer", "host:http"], "--peer: peer 'host:http'", id="bad-peer"),
        pytest.param(["--validation-id", "A.B"], "--validation-id: validation id", id="bad-id"),
        pytest.param(["--validation-id", "v1"], "needs --nats-url", id="id-without-nats"),
        pytest.param(["--sysfs-root", "/nonexistent"], "does not exist", id="bad-sysfs-root"),
        pytest.param(["--netns", "no-such-ns"], "--netns: no network namespace", id="bad-netns"),
    ],
)
def test_bad_arguments_exit_two_with_one_line(args: list[str], needle: str) -> None:
    done = run(*args)
    assert done.returncode == 2
    assert needle in done.stderr and "Traceback" not in done.stderr


async def test_peer_side_with_bad_evidence_fails_fast_and_tells_the_server(
    ib_tree: Path, tmp_path: Path
) -> None:
    frames: asyncio.Queue[bytes] = asyncio.Queue()

    async def server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        (length,) = struct.unpack(">I", await reader.readexactly(4))
        await frames.put(await reader.readexactly(length))
        writer.close()

    listener = await asyncio.start_server(server, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        process = await asyncio.create_subprocess_exec(
            *verify_cmd("--sysfs-root", ib_tree, "--dev-root", tmp_path / "none", "-o", "json",
                        "--peer", f"127.0.0.1:{port}", "--timeout", "10"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=base_env(),
            cwd=REPO,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 60)
        told = decode_body(await asyncio.wait_for(frames.get(), 10))
    finally:
        listener.close()
        await listener.wait_closed()
    assert process.returncode == 3, err
    result = from_json(out, ValidationResult)
    assert result.role == "client" and result.pair_test is not None
    assert result.pair_test.bytes_per_second is None and result.pair_test.latency is None
    assert result.pair_test.error is not None
    assert result.pair_test.error.startswith("evidence verdict is ordinary-interface-only: ")
    assert isinstance(told, Abort) and told.error == result.pair_test.error


def test_serve_side_with_bad_evidence_and_no_peer_ends_within_its_timeout(
    ib_tree: Path, tmp_path: Path
) -> None:
    done = run("--sysfs-root", ib_tree, "--dev-root", tmp_path / "none", "-o", "json",
               "--serve", "--listen", "127.0.0.1", "--port", "0", "--timeout", "0.5")  # fmt: skip
    assert done.returncode == 2  # --port 0 is refused: the peer must know the port
    done = run("--sysfs-root", ib_tree, "--dev-root", tmp_path / "none", "-o", "json",
               "--serve", "--listen", "127.0.0.1", "--port", str(free_port()),
               "--timeout", "0.5")  # fmt: skip
    assert done.returncode == 3, done.stderr
    result = from_json(done.stdout, ValidationResult)
    assert result.role == "server" and result.pair_test is not None
    assert result.pair_test.error is not None and "evidence verdict" in result.pair_test.error


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_validation_pod_publishes_its_result(
    nats_server: NatsServer, ib_tree: Path, dev: Path
) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        sub = await nc.subscribe("nicfleet.v1.validation.v-123")
        await flush_in_order(nc)
        env = base_env(NICFLEET_VALIDATION_ID="v-123", NICFLEET_NATS_URL=nats_server.url,
                       NICFLEET_RDMA_DEVICES="mlx5_0")  # fmt: skip
        process = await asyncio.create_subprocess_exec(
            *verify_cmd("--sysfs-root", ib_tree, "--dev-root", dev), env=env, cwd=REPO,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(process.communicate(), 60)
        message = await sub.next_msg(timeout=10)
    finally:
        await nc.close()
    assert process.returncode == 0, err
    assert b"published on nicfleet.v1.validation.v-123" in err
    result = decode(message.data, ValidationResult)
    assert (result.validation_id, result.verdict, result.node) == ("v-123", "rdma-path", "gpu-01")


def test_unreachable_nats_is_an_error_not_a_hang(ib_tree: Path, dev: Path) -> None:
    env = base_env(
        NICFLEET_VALIDATION_ID="v-1", NICFLEET_NATS_URL=f"nats://127.0.0.1:{free_port()}"
    )
    done = subprocess.run(verify_cmd("--sysfs-root", ib_tree, "--dev-root", dev, "--timeout", "1"),
                          capture_output=True, text=True, timeout=60, env=env, cwd=REPO,
                          check=False)  # fmt: skip
    assert done.returncode == 4
    assert "cannot reach NATS" in done.stderr


@requires_debian_pyverbs
@pytest.mark.skipif(not NO_RDMA_DEVICES, reason="this host has RDMA devices")
def test_real_pyverbs_without_devices_is_a_reason_not_a_number(ib_tree: Path, dev: Path) -> None:
    done = run("--sysfs-root", ib_tree, "--dev-root", dev, "--verbs", "on",
               "--verbs-path", DEBIAN_DIST, "-o", "json",
               env=base_env(NICFLEET_RDMA_DEVICES="mlx5_0"))  # fmt: skip
    assert done.returncode == 1, done.stderr
    result = from_json(done.stdout, ValidationResult)
    assert result.evidence.verbs.detail == "verbs unavailable: Failed to get devices list"
    assert [r.code for r in result.reasons] == ["verbs-unavailable"]


@requires_debian_pyverbs
@pytest.mark.skipif(not NO_RDMA_DEVICES, reason="this host has RDMA devices")
def test_real_pyverbs_queue_pair_without_a_device_fails_cleanly() -> None:
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from agent.verify.pair.queuepair import PyverbsQueuePair, RdmaTestError
        from agent.host.verbs import load_pyverbs
        pv = load_pyverbs(Path({str(DEBIAN_DIST)!r}))
        try:
            PyverbsQueuePair(pv, device="mlx5_0", port=1, gid_index=0, size=4096)
        except RdmaTestError as exc:
            print("error:", exc)
        """
    )
    done = subprocess.run([sys.executable, "-I", "-W", "error", "-c", code], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("error: cannot set up an RC queue pair on mlx5_0/1: ")


def _netns_unusable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return None if probe.returncode == 0 else f"`ip netns` does not work: {probe.stderr.strip()}"


_NETNS = _netns_unusable()


@pytest.fixture
def pod_netns() -> Iterator[str]:
    """A namespace standing in for a pod with a secondary interface net1 = 10.10.0.11/24
    (a veth; its peer stays in the namespace),
    the address the roce-cx6dx lab node's mlx5_0 port carries as a RoCE GID."""
    name = f"nfverify-{uuid.uuid4().hex[:10]}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, timeout=10)
    try:
        for args in (
            ["link", "add", "net1", "type", "veth", "peer", "name", "nfpeer1"],
            ["addr", "add", "10.10.0.11/24", "dev", "net1"],
            ["link", "set", "nfpeer1", "up"],
            ["link", "set", "net1", "up"],
        ):
            subprocess.run(["ip", "-n", name, *args], check=True, capture_output=True, timeout=10)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True, timeout=10)


@pytest.mark.skipif(_NETNS is not None, reason=_NETNS or "")
def test_roce_pod_interface_carrying_the_gid_address_is_an_rdma_path(
    tmp_path: Path, dev: Path, pod_netns: str
) -> None:
    tree = tmp_path / "roce"
    render(load_builtin("roce-cx6dx"), tree)
    env = base_env(NICFLEET_RDMA_DEVICES="mlx5_0", NICFLEET_NETDEVS="enp26s0f0np0")
    done = run("--sysfs-root", tree, "--dev-root", dev, "--netns", pod_netns, "-o", "json",
               env=env)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    result = from_json(done.stdout, ValidationResult)
    assert sorted(i.name for i in result.evidence.interfaces) == ["net1", "nfpeer1"]
    matched = {(m.ip, m.interface, m.type) for m in result.evidence.gid_matches if m.interface}
    assert matched == {("10.10.0.11", "net1", "IB/RoCE v1"), ("10.10.0.11", "net1", "RoCE v2")}
    # the same pod without the address: the GID proves nothing any more
    subprocess.run(["ip", "-n", pod_netns, "addr", "flush", "dev", "net1"], check=True,
                   capture_output=True, timeout=10)  # fmt: skip
    done = run("--sysfs-root", tree, "--dev-root", dev, "--netns", pod_netns, env=env)
    assert done.returncode == 1
    assert "gid-not-on-pod-interface" in done.stdout
