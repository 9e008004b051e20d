"""Evidence read from lab trees and a fake dev root, judged: one table row per way a pod
can miss (or have) an RDMA path, each reason naming the missing evidence."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.host.sysfs import Sysfs
from agent.lab.faults import port_down
from agent.lab.render import render
from agent.lab.spec import load_builtin
from agent.verify.evidence import read_char_devices, read_rdma_devices
from agent.verify.verdict import (
    choose_port,
    gid_ip,
    injected_evidence,
    judge,
    match_gids,
    parse_env_list,
    target_devices,
)
from proto.inventory import Gid
from proto.messages.validation import (
    AttachmentEvidence,
    DeviceEvidence,
    Evidence,
    InterfaceEvidence,
    PortEvidence,
    VerbsEvidence,
    Verdict,
)

ROCE_POD_NET = InterfaceEvidence(name="net1", operstate="up", addresses=("10.10.0.11/24",))
WRONG_NET1 = InterfaceEvidence(name="net1", operstate="up", addresses=("10.99.0.5/24",))
DEFAULT_NET = AttachmentEvidence(name="k8s-pod-network", interface="eth0", default=True)
# the roce-cx6dx lab node: mlx5_0 is 0000:1a:00.0, mlx5_1 0000:1a:00.1
NET1_ON_MLX5_0 = AttachmentEvidence(name="default/rdma-net", interface="net1",
                                    device_type="pci", pci_address="0000:1a:00.0",
                                    rdma_device="mlx5_0")  # fmt: skip
NET1_ON_MLX5_1 = AttachmentEvidence(name="default/rdma-net", interface="net1",
                                    device_type="pci", pci_address="0000:1a:00.1",
                                    rdma_device="mlx5_1")  # fmt: skip
ROCE_ENV = {"NICFLEET_RDMA_DEVICES": "mlx5_0", "NICFLEET_PCI_ADDRESSES": "0000:1a:00.0",
            "NICFLEET_NETDEVS": "enp26s0f0np0"}  # fmt: skip
POD_ETH0 = InterfaceEvidence(name="eth0", operstate="up", addresses=("192.0.2.2/24",))
VERBS_OFF = VerbsEvidence(checked=False, detail="not checked")


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("labs")
    out = {}
    for name in ("a100-ib-4nic", "roce-cx6dx"):
        render(load_builtin(name), root / name)
        out[name] = root / name
    render(load_builtin("a100-ib-4nic"), root / "ib-port-down")
    port_down(root / "ib-port-down", "mlx5_0", 1)
    out["ib-port-down"] = root / "ib-port-down"
    return out


def fake_dev(root: Path, *names: str, unopenable: tuple[str, ...] = ()) -> Path:
    """/dev/infiniband stand-ins: FIFOs open O_RDWR|O_NONBLOCK like a char device does
    (root or not); a directory in a device's place fails that open with EISDIR."""
    base = root / "infiniband"
    base.mkdir(parents=True, exist_ok=True)
    for name in names:
        os.mkfifo(base / name)
    for name in unopenable:
        (base / name).mkdir()
    return root


@dataclass(frozen=True)
class Case:
    tree: str
    chars: tuple[str, ...] = ()
    unopenable: tuple[str, ...] = ()
    interfaces: tuple[InterfaceEvidence, ...] = (POD_ETH0,)
    env: dict[str, str] = field(default_factory=dict)
    verbs: VerbsEvidence = VERBS_OFF
    verdict: Verdict = "rdma-path"
    codes: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    attachments: tuple[AttachmentEvidence, ...] = ()


def evidence_for(case: Case, trees: dict[str, Path], tmp_path: Path) -> Evidence:
    dev = fake_dev(tmp_path / "dev", *case.chars, unopenable=case.unopenable)
    devices, errors = read_rdma_devices(Sysfs(trees[case.tree]))
    return Evidence(
        char_devices=read_char_devices(dev),
        devices=devices,
        interfaces=case.interfaces,
        gid_matches=match_gids(devices, case.interfaces),
        injected=injected_evidence(case.env, devices),
        verbs=case.verbs,
        errors=errors,
        attachments=case.attachments,
    )


