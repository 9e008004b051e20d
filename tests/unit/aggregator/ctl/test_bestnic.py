"""The best NIC for a GPU (aggregator.ctl.bestnic), and its JavaScript twin in the status
page (aggregator/api/ui/topology.js `bestNics`) giving the same answer on every case."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import msgspec
import pytest

from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from agent.lab.render import render
from agent.lab.spec import load_builtin
from aggregator.ctl.bestnic import Choice, best_nics, relation_rank
from proto.inventory import GpuNicRelation, NodeSnapshot
from tests.support.builders import device, port, snapshot
from tests.support.paths import REPO

GPU = "0000:18:00.0"
TOPOLOGY_JS = REPO / "aggregator" / "api" / "ui" / "topology.js"


def node(*nics: tuple[str, str, str, float | None]) -> NodeSnapshot:
    """One GPU related to each (nic, relation, port state, rate) given."""
    base = snapshot(
        "n",
        gpus=1,
        devices=tuple(
            device(name, ports=(port(1, state, rate=rate),), pci=f"0000:{i + 0x20:02x}:00.0")  # type: ignore[arg-type]
            for i, (name, _, state, rate) in enumerate(nics)
        ),
    )
    # The wire type allows nvidia-smi's six tokens only; the page and bestnic still rank
    # anything else (NV#, a future token) the same way, which the odd cases check.
    relations = tuple(
        GpuNicRelation(gpu=GPU, nic=n, relation=r)  # type: ignore[arg-type]
        for n, r, _, _ in nics
    )
    return msgspec.structs.replace(base, gpu_nic_topology=relations)


CASES = [
    pytest.param(node(("a", "SYS", "ACTIVE", 400.0), ("b", "PIX", "ACTIVE", 100.0)),
                 Choice("b", "PIX"), id="closest-wins-over-faster"),
    pytest.param(node(("a", "PIX", "DOWN", 400.0), ("b", "NODE", "ACTIVE", 100.0)),
                 Choice("b", "NODE"), id="closest-is-down"),
    pytest.param(node(("a", "PIX", "DOWN", 400.0), ("b", "PXB", "INIT", 100.0)),
                 None, id="all-down"),
    pytest.param(node(("a", "PIX", "ACTIVE", 100.0), ("b", "PIX", "ACTIVE", 400.0)),
                 Choice("b", "PIX"), id="tie-fastest"),
    pytest.param(node(("mlx5_2", "PIX", "ACTIVE", 200.0), ("mlx5_10", "PIX", "ACTIVE", 200.0)),
                 Choice("mlx5_10", "PIX"), id="tie-name-code-point-order"),
    pytest.param(node(("a", "PIX", "ACTIVE", None), ("b", "PIX", "ACTIVE", 1.0)),
                 Choice("b", "PIX"), id="unknown-rate-is-slowest"),
    pytest.param(node(("a", "PIX", "ACTIVE_DEFER", 100.0), ("b", "PHB", "ACTIVE", 100.0)),
                 Choice("a", "PIX"), id="active-defer-is-up"),
    pytest.param(node(("a", "WEIRD", "ACTIVE", 100.0), ("b", "SYS", "ACTIVE", 100.0)),
                 Choice("b", "SYS"), id="unknown-relation-last"),
    pytest.param(node(("a", "NV4", "ACTIVE", 100.0), ("b", "X", "ACTIVE", 100.0)),
                 Choice("a", "NV4"), id="nvlink-first"),
]  # fmt: skip


@pytest.mark.parametrize(("snap", "best"), CASES)
def test_best_nic(snap: NodeSnapshot, best: Choice | None) -> None:
    assert best_nics(snap) == {GPU: best}


def test_a_nic_the_snapshot_does_not_list_is_down() -> None:
    snap = node(("a", "NODE", "ACTIVE", 100.0))
    ghost = GpuNicRelation(gpu=GPU, nic="ghost", relation="PIX")
    snap = msgspec.structs.replace(snap, gpu_nic_topology=(*snap.gpu_nic_topology, ghost))
    assert best_nics(snap) == {GPU: Choice("a", "NODE")}


def test_relation_order_is_nvidia_smis() -> None:
    order = ["NV1", "X", "PIX", "PXB", "PHB", "NODE", "SYS", "???"]
    assert [relation_rank(r) for r in order] == sorted(map(relation_rank, order))
    assert len(set(map(relation_rank, order))) == len(order)


def _h100(tmp_path: Path, down: tuple[str, ...]) -> NodeSnapshot:
    root = tmp_path / "sys"
    render(load_builtin("h100-ib-12nic"), root)
    snap = collect_snapshot(Sysfs(root), node="gpu-ib-01", seq=1, now=1.0, agent_version="t")
    devices = tuple(
        msgspec.structs.replace(
            d, ports=tuple(msgspec.structs.replace(p, state="DOWN") for p in d.ports)
        )
        if d.name in down
        else d
        for d in snap.devices
    )
    return msgspec.structs.replace(snap, devices=devices)


def _js_best(snaps: list[NodeSnapshot], tmp_path: Path) -> list[dict[str, str]]:
    node_bin = shutil.which("node")
    if node_bin is None:
        pytest.skip("node (JavaScript) is not installed")
    data = tmp_path / "snapshots.json"
    data.write_bytes(msgspec.json.encode(snaps))
    script = (
        f"const m = await import({json.dumps(TOPOLOGY_JS.as_uri())});\n"
        "const fs = await import('node:fs');\n"
        f"const snaps = JSON.parse(fs.readFileSync({json.dumps(str(data))}, 'utf8'));\n"
        "console.log(JSON.stringify(snaps.map((s) => Object.fromEntries(m.bestNics(s)))));\n"
    )
    done = subprocess.run(
        [node_bin, "--input-type=module", "-e", script],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: list[dict[str, str]] = json.loads(done.stdout)
    return result


def test_the_status_page_picks_the_same_nics(tmp_path: Path) -> None:
    snaps = [case.values[0] for case in CASES]
    assert all(isinstance(s, NodeSnapshot) for s in snaps)
    typed = [s for s in snaps if isinstance(s, NodeSnapshot)]
    typed += [_h100(tmp_path / "up", ()), _h100(tmp_path / "down", ("mlx5_0", "mlx5_3"))]
    ours = [{gpu: c.nic for gpu, c in best_nics(s).items() if c is not None} for s in typed]
    assert _js_best(typed, tmp_path) == ours
    # The H100 capture: with mlx5_3 down, GPU1 moves to another NIC, as the page shows.
    assert ours[-2] != ours[-1]
