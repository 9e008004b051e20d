"""`nicfleet-agent verify` in a pod given its adapter by the SR-IOV network device plugin:
no NICFLEET_* env, only `PCIDEVICE_<RESOURCE>` and its `_INFO` as the plugin's Allocate
answers (sriov-network-device-plugin pkg/resources/pool_stub.go), in real network
namespaces (net1 a veth end renamed in the pod's namespace, as the sriov CNI would leave the
VF) over the roce-cx6dx lab tree. Needs root and `ip netns`; skipped with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from proto.codec import from_json
from proto.messages.validation import ValidationResult
from tests.integration.verify import test_pod_interfaces as pods
from tests.support.paths import REPO

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(pods._NETNS is not None, reason=pods._NETNS or ""),
]
# The pod-namespace, lab-tree and /dev fixtures of the Multus tests, shared.
make_pod, roce_tree, dev = pods.make_pod, pods.roce_tree, pods.dev

VARIABLE = "PCIDEVICE_NVIDIA_COM_MLNX_SRIOV_RDMA"


def sriov_env(pci: str, rdma_dev: str) -> dict[str, str]:
    info = {pci: {"generic": {"deviceID": pci},
                  "rdma": {"rdma_cm": "/dev/infiniband/rdma_cm", "rdma_dev": rdma_dev,
                           "uverbs": "/dev/infiniband/uverbs0"}}}  # fmt: skip
    return {VARIABLE: pci, f"{VARIABLE}_INFO": json.dumps(info)}


def verify(
    tree: Path, dev_root: Path, pod: str, annotations: Path, environ: Mapping[str, str]
) -> tuple[subprocess.CompletedProcess[str], ValidationResult]:
    env = {"PATH": os.environ["PATH"], "NODE_NAME": "gpu-01", "POD_NAME": "pod-a", **environ}
    cmd = [sys.executable, "-m", "agent", "verify", "--sysfs-root", str(tree),
           "--dev-root", str(dev_root), "--netns", pod, "--annotations", str(annotations),
           "-o", "json"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=REPO,
                          check=False)  # fmt: skip
    return done, from_json(done.stdout, ValidationResult)


def test_the_sriov_plugins_function_is_the_pods_adapter(
    roce_tree: Path,
    dev: Path,
    make_pod: pods.MakePod,
    tmp_path: Path,
) -> None:
    pod = make_pod({"eth0": "10.244.1.7/24", "net1": pods.GID_ADDRESS})
    annotations = pods.write_annotations(
        tmp_path / "annotations", pods.status("0000:1a:00.0", "mlx5_0")
    )
    done, result = verify(roce_tree, dev, pod, annotations, sriov_env("0000:1a:00.0", "mlx5_0"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (result.verdict, result.reasons) == ("rdma-path", ())
    injected = result.evidence.injected
    (entry,) = injected.sriov
    assert (entry.variable, entry.pci_addresses, entry.rdma, entry.rdma_devices) == (
        VARIABLE, ("0000:1a:00.0",), True, ("mlx5_0",),
    )  # fmt: skip
    assert injected.matches is True and injected.pci_addresses is None
    assert [(r.interface, r.device) for r in result.evidence.rdma_interfaces] == [
        ("net1", "mlx5_0")
    ]


def test_network_status_on_another_function_than_the_plugin_gave_is_broken(
    roce_tree: Path,
    dev: Path,
    make_pod: pods.MakePod,
    tmp_path: Path,
) -> None:
    pod = make_pod({"eth0": "10.244.1.7/24", "net1": pods.GID_ADDRESS})
    annotations = pods.write_annotations(
        tmp_path / "annotations", pods.status("0000:1a:00.0", "mlx5_0")
    )
    done, result = verify(roce_tree, dev, pod, annotations, sriov_env("0000:1a:00.1", "mlx5_1"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert result.verdict == "broken"
    codes = [r.code for r in result.reasons]
    assert "attachment-not-allocated" in codes
    reason = result.reasons[codes.index("attachment-not-allocated")]
    assert "not one of the pod's allocated adapters (0000:1a:00.1)" in reason.message


def test_a_function_the_pod_cannot_see_is_named(
    roce_tree: Path,
    dev: Path,
    make_pod: pods.MakePod,
    tmp_path: Path,
) -> None:
    pod = make_pod({"eth0": "10.244.1.7/24", "net1": pods.GID_ADDRESS})
    done, result = verify(roce_tree, dev, pod, tmp_path / "none", {VARIABLE: "0000:af:00.2"})
    assert done.returncode == 1, done.stdout + done.stderr
    (reason,) = [r for r in result.reasons if r.code == "injected-pci-not-visible"]
    assert reason.message.startswith(f"{VARIABLE} (the SR-IOV device plugin's) names 0000:af:00.2")
