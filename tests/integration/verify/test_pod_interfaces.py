"""`nicfleet-agent verify` finds the pod's RDMA interface the way an ordinary Multus pod
has it: real network namespaces (a veth end renamed net1 inside the pod's namespace, its
peer in a stand-in node namespace), the roce-cx6dx lab tree for /sys, the device plugin's
env with *host* netdev names the pod does not hold, and the downward-API annotations file
written the way kubelet writes it. Needs root and `ip netns`; skipped with the reason."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from agent.lab.render import render
from agent.lab.spec import load_builtin
from proto.codec import from_json
from proto.messages.validation import ValidationResult
from tests.support.paths import REPO

# The roce-cx6dx lab node: mlx5_0 at 0000:1a:00.0 (host netdev enp26s0f0np0) carries the
# RoCE GIDs of 10.10.0.11; mlx5_1 is 0000:1a:00.1.
GID_ADDRESS = "10.10.0.11/24"
DEVICE_PLUGIN_ENV = {
    "NICFLEET_RDMA_DEVICES": "mlx5_0",
    "NICFLEET_PCI_ADDRESSES": "0000:1a:00.0",
    "NICFLEET_NETDEVS": "enp26s0f0np0",  # the host's name: not in the pod, and that is normal
}


def _netns_unusable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return None if probe.returncode == 0 else f"`ip netns` does not work: {probe.stderr.strip()}"


_NETNS = _netns_unusable()
pytestmark = [pytest.mark.integration, pytest.mark.skipif(_NETNS is not None, reason=_NETNS or "")]

MakePod = Callable[[Mapping[str, str | None]], str]


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def make_pod() -> Iterator[MakePod]:
    """make_pod({"eth0": "10.244.1.7/24", "net1": GID_ADDRESS}) -> the pod's namespace.

    Each interface is a veth created in a node namespace with its peer in the pod's, then
    renamed there, as a CNI plugin does; deleting the namespaces removes both ends."""
    made: list[str] = []

    def make(interfaces: Mapping[str, str | None]) -> str:
        tag = uuid.uuid4().hex[:8]
        pod, node = f"nfpod-{tag}", f"nfnode-{tag}"
        for name in (pod, node):
            ip("netns", "add", name)
            made.append(name)
        for i, (name, address) in enumerate(interfaces.items()):
            host_end, pod_end = f"h{i}-{tag}", f"p{i}-{tag}"
            ip("-n", node, "link", "add", host_end, "type", "veth", "peer", "name", pod_end,
               "netns", pod)  # fmt: skip
            ip("-n", pod, "link", "set", pod_end, "name", name)
            if address is not None:
                ip("-n", pod, "addr", "add", address, "dev", name)
            ip("-n", node, "link", "set", host_end, "up")
            ip("-n", pod, "link", "set", name, "up")
        return pod

    yield make
    for name in made:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True, timeout=10)


@pytest.fixture(scope="module")
def roce_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lab") / "roce"
    render(load_builtin("roce-cx6dx"), root)
    return root


@pytest.fixture
def dev(tmp_path: Path) -> Path:
    base = tmp_path / "dev" / "infiniband"
    base.mkdir(parents=True)
    for name in ("uverbs0", "rdma_cm", "umad0"):
        os.mkfifo(base / name)
    return tmp_path / "dev"


def go_quote(value: str) -> str:
    """strconv.Quote for the printable-ASCII-plus-newline text Multus writes."""
    assert all(c == "\n" or " " <= c <= "~" for c in value)
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def write_annotations(path: Path, network_status: list[dict[str, Any]]) -> Path:
    """The downwardAPI volume file for metadata.annotations: kubelet sorts the keys and
    writes key=strconv.Quote(value) lines, no newline after the last; Multus indents."""
    annotations = {
        "k8s.v1.cni.cncf.io/network-status": json.dumps(network_status, indent=4),
        "k8s.v1.cni.cncf.io/networks": "rdma-net",
    }
    path.write_text("\n".join(f"{k}={go_quote(v)}" for k, v in sorted(annotations.items())))
    return path


def status(pci: str, rdma_device: str) -> list[dict[str, Any]]:
    return [
        {"name": "k8s-pod-network", "interface": "eth0", "ips": ["10.244.1.7"],
         "mac": "0a:58:0a:f4:01:07", "default": True, "dns": {}},
        {"name": "default/rdma-net", "interface": "net1", "ips": ["10.10.0.11"],
         "mac": "0c:42:a1:e1:7f:40", "dns": {},
         "device-info": {"type": "pci", "version": "1.1.0",
                         "pci": {"pci-address": pci, "rdma-device": rdma_device}}},
    ]  # fmt: skip


def verify(
    tree: Path, dev: Path, pod: str, annotations: Path, *args: str
) -> tuple[subprocess.CompletedProcess[str], ValidationResult | None]:
    env = {"PATH": os.environ["PATH"], "NODE_NAME": "gpu-01", "POD_NAME": "pod-a",
           **DEVICE_PLUGIN_ENV}  # fmt: skip
    cmd = [
        sys.executable,
        "-m",
        "agent",
        "verify",
        "--sysfs-root",
        str(tree),
        "--dev-root",
        str(dev),
        "--netns",
        pod,
        "--annotations",
        str(annotations),
        *args,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=REPO,
                          check=False)  # fmt: skip
    result = from_json(done.stdout, ValidationResult) if "json" in args else None
    return done, result


def test_multus_net1_holding_the_gid_address_is_an_rdma_path(
    roce_tree: Path, dev: Path, make_pod: MakePod, tmp_path: Path
) -> None:
    pod = make_pod({"eth0": "10.244.1.7/24", "net1": GID_ADDRESS})
    annotations = write_annotations(tmp_path / "annotations", status("0000:1a:00.0", "mlx5_0"))
    done, result = verify(roce_tree, dev, pod, annotations, "-o", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert result is not None and (result.verdict, result.reasons) == ("rdma-path", ())
    ev = result.evidence
    assert sorted(i.name for i in ev.interfaces) == ["eth0", "net1"]
    assert "enp26s0f0np0" not in {i.name for i in ev.interfaces}  # and nobody minds
    assert [(r.interface, r.device, r.sources) for r in ev.rdma_interfaces] == [
        ("net1", "mlx5_0", ("gid-address", "device-info"))
    ]
    assert ev.annotations_file == str(annotations)
    assert [(a.interface, a.default, a.pci_address) for a in ev.attachments] == [
        ("eth0", True, None), ("net1", False, "0000:1a:00.0")
    ]  # fmt: skip
    assert ev.injected.matches is True and ev.injected.missing_netdevs == ()
    # without the annotations mounted, the GID address alone identifies net1
    done, result = verify(roce_tree, dev, pod, tmp_path / "not-mounted", "-o", "json")
    assert done.returncode == 0, done.stdout
    assert result is not None and result.evidence.attachments == ()
    assert [r.sources for r in result.evidence.rdma_interfaces] == [("gid-address",)]
    done, _ = verify(roce_tree, dev, pod, annotations)
    assert "RDMA interface net1: mlx5_0 (by gid-address, device-info)" in done.stdout


def test_only_the_primary_interface_is_ordinary_interface_only(
    roce_tree: Path, dev: Path, make_pod: MakePod, tmp_path: Path
) -> None:
    pod = make_pod({"eth0": "10.244.1.7/24"})
    done, result = verify(roce_tree, dev, pod, tmp_path / "none", "-o", "json")
    assert done.returncode == 3, done.stdout + done.stderr
    assert result is not None and result.verdict == "ordinary-interface-only"
    assert [r.code for r in result.reasons] == ["primary-interface-only"]
    assert "only its primary interface (eth0)" in result.reasons[0].message
    assert result.evidence.rdma_interfaces == ()


@pytest.mark.parametrize(
    ("net1", "pci", "rdma_device", "code", "needle"),
    [
        pytest.param("10.99.0.5/24", "0000:1a:00.0", "mlx5_0", "gid-not-on-pod-interface",
                     "net1 (10.99.0.5/24", id="net1-address-is-no-gid-of-the-device"),
        pytest.param(GID_ADDRESS, "0000:1a:00.1", "mlx5_1", "attachment-not-allocated",
                     "on PCI function 0000:1a:00.1, not one of the pod's allocated adapters "
                     "(0000:1a:00.0)", id="device-info-names-another-adapter"),
    ],
)  # fmt: skip
def test_a_wrong_attachment_is_broken_with_the_reason(
    roce_tree: Path, dev: Path, make_pod: MakePod, tmp_path: Path,
    net1: str, pci: str, rdma_device: str, code: str, needle: str,
) -> None:  # fmt: skip
    pod = make_pod({"eth0": "10.244.1.7/24", "net1": net1})
    annotations = write_annotations(tmp_path / "annotations", status(pci, rdma_device))
    done, result = verify(roce_tree, dev, pod, annotations, "-o", "json")
    assert done.returncode == 1, done.stdout + done.stderr
    assert result is not None and result.verdict == "broken"
    assert [r.code for r in result.reasons] == [code]
    assert needle in result.reasons[0].message
