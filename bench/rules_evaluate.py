"""How long rule evaluation takes over a fleet of N copies of the 12-NIC lab node: the full
`evaluate()` side by side with `IncrementalRules` (first call, one node changed, tick).
`--steady`: the alert engine's CPU per node-change with every node sending one busy-port
counter delta per second (loadgen's 16-port node), cycles every `--per-cycle` changes;
beside it the CPU of decoding each delta and `Fleet.apply_counters` (the ingest's share).

Renders the lab node once, reads it with the agent, clones it under N node names; reports
medians and maxima. Not a test: numbers go to stdout (`--json` for scripts).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import statistics
import tempfile
import time
from pathlib import Path

import msgspec

from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from agent.lab.render import render
from agent.lab.spec import load_builtin
from aggregator.fleet.state import Fleet
from aggregator.rules.engine.incremental import IncrementalRules
from aggregator.rules.engine.registry import evaluate
from proto.messages.counters import CounterBatch, PortCounters
from proto.messages.events import LinkEvent

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


def _ms(times: list[tuple[float, float]]) -> dict[str, float]:
    wall = [w for w, _ in times]
    return {
        "median_ms": round(statistics.median(wall) * 1000, 2),
        "max_ms": round(max(wall) * 1000, 2),
        # CPU time of this process: less disturbed by other processes on a shared machine.
        "cpu_median_ms": round(statistics.median(c for _, c in times) * 1000, 2),
    }


def _timed(incremental: IncrementalRules | None, fleet: Fleet, now: float) -> tuple[float, float]:
    """(wall, CPU) seconds of one evaluation: incremental, or full when `incremental` is
    None."""
    start, cpu = time.perf_counter(), time.process_time()
    if incremental is None:
        evaluate(fleet.view(), (), now=now)
    else:
        incremental.evaluate(fleet.view(), (), now=now)
    return time.perf_counter() - start, time.process_time() - cpu


def measure(nodes: int, runs: int, samples: int) -> dict[str, object]:
    """Full evaluation vs the incremental evaluator on the same fleet: its first call
    (everything), after one node's counter batch or port event, and a tick (no change)."""
    fleet = build(nodes)
    names = fleet.names()
    full = [_timed(None, fleet, NOW) for _ in range(runs)]
    rebuild: list[tuple[float, float]] = []
    for _ in range(runs):
        incremental = IncrementalRules()
        rebuild.append(_timed(incremental, fleet, NOW))
    counters: list[tuple[float, float]] = []
    event: list[tuple[float, float]] = []
    tick: list[tuple[float, float]] = []
    for i in range(samples):
        name = names[(i * 7919) % len(names)]  # spread over the fleet
        record = fleet.get(name)
        assert record is not None and record.counters is not None
        batch = msgspec.structs.replace(record.counters, seq=record.counters.seq + 1)
        fleet.apply_counters(batch, received_at=NOW + i)
        counters.append(_timed(incremental, fleet, NOW + i))
        down = LinkEvent(node=name, seq=i + 1, kind="port-state", device="mlx5_0", port=1,
                         old_state="ACTIVE", new_state="DOWN", phys_state="Disabled",
                         observed_at=NOW + i)  # fmt: skip
        fleet.apply_event(down, received_at=NOW + i)
        event.append(_timed(incremental, fleet, NOW + i))
        tick.append(_timed(incremental, fleet, NOW + i + 0.5))
    found = incremental.evaluate(fleet.view(), (), now=NOW + samples)
    same = found == evaluate(fleet.view(), (), now=NOW + samples)
    return {
        "nodes": nodes,
        "adapters_per_node": 12,
        "runs": runs,
        "samples": samples,
        "findings": len(found),
        "incremental_equals_full": same,
        "full": _ms(full),
        "incremental_first": _ms(rebuild),
        "incremental_one_counter_batch": _ms(counters),
        "incremental_one_port_event": _ms(event),
        "incremental_tick": _ms(tick),
    }


