"""How long `evaluate()` takes over a fleet of N copies of the 12-NIC lab node.

Renders `h100-ib-12nic` once, reads it with the agent, clones the snapshot under N node
names (each with a counter batch carrying rates), and reports the median and max of
several full evaluations. Not a test: numbers go to stdout (`--json` for scripts).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import msgspec

from agent.inventory import collect_snapshot
from agent.lab.render import render
from agent.lab.spec import load_builtin
from agent.sysfs import Sysfs
from aggregator.fleet import Fleet
from aggregator.rules.registry import evaluate
from proto.messages import CounterBatch, PortCounters

NOW = 1_800_000_000.0


def build(nodes: int) -> Fleet:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "sys"
        render(load_builtin("h100-ib-12nic"), root)
        snap = collect_snapshot(Sysfs(root), node="n", seq=1, now=NOW, agent_version="bench")
    fleet = Fleet()
    for i in range(nodes):
        name = f"gpu-{i:05d}"
        fleet.apply_snapshot(msgspec.structs.replace(snap, node=name), received_at=NOW)
        ports = tuple(
            PortCounters(
                device=d.name,
                port=p.port,
                rates={"counters/symbol_error": 0.0, "hw_counters/out_of_sequence": 1.0},
            )
            for d in snap.devices
            for p in d.ports
        )
        batch = CounterBatch(node=name, seq=1, collected_at=NOW, interval_s=1.0, ports=ports)
        fleet.apply_counters(batch, received_at=NOW)
    return fleet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    fleet = build(args.nodes)
    times, findings = [], 0
    for _ in range(args.runs):
        start = time.perf_counter()
        findings = len(evaluate(fleet.view(), (), now=NOW))
        times.append(time.perf_counter() - start)
    result = {
        "nodes": args.nodes,
        "adapters_per_node": 12,
        "runs": args.runs,
        "findings": findings,
        "median_ms": round(statistics.median(times) * 1000, 1),
        "max_ms": round(max(times) * 1000, 1),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"evaluate: {args.nodes} nodes x 12 adapters, {findings} findings: "
            f"median {result['median_ms']} ms, max {result['max_ms']} ms over {args.runs} runs"
        )


if __name__ == "__main__":
    main()
