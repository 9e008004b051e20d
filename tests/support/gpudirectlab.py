"""The demo's tuned and untuned hosts as the aggregator sees them: the built-in lab specs
behind gpu-ib-01 (h100-ib-12nic: open NVIDIA modules on 6.8, nvidia_peermem too) and
gpu-roce-02 (roce-cx6dx-2: proprietary modules, no peer memory), rendered with their proc/
tree and read back by the agent's collector with --proc-root, in one Fleet."""

from __future__ import annotations

from pathlib import Path

from agent.host.inventory import collect_snapshot
from agent.host.procfs import Procfs
from agent.host.sysfs import Sysfs
from agent.lab.procfs import proc_root
from agent.lab.render import render
from agent.lab.spec import load_builtin, with_node_name
from aggregator.fleet.state import Fleet

TUNED, UNTUNED = "gpu-ib-01", "gpu-roce-02"
SPECS = {TUNED: "h100-ib-12nic", UNTUNED: "roce-cx6dx-2"}


def kernel_facts_fleet(tmp: Path, now: float) -> Fleet:
    fleet = Fleet()
    for node, spec in SPECS.items():
        root = tmp / node
        render(with_node_name(load_builtin(spec), node), root)
        snap = collect_snapshot(Sysfs(root), node=node, seq=1, now=now, agent_version="t",
                                procfs=Procfs(proc_root(root)))  # fmt: skip
        fleet.apply_snapshot(snap, now)
    return fleet
