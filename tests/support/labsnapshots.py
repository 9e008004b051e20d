"""Snapshots of the built-in lab nodes (agent/lab/specs), rendered to a sysfs tree and read
back by the agent's real collector: the fleets the NicClusterPolicy audit is tested on."""

from __future__ import annotations

from pathlib import Path

from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from agent.lab.render import render
from agent.lab.spec import builtin_specs, load_builtin
from proto.inventory import NodeSnapshot


def lab_snapshot(name: str, root: Path) -> NodeSnapshot:
    spec = load_builtin(name)
    render(spec, root)
    return collect_snapshot(Sysfs(root), node=spec.name, seq=1, now=0.0, agent_version="test")


def lab_fleet(root: Path) -> dict[str, NodeSnapshot]:
    """Every built-in lab node, by node name."""
    snaps = [lab_snapshot(name, root / name) for name in builtin_specs()]
    return {s.node: s for s in snaps}
