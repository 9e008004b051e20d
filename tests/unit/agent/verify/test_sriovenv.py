"""The SR-IOV network device plugin's PCIDEVICE_* env as verify reads it (pure): the
variable's name as the plugin mangles it, its device IDs (PCI functions, auxiliary devices),
the _INFO JSON's rdma entries (pkg/resources/pool_stub.go GetEnvs and the info providers'
GetEnvVal), and the injected evidence and targets verify derives from it."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from agent.verify import identify, sriovenv, verdict
from agent.verify.report import render
from proto.messages.validation import (
    DeviceEvidence,
    Evidence,
    SriovEnvEvidence,
    ValidationResult,
)

VISIBLE = (
    DeviceEvidence(name="mlx5_5", pci_address="0000:3b:00.2"),
    DeviceEvidence(name="mlx5_6", pci_address="0000:3b:00.3"),
)
VARIABLE = "PCIDEVICE_NVIDIA_COM_MLNX_SRIOV_RDMA"


def info(*pairs: tuple[str, str | None]) -> str:
    """`<variable>_INFO` as the plugin marshals it: each ID's info providers."""
    doc = {}
    for device, rdma_dev in pairs:
        providers: dict[str, dict[str, str]] = {"generic": {"deviceID": device}}
        if rdma_dev is not None:
            providers["rdma"] = {"rdma_cm": "/dev/infiniband/rdma_cm", "rdma_dev": rdma_dev,
                                 "uverbs": "/dev/infiniband/uverbs5"}  # fmt: skip
        doc[device] = providers
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("resource", "variable"),
    [
        pytest.param("nvidia.com/mlnx_sriov_rdma", VARIABLE, id="nvidia"),
        pytest.param("openshift.io/intelnics", "PCIDEVICE_OPENSHIFT_IO_INTELNICS", id="openshift"),
        pytest.param("intel.com/sriov-net.a", "PCIDEVICE_INTEL_COM_SRIOV-NET_A", id="dash-kept"),
    ],
)
def test_env_name(resource: str, variable: str) -> None:
    assert sriovenv.env_name(resource) == variable


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param(
            {VARIABLE: "0000:3b:00.2", f"{VARIABLE}_INFO": info(("0000:3b:00.2", "mlx5_5"))},
            SriovEnvEvidence(variable=VARIABLE, device_ids=("0000:3b:00.2",),
                             pci_addresses=("0000:3b:00.2",), rdma=True,
                             rdma_devices=("mlx5_5",)),
            id="rdma-vf",
        ),
        pytest.param(
            {VARIABLE: "0000:3b:00.2,0000:3b:00.7"},
            SriovEnvEvidence(variable=VARIABLE, device_ids=("0000:3b:00.2", "0000:3b:00.7"),
                             pci_addresses=("0000:3b:00.2", "0000:3b:00.7"),
                             missing_pci_addresses=("0000:3b:00.7",)),
            id="no-info-one-missing",
        ),
        pytest.param(
            {VARIABLE: "0000:3b:00.7", f"{VARIABLE}_INFO": info(("0000:3b:00.7", None))},
            SriovEnvEvidence(variable=VARIABLE, device_ids=("0000:3b:00.7",),
                             pci_addresses=("0000:3b:00.7",), rdma=False),
            id="netdevice-only-pool",
        ),
        pytest.param(
            {"PCIDEVICE_NVIDIA_COM_BF3_SF": "mlx5_core.sf.4"},
            SriovEnvEvidence(variable="PCIDEVICE_NVIDIA_COM_BF3_SF",
                             device_ids=("mlx5_core.sf.4",)),
            id="auxiliary-device",
        ),
        pytest.param(
            {VARIABLE: "0000:3b:00.2", f"{VARIABLE}_INFO": "{nope"},
            SriovEnvEvidence(variable=VARIABLE, device_ids=("0000:3b:00.2",),
                             pci_addresses=("0000:3b:00.2",),
                             info_error="not JSON (Expecting property name enclosed in double "
                             "quotes at char 1)"),
            id="bad-info",
        ),
    ],
)  # fmt: skip
def test_sriov_evidence(environ: dict[str, str], expected: SriovEnvEvidence) -> None:
    assert sriovenv.sriov_evidence(environ | {"PATH": "/bin"}, VISIBLE) == (expected,)


def test_no_pcidevice_env_is_no_evidence() -> None:
    assert sriovenv.sriov_evidence({"PCI": "x", "NICFLEET_PCI_ADDRESSES": "a"}, VISIBLE) == ()


def test_an_rdma_allocation_is_injected_and_targets_its_device() -> None:
    environ = {VARIABLE: "0000:3b:00.3", f"{VARIABLE}_INFO": info(("0000:3b:00.3", "mlx5_6"))}
    injected = verdict.injected_evidence(environ, VISIBLE)
    assert injected.matches is True and injected.pci_addresses is None
    assert identify.injected_pci(injected) == {"0000:3b:00.3"}
    evidence = Evidence(devices=VISIBLE, injected=injected)
    assert verdict.target_devices(evidence) == ("mlx5_6",)


def test_a_missing_function_breaks_the_match_with_its_variable_named() -> None:
    injected = verdict.injected_evidence({VARIABLE: "0000:3b:00.7"}, VISIBLE)
    assert injected.matches is False
    (reason,) = verdict._injection_reasons(injected)
    assert (reason.code, reason.missing) == (
        "injected-pci-not-visible",
        "RDMA device at PCI 0000:3b:00.7",
    )
    assert reason.message.startswith(f"{VARIABLE} (the SR-IOV device plugin's) names 0000:3b:00.7")


def test_a_netdevice_only_pool_is_not_an_rdma_injection() -> None:
    environ = {VARIABLE: "0000:3b:00.7", f"{VARIABLE}_INFO": info(("0000:3b:00.7", None))}
    injected = verdict.injected_evidence(environ, VISIBLE)
    assert injected.matches is None  # as if nothing RDMA was injected
    assert identify.injected_pci(injected) == set()
    assert injected.sriov[0].rdma is False


def test_the_text_report_shows_each_allocation() -> None:
    environ = {VARIABLE: "0000:3b:00.3", f"{VARIABLE}_INFO": info(("0000:3b:00.3", "mlx5_6"))}
    evidence = Evidence(devices=VISIBLE, injected=verdict.injected_evidence(environ, VISIBLE))
    result = ValidationResult(verdict="broken", evidence=evidence, started_at=0.0, finished_at=0.0)
    out = Console(file=io.StringIO(), width=200, no_color=True)
    render(result, out)
    text = out.file.getvalue()  # type: ignore[attr-defined]
    assert f"SR-IOV device plugin: {VARIABLE}=0000:3b:00.3 (RDMA mlx5_6)" in text
    assert "injected: devices=- pci=- match" in text