def steady(nodes: int, rounds: int, per_cycle: int, down_every: int = 0) -> dict[str, object]:
    """CPU of `AlertEngine.cycle` per node-change, every node one busy delta per round;
    with `down_every`, every such node has a port down (a firing alert) throughout."""
    from loadgen import NodeShape, build_templates
    from prometheus_client import CollectorRegistry

    import aggregator
    from aggregator.alerts.delivery import Broker
    from aggregator.alerts.engine import AlertEngine, EngineSettings
    from aggregator.alerts.metrics import AlertMetrics
    from aggregator.alerts.wiring import AllRules
    from aggregator.cluster import NO_CLUSTER
    from aggregator.fleet.changefeed import ChangeFeed
    from proto import codec
    from proto.inventory import NodeSnapshot

    tpl = build_templates(NodeShape())
    snap = codec.decode(tpl.snapshot, NodeSnapshot)
    full = codec.decode(tpl.counters, CounterBatch)
    delta = codec.decode(tpl.delta, CounterBatch)
    fleet, names = Fleet(), [f"sim-{i:05d}" for i in range(nodes)]
    for name in names:
        fleet.apply_snapshot(msgspec.structs.replace(snap, node=name, collected_at=NOW), NOW)
        batch = msgspec.structs.replace(full, node=name, seq=1, collected_at=NOW)
        fleet.apply_counters(batch, received_at=NOW)
    for name in names[::down_every] if down_every else ():
        down = LinkEvent(node=name, seq=1, kind="port-state", device=tpl.device, port=1,
                         old_state="ACTIVE", new_state="DOWN", phys_state="Disabled",
                         observed_at=NOW)  # fmt: skip
        fleet.apply_event(down, received_at=NOW)
    clock = [NOW]
    engine = AlertEngine(
        fleet=fleet, changes=ChangeFeed().subscribe(), evaluate=AllRules().evaluate_async,
        policies=lambda: (), cluster=lambda: NO_CLUSTER, settings=EngineSettings(),
        metrics=AlertMetrics.create(CollectorRegistry()), broker=Broker(first_id=1),
        clock=lambda: clock[0],
    )  # fmt: skip
    cycles: list[float] = []  # CPU seconds of each round's cycles
    held_as_received = "wire" in inspect.signature(Fleet.apply_counters).parameters
    # As the ingest decodes counters (older trees: no decode_counters, everything decoded).
    decode = getattr(codec, "decode_counters", lambda data: codec.decode(data, CounterBatch))
    applies: list[float] = []  # CPU seconds of each round's decode + Fleet.apply_counters

    async def run() -> None:
        await engine.cycle("start")
        for r in range(rounds):
            spent = applied = 0.0
            wire = [  # encoded up front: the agents' side is not measured
                codec.encode(
                    msgspec.structs.replace(
                        delta, node=name, seq=r + 2, collected_at=NOW + r + 1 + i / nodes,
                        base_seq=1,
                    )
                )
                for i, name in enumerate(names)
            ]  # fmt: skip
            for i, data in enumerate(wire):
                now = NOW + r + 1 + i / nodes
                clock[0] = now
                cpu = time.process_time()
                batch = decode(data)
                if held_as_received:  # as the ingest does (an older tree: no such argument)
                    fleet.apply_counters(batch, now, data)
                else:
                    fleet.apply_counters(batch, received_at=now)
                applied += time.process_time() - cpu
                if (i + 1) % per_cycle == 0 or i + 1 == nodes:
                    cpu = time.process_time()
                    await engine.cycle("change")
                    spent += time.process_time() - cpu
            cycles.append(spent)
            applies.append(applied)

    asyncio.run(run())
    record = fleet.get(names[0])
    assert record is not None
    per_change = [c / nodes * 1e6 for c in cycles[1:]]  # the first round warms up
    per_apply = [c / nodes * 1e6 for c in applies[1:]]
    return {
        "nodes": nodes,
        "per_cycle": per_cycle,
        "down_every": down_every,
        "rounds": rounds,
        "findings": len(engine.findings),
        "delta_keys_known": record.counters_delta is not None,
        "aggregator": str(Path(aggregator.__file__).parent),
        "cpu_us_per_node_change_median": round(statistics.median(per_change), 2),
        "cpu_us_per_node_change_max": round(max(per_change), 2),
        "decode_apply_cpu_us_per_delta_median": round(statistics.median(per_apply), 2),
    }


# --smoke: the same path on a few nodes (make test runs it; its numbers mean nothing).
SMOKE = {"nodes": [30], "runs": 1, "samples": 2, "rounds": 2, "per_cycle": [1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 3000, 10000])
    parser.add_argument("--runs", type=int, default=5, help="full evaluations per size")
    parser.add_argument("--samples", type=int, default=21, help="incremental steps per size")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--steady", action="store_true", help="the steady-state scenario")
    parser.add_argument("--rounds", type=int, default=4, help="--steady: rounds (seconds)")
    parser.add_argument("--per-cycle", type=int, nargs="+", default=[1, 100],
                        help="--steady: node changes per engine cycle")  # fmt: skip
    parser.add_argument("--down-every", type=int, default=0,
                        help="--steady: every n-th node has a port down (0: none)")  # fmt: skip
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run of the same code path, numbers meaningless "
        "(--nodes 30 --runs 1 --samples 2, --steady: --rounds 2 --per-cycle 1; "
        "options given still win)",
    )
    args = parser.parse_args()
    if args.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    if args.steady:
        steady_results = [
            steady(n, args.rounds, min(k, n), args.down_every)
            for n in args.nodes
            for k in args.per_cycle
        ]
        doc: dict[str, object] = {"steady": steady_results}
        if args.smoke:
            doc["smoke"] = True
        print(json.dumps(doc, indent=None if args.json else 1))
        return
    results = [measure(n, args.runs, args.samples) for n in args.nodes]
    if args.json:
        print(json.dumps({"results": results, **({"smoke": True} if args.smoke else {})}))
        return
    for r in results:
        same = r["incremental_equals_full"]
        print(f"{r['nodes']} nodes x 12 adapters, {r['findings']} findings "
              f"(incremental == full: {same}), median / max / CPU median ms:")  # fmt: skip
        for key in ("full", "incremental_first", "incremental_one_counter_batch",
                    "incremental_one_port_event", "incremental_tick"):  # fmt: skip
            ms = r[key]
            assert isinstance(ms, dict)
            print(f"  {key:32} {ms['median_ms']:>10} {ms['max_ms']:>10} {ms['cpu_median_ms']:>10}")


if __name__ == "__main__":
    main()