CASES = [
    pytest.param(
        Case(tree="roce-cx6dx", verdict="ordinary-interface-only",
             codes=("no-rdma-device-in-pod",), missing=("/dev/infiniband/uverbs*",)),
        id="ordinary-interface-only",
    ),
    pytest.param(
        Case(tree="a100-ib-4nic", env={"NICFLEET_RDMA_DEVICES": "mlx5_0"}, verdict="broken",
             codes=("no-uverbs-device", "device-uverbs-missing"),
             missing=("/dev/infiniband/uverbs*", "/dev/infiniband/uverbs0")),
        id="char-devices-missing",
    ),
    pytest.param(
        Case(tree="a100-ib-4nic", chars=("uverbs0",), unopenable=("rdma_cm",), verdict="broken",
             codes=("char-device-unopenable",), missing=("/dev/infiniband/rdma_cm openable",)),
        id="char-device-unopenable",
    ),
    pytest.param(
        Case(tree="ib-port-down", chars=("uverbs0", "rdma_cm"),
             env={"NICFLEET_RDMA_DEVICES": "mlx5_0"}, verdict="broken",
             codes=("port-down",), missing=("mlx5_0 port ACTIVE",)),
        id="port-down",
    ),
    pytest.param(
        Case(tree="roce-cx6dx", chars=("uverbs0", "rdma_cm"),
             env={"NICFLEET_RDMA_DEVICES": "mlx5_0"}, verdict="ordinary-interface-only",
             codes=("primary-interface-only",),
             missing=("RoCE GID of mlx5_0 equal to a pod interface address",)),
        id="roce-device-but-only-the-primary-interface",
    ),
    pytest.param(
        Case(tree="roce-cx6dx", chars=("uverbs0", "rdma_cm"), env=ROCE_ENV,
             interfaces=(POD_ETH0, WRONG_NET1), verdict="broken",
             codes=("gid-not-on-pod-interface",),
             missing=("RoCE GID of mlx5_0 equal to a pod interface address",)),
        id="roce-secondary-interface-without-the-gid-address",
    ),
    pytest.param(
        Case(tree="roce-cx6dx", chars=("uverbs0", "rdma_cm"), env=ROCE_ENV,
             interfaces=(POD_ETH0, ROCE_POD_NET), attachments=(DEFAULT_NET, NET1_ON_MLX5_1),
             verdict="broken", codes=("attachment-not-allocated",),
             missing=("device-info PCI address in 0000:1a:00.0",)),
        id="roce-attachment-on-another-adapter",
    ),
    pytest.param(
        Case(tree="roce-cx6dx", chars=("uverbs0", "rdma_cm"), env=ROCE_ENV,
             interfaces=(POD_ETH0,),
             attachments=(DEFAULT_NET, NET1_ON_MLX5_0), verdict="broken",
             codes=("attachment-interface-missing", "primary-interface-only"),
             missing=("pod interface net1",
                      "RoCE GID of mlx5_0 equal to a pod interface address")),
        id="roce-attachment-interface-not-in-pod",
    ),
    pytest.param(
        Case(tree="a100-ib-4nic", chars=("uverbs0", "rdma_cm"),
             env={"NICFLEET_RDMA_DEVICES": "mlx5_0,mlx5_9", "NICFLEET_NETDEVS": "ib0"},
             verdict="broken", codes=("injected-device-not-visible",),
             missing=("/sys/class/infiniband/mlx5_9",)),
        id="injected-not-visible-host-netdevs-not-required",
    ),
    pytest.param(
        Case(tree="a100-ib-4nic", chars=("uverbs0", "rdma_cm"),
             env={"NICFLEET_PCI_ADDRESSES": "0000:77:00.0"},
             verdict="broken", codes=("injected-pci-not-visible",),
             missing=("RDMA device at PCI 0000:77:00.0",)),
        id="injected-pci-not-visible",
    ),
    pytest.param(
        Case(tree="a100-ib-4nic", chars=("uverbs0",),
             verbs=VerbsEvidence(available=False, detail="verbs unavailable: Failed to get "
                                 "devices list"),
             verdict="broken", codes=("verbs-unavailable",), missing=("pyverbs device context",)),
        id="verbs-unavailable",
    ),
    pytest.param(
        Case(tree="a100-ib-4nic", chars=("uverbs0",),
             verbs=VerbsEvidence(available=True, detail="ok: 4 devices",
                                 failed={"mlx5_0": "Failed to open device"}),
             verdict="broken", codes=("verbs-open-failed",),
             missing=("mlx5_0 device context and port query",)),
        id="verbs-open-failed",
    ),
    pytest.param(
        Case(tree="a100-ib-4nic", chars=("uverbs0", "rdma_cm", "umad0"),
             env={"NICFLEET_RDMA_DEVICES": "mlx5_0"},
             verbs=VerbsEvidence(available=True, detail="ok: 4 devices", opened=("mlx5_0",))),
        id="all-good-infiniband",
    ),
    pytest.param(
        Case(tree="roce-cx6dx", chars=("uverbs0", "rdma_cm"),
             interfaces=(POD_ETH0, ROCE_POD_NET), env=ROCE_ENV),
        id="all-good-roce-host-netdev-names-absent",
    ),
    pytest.param(
        Case(tree="roce-cx6dx", chars=("uverbs0", "rdma_cm"), env=ROCE_ENV,
             interfaces=(POD_ETH0, ROCE_POD_NET), attachments=(DEFAULT_NET, NET1_ON_MLX5_0)),
        id="all-good-roce-with-network-status",
    ),
    pytest.param(
        Case(tree="a100-ib-4nic", chars=("uverbs1",)),
        id="all-good-without-injection-by-uverbs-owner",
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_verdicts(case: Case, trees: dict[str, Path], tmp_path: Path) -> None:
    verdict, reasons = judge(evidence_for(case, trees, tmp_path))
    assert verdict == case.verdict
    assert tuple(r.code for r in reasons) == case.codes
    assert tuple(r.missing for r in reasons) == case.missing
    assert all(r.message for r in reasons)


def test_roce_gid_matches_the_pod_address(trees: dict[str, Path], tmp_path: Path) -> None:
    case = Case(tree="roce-cx6dx", chars=("uverbs0",), interfaces=(ROCE_POD_NET,),
                env={"NICFLEET_RDMA_DEVICES": "mlx5_0"})  # fmt: skip
    evidence = evidence_for(case, trees, tmp_path)
    matched = [m for m in evidence.gid_matches if m.interface]
    assert {(m.device, m.ip, m.interface, m.ndev) for m in matched} == {
        ("mlx5_0", "10.10.0.11", "net1", "enp26s0f0np0")
    }
    assert {m.type for m in matched} == {"IB/RoCE v1", "RoCE v2"}
    # RoCE v2 is preferred for the pair test; its index follows the v1 twin.
    assert choose_port(evidence) == ("mlx5_0", 1, 3)


def test_choose_port_on_infiniband_uses_gid_zero(trees: dict[str, Path], tmp_path: Path) -> None:
    case = Case(tree="a100-ib-4nic", chars=("uverbs2",))
    assert choose_port(evidence_for(case, trees, tmp_path)) == ("mlx5_2", 1, 0)


def test_choose_port_none_when_port_down(trees: dict[str, Path], tmp_path: Path) -> None:
    case = Case(tree="ib-port-down", chars=("uverbs0",), env={"NICFLEET_RDMA_DEVICES": "mlx5_0"})
    assert choose_port(evidence_for(case, trees, tmp_path)) is None


def test_char_devices_are_listed_uverbs_first_with_errno(tmp_path: Path) -> None:
    dev = fake_dev(tmp_path, "umad0", "uverbs10", "uverbs2", "rdma_cm", "issm0",
                   unopenable=("uverbs3",))  # fmt: skip
    (tmp_path / "infiniband" / "abi_version").write_text("1\n")
    found = read_char_devices(dev)
    assert [(c.path.rsplit("/", 1)[1], c.openable, c.error) for c in found] == [
        ("uverbs2", True, None),
        ("uverbs3", False, "EISDIR"),
        ("uverbs10", True, None),
        ("rdma_cm", True, None),
        ("umad0", True, None),
    ]


def test_missing_dev_root_means_no_char_devices(tmp_path: Path) -> None:
    assert read_char_devices(tmp_path / "nowhere") == ()


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a char device needs root")
def test_real_char_device_node_opens(tmp_path: Path) -> None:
    base = tmp_path / "infiniband"
    base.mkdir()
    os.mknod(base / "uverbs0", 0o600 | 0o020000, os.makedev(1, 3))  # /dev/null's numbers
    assert [(c.openable, c.error) for c in read_char_devices(tmp_path)] == [(True, None)]


@pytest.mark.parametrize(
    ("gid", "ip"),
    [
        ("0000:0000:0000:0000:0000:ffff:0a0a:000b", "10.10.0.11"),
        ("fe80:0000:0000:0000:0e42:a1ff:fee1:7f40", "fe80::e42:a1ff:fee1:7f40"),
        ("fd00:0000:0000:0000:0000:0000:0000:0005", "fd00::5"),
        ("not-a-gid", None),
        ("", None),
    ],
)
def test_gid_ip(gid: str, ip: str | None) -> None:
    assert gid_ip(gid) == ip


@pytest.mark.parametrize(
    ("value", "parsed"),
    [(None, None), ("", ()), ("mlx5_0", ("mlx5_0",)), (" mlx5_0 , ,mlx5_1 ", ("mlx5_0", "mlx5_1"))],
)
def test_parse_env_list(value: str | None, parsed: tuple[str, ...] | None) -> None:
    assert parse_env_list(value) == parsed


def test_bad_interface_addresses_are_skipped_not_fatal() -> None:
    odd = InterfaceEvidence(name="x", addresses=("garbage", "10.0.0.1/33", "10.10.0.11/24"))
    assert injected_evidence({}, []).matches is None
    device = DeviceEvidence(name="d", ports=(PortEvidence(port=1, link_layer="Ethernet",
        gids=(Gid(index=0, gid="0000:0000:0000:0000:0000:ffff:0a0a:000b"),)),))  # fmt: skip
    assert [m.interface for m in match_gids([device], [odd])] == ["x"]


def test_pair_test_port_of_a_multus_pod_is_its_net1_gid(
    trees: dict[str, Path], tmp_path: Path
) -> None:
    """The pair test inherits the identification: the RoCE v2 GID of net1's address, with
    the host's netdev names in the env and none of them in the pod."""
    case = Case(tree="roce-cx6dx", chars=("uverbs0",), interfaces=(POD_ETH0, ROCE_POD_NET),
                env=ROCE_ENV, attachments=(DEFAULT_NET, NET1_ON_MLX5_0))  # fmt: skip
    evidence = evidence_for(case, trees, tmp_path)
    assert judge(evidence) == ("rdma-path", ())
    assert choose_port(evidence) == ("mlx5_0", 1, 3)


def test_targets_by_injected_pci_address(trees: dict[str, Path], tmp_path: Path) -> None:
    case = Case(tree="roce-cx6dx", chars=("uverbs0", "uverbs1"),
                env={"NICFLEET_PCI_ADDRESSES": "0000:1a:00.1"})  # fmt: skip
    evidence = evidence_for(case, trees, tmp_path)
    assert target_devices(evidence) == ("mlx5_1",)
    assert evidence.injected.matches is True
