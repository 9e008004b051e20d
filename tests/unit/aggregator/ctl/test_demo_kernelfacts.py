"""The demo's lab nodes with their proc/ trees, read as the demo's agents read them
(--proc-root <tree>/proc): every node reports its kernel facts without a read error,
gpu-ib-01 is the tuned host (dma-buf and peermem), gpu-roce-02 the untuned one (no path),
and the findings are the same as without the facts (rule, node, subject)."""

from __future__ import annotations

from pathlib import Path

from agent.host.inventory import collect_snapshot
from agent.host.procfs import Procfs
from agent.host.sysfs import Sysfs
from agent.lab.procfs import PROC_DIR
from agent.lab.render import render
from agent.lab.spec import load_builtin, with_node_name
from aggregator.ctl.demofleet import DEMO_NODES, LAB_PROC
from aggregator.fleet.state import Fleet
from aggregator.rules.engine.registry import evaluate
from aggregator.rules.gpudirect import gpudirect_of
from proto.inventory import NodeSnapshot

NOW = 1_800_000_000.0


def _snapshots(tmp: Path, *, proc: bool) -> list[NodeSnapshot]:
    snaps = []
    for node, spec in DEMO_NODES:
        root = tmp / node
        if not root.exists():
            render(with_node_name(load_builtin(spec), node), root)
        procfs = Procfs(root / LAB_PROC) if proc else None
        snaps.append(collect_snapshot(Sysfs(root), node=node, seq=1, now=NOW,
                                      agent_version="t", procfs=procfs))  # fmt: skip
    return snaps


def _findings(snaps: list[NodeSnapshot]) -> list[tuple[str, str | None, str]]:
    fleet = Fleet()
    for snap in snaps:
        fleet.apply_snapshot(snap, received_at=NOW)
    return [(f.rule, f.node, f.subject) for f in evaluate(fleet.view(), (), now=NOW)]


def test_the_demo_reads_the_lab_proc_dir() -> None:
    assert LAB_PROC == PROC_DIR  # nicfleetctl may not import the agent: kept equal here


def test_one_tuned_one_untuned_host_and_the_same_findings(tmp_path: Path) -> None:
    snaps = _snapshots(tmp_path, proc=True)
    assert all(s.errors == () and s.platform.kernel_release for s in snaps)
    paths = {s.node: gpudirect_of(s).path for s in snaps}
    assert paths == {
        "gpu-ib-01": "both",
        "gpu-ib-02": "peermem",
        "gpu-roce-01": "peermem",
        "gpu-roce-02": "none",
    }
    with_facts = _findings(snaps)
    assert with_facts == _findings(_snapshots(tmp_path, proc=False))
    assert ("peermem-missing", "gpu-roce-02", "nvidia_peermem") in with_facts
