"""GPU<->NIC relations: table tests for classify_relation, the nvidia-smi matrix parser on
the captured outputs, and the rendered h100-ib-12nic tree against the captured matrix
cell by cell (PCI chains are read back from the tree, the way the agent sees them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.host.topology import Relation, classify_relation, parse_nic_legend, parse_topo_matrix
from agent.lab.render import render
from agent.lab.spec import load_builtin
from tests.support.paths import FIXTURES

TOPOLOGY = FIXTURES / "topology"
H100_MATRIX = TOPOLOGY / "nvidia_smi_topo_h100_12nic_2numa.txt"
NCCL_PARTIAL = TOPOLOGY / "nvidia_smi_topo_hgx_h100_nccl1264_partial.txt"

HB, RP = "pci0000:15", "0000:15:01.0"
UP, DOWN_A, DOWN_B = "0000:16:00.0", "0000:17:00.0", "0000:17:01.0"
# Nested switch below DOWN_A: upstream 18:00.0, downstream ports 19:00.0 / 19:01.0.
UP2, DOWN2_A, DOWN2_B = "0000:18:00.0", "0000:19:00.0", "0000:19:01.0"


@pytest.mark.parametrize(
    ("a", "b", "a_numa", "b_numa", "expected"),
    [
        pytest.param((HB, RP, UP, DOWN_A, "0000:1a:00.0"), (HB, RP, UP, DOWN_A, "0000:1a:00.0"),
                     0, 0, Relation.X, id="self"),
        pytest.param((HB, RP, UP, DOWN_B, "0000:1b:00.0"), (HB, RP, UP, DOWN_B, "0000:1b:00.1"),
                     0, 0, Relation.PIX, id="functions-of-one-card"),
        pytest.param((HB, RP, UP, DOWN_A, "0000:1a:00.0"), (HB, RP, UP, DOWN_B, "0000:1b:00.0"),
                     0, 0, Relation.PIX, id="same-switch-other-downstream-port"),
        pytest.param((HB, RP, "0000:16:00.0"), (HB, RP, "0000:16:00.1"),
                     0, 0, Relation.PIX, id="functions-right-below-a-root-port"),
        pytest.param((HB, RP, UP, DOWN_A, UP2, DOWN2_A, "0000:1a:00.0"),
                     (HB, RP, UP, DOWN_A, UP2, DOWN2_B, "0000:1b:00.0"),
                     0, 0, Relation.PIX, id="same-nested-switch"),
        pytest.param((HB, RP, UP, DOWN_A, UP2, DOWN2_A, "0000:1a:00.0"),
                     (HB, RP, UP, DOWN_B, "0000:1c:00.0"),
                     0, 0, Relation.PXB, id="through-two-switches"),
        pytest.param((HB, RP, UP, DOWN_A, UP2, DOWN2_A, "0000:1a:00.0"),
                     (HB, RP, UP, DOWN_B, "0000:1d:00.0", "0000:1e:00.0", "0000:1f:00.0"),
                     0, 0, Relation.PXB, id="three-switches"),
        pytest.param((HB, RP, UP, DOWN_A, "0000:1a:00.0"), (HB, "0000:15:03.0", "0000:30:00.0"),
                     0, 0, Relation.PHB, id="different-root-ports"),
        pytest.param((HB, "0000:15:00.0"), (HB, RP, UP, DOWN_A, "0000:1a:00.0"),
                     0, 0, Relation.PHB, id="integrated-device-on-the-root-bus"),
        pytest.param((HB, RP, UP, DOWN_A, "0000:1a:00.0"), ("pci0000:37", "0000:37:01.0",
                     "0000:38:00.0"), 0, 0, Relation.NODE, id="host-bridges-same-numa"),
        pytest.param((HB, RP, "0000:16:00.0"), ("pci0000:97", "0000:97:01.0", "0000:98:00.0"),
                     0, 1, Relation.SYS, id="across-numa"),
        pytest.param((HB, RP, "0000:16:00.0"), ("pci0000:37", "0000:37:01.0", "0000:38:00.0"),
                     None, None, Relation.SYS, id="numa-unknown"),
        pytest.param((HB, RP, "0000:16:00.0"), ("pci0000:37", "0000:37:01.0", "0000:38:00.0"),
                     -1, -1, Relation.SYS, id="numa-minus-one"),
        pytest.param((HB, RP, "0000:16:00.0"), (HB, "0000:15:03.0", "0000:30:00.0"),
                     None, 1, Relation.PHB, id="numa-irrelevant-within-a-root-complex"),
        pytest.param(("pci10000:80", "10000:80:01.0", "10000:81:00.0"),
                     ("pci10000:80", "10000:80:01.0", "10000:81:00.1"),
                     0, 0, Relation.PIX, id="vmd-domain"),
    ],
)  # fmt: skip
def test_classify_relation(
    a: tuple[str, ...], b: tuple[str, ...], a_numa: int | None, b_numa: int | None, expected: str
) -> None:
    assert classify_relation(a, b, a_numa, b_numa) == expected
    assert classify_relation(b, a, b_numa, a_numa) == expected  # symmetric


@pytest.mark.parametrize(
    "path",
    [
        pytest.param((), id="empty"),
        pytest.param(("pci0000:15",), id="host-bridge-only"),
        pytest.param(("0000:15:01.0", "0000:16:00.0"), id="no-host-bridge"),
    ],
)
def test_classify_relation_rejects_malformed_chains(path: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="not a PCI chain"):
        classify_relation(path, (HB, RP, "0000:16:00.0"), 0, 0)


def test_relation_values_are_the_nvidia_smi_tokens() -> None:
    assert [r.value for r in Relation] == ["X", "PIX", "PXB", "PHB", "NODE", "SYS"]


def test_parse_captured_h100_matrix() -> None:
    text = H100_MATRIX.read_text()
    legend = parse_nic_legend(text)
    assert legend == {f"NIC{k}": f"mlx5_{k}" for k in range(12)}
    matrix = parse_topo_matrix(text)
    assert len(matrix) == 20 * 20
    assert matrix["GPU0", "GPU0"] == "X"
    assert matrix["GPU0", "GPU7"] == "NV18"
    assert matrix["GPU0", "mlx5_2"] == "PIX"
    assert matrix["mlx5_11", "GPU7"] == "PIX"
    assert matrix["mlx5_3", "mlx5_4"] == "NODE"
    assert matrix["mlx5_0", "mlx5_6"] == "SYS"
    assert ("GPU0", "NIC0") not in matrix  # NIC labels were translated via the legend


def test_parse_tab_separated_partial_matrix_without_legend() -> None:
    matrix = parse_topo_matrix(NCCL_PARTIAL.read_text())
    assert len(matrix) == (8 + 3) * 18  # GPU rows and the three NIC rows the capture kept
    assert matrix["GPU3", "NIC5"] == "PIX"
    assert matrix["NIC2", "GPU2"] == "PIX"
    assert matrix["NIC0", "NIC0"] == "X"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("nothing here\n", "no nvidia-smi topo header", id="no-header"),
        pytest.param("\tGPU0\tNIC0\nGPU0\t X \n", "row GPU0: 1 cells for 2 columns", id="short"),
        pytest.param("\tGPU0\tNIC0\nGPU0\t X \tPIY\n", "unknown relation 'PIY'", id="token"),
        pytest.param("\tGPU0\nGPU9\t X \n", "row 'GPU9' is not one of the columns", id="row"),
    ],
)
def test_parse_topo_matrix_rejects_malformed_text(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_topo_matrix(text)


def pci_chain(root: Path, address: str) -> tuple[tuple[str, ...], int | None]:
    """(host bridge, bridges..., device) and NUMA node of a PCI function in a sysfs tree,
    read the way the agent does: resolve bus/pci/devices/<addr> below root/devices."""
    device = root / "bus" / "pci" / "devices" / address
    chain = device.resolve().relative_to((root / "devices").resolve()).parts
    numa = int((device / "numa_node").read_text())
    return chain, None if numa < 0 else numa


def _devices(root: Path) -> dict[str, str]:
    """GPUk (by PCI address order, as nvidia-smi numbers them) and mlx5_k -> PCI address."""
    pci = root / "bus" / "pci" / "devices"
    gpus = sorted(a for a in os.listdir(pci) if (pci / a / "class").read_text() == "0x030200\n")
    ib = root / "class" / "infiniband"
    nics = {name: (ib / name / "device").resolve().name for name in os.listdir(ib)}
    return {f"GPU{i}": address for i, address in enumerate(gpus)} | nics


@pytest.fixture(scope="module")
def h100_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("h100")
    render(load_builtin("h100-ib-12nic"), root, overwrite=True)
    return root


def _rendered_relation(root: Path, devices: dict[str, str], a: str, b: str) -> str:
    (a_path, a_numa), (b_path, b_numa) = pci_chain(root, devices[a]), pci_chain(root, devices[b])
    return classify_relation(a_path, b_path, a_numa, b_numa)


def test_rendered_h100_reproduces_the_captured_matrix(h100_tree: Path) -> None:
    captured = parse_topo_matrix(H100_MATRIX.read_text())
    devices = _devices(h100_tree)
    gpus = [f"GPU{i}" for i in range(8)]
    nics = [f"mlx5_{k}" for k in range(12)]
    assert sorted(devices) == sorted(gpus + nics)
    pairs = [(g, n) for g in gpus for n in nics] + [(n, g) for n in nics for g in gpus]
    pairs += [(a, b) for a in nics for b in nics]
    assert len(pairs) == 96 + 96 + 144
    got = {pair: _rendered_relation(h100_tree, devices, *pair) for pair in pairs}
    want = {pair: captured[pair] for pair in pairs}
    assert got == want
    assert (
        sum(1 for a, b in pairs if a.startswith("mlx5") and b.startswith("mlx5") and a != b) == 132
    )


def test_rendered_h100_cpu_affinity_matches_the_capture(h100_tree: Path) -> None:
    devices = _devices(h100_tree)
    pci = h100_tree / "bus" / "pci" / "devices"
    affinity = {g: (pci / devices[g] / "local_cpulist").read_text().strip() for g in devices}
    assert {affinity[f"GPU{i}"] for i in range(4)} == {"4,6,8,10,12"}
    assert {affinity[f"GPU{i}"] for i in range(4, 8)} == {"1,3,5,7,9,11"}


@pytest.mark.parametrize(
    ("spec", "a", "b", "expected"),
    [
        pytest.param("a100-ib-4nic", "GPU0", "mlx5_0", Relation.PIX, id="a100-pix"),
        pytest.param("a100-ib-4nic", "GPU0", "mlx5_1", Relation.PXB, id="a100-pxb"),
        pytest.param("a100-ib-4nic", "GPU2", "mlx5_3", Relation.PHB, id="a100-phb"),
        pytest.param("a100-ib-4nic", "GPU0", "mlx5_2", Relation.SYS, id="a100-sys"),
        pytest.param("roce-cx6dx", "GPU0", "mlx5_1", Relation.PIX, id="roce-pix"),
        pytest.param("roce-cx6dx", "mlx5_2", "mlx5_3", Relation.PIX, id="roce-dual-port"),
        pytest.param("roce-cx6dx", "GPU1", "mlx5_2", Relation.PHB, id="roce-phb"),
        pytest.param("roce-cx6dx", "GPU0", "mlx5_2", Relation.SYS, id="roce-sys"),
        pytest.param("roce-cx6dx-2", "GPU0", "mlx5_0", Relation.SYS, id="drifted-nic-socket"),
        pytest.param("roce-cx6dx-2", "GPU0", "GPU1", Relation.PHB, id="drifted-gpus"),
    ],
)
def test_builtin_specs_have_the_documented_relations(
    tmp_path: Path, spec: str, a: str, b: str, expected: Relation
) -> None:
    render(load_builtin(spec), tmp_path)
    assert _rendered_relation(tmp_path, _devices(tmp_path), a, b) == expected
