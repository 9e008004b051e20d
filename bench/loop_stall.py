"""The longest event-loop stall while the alert rules recompute everything after a policy
change, over N copies of the 12-NIC lab node: `AllRules.evaluate` on the loop (before)
against `AllRules.evaluate_async` (a worker thread over a copy of the records).

A probe task sleeps 1 ms in a loop and records how late it wakes; a feeder task applies
counter batches at a steady rate (round-robin over the nodes); full garbage collections
(which stop every thread) are timed apart. Not a test: numbers go to stdout (`--json`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time

import msgspec
from rules_evaluate import NOW, build

from aggregator.alerts.wiring import AllRules
from aggregator.cluster import NO_CLUSTER
from aggregator.fleet.state import Fleet
from proto.policy import Policy, load_policies

PROBE_S = 0.001
# --smoke: the same path on a few nodes (make test runs it; its numbers mean nothing).
SMOKE = {"nodes": [30], "runs": 1, "rate": 200.0}


def _policy(mtu: int) -> tuple[Policy, ...]:
    doc = {
        "apiVersion": "nicfleet.io/v1alpha1",
        "kind": "NicFleetPolicy",
        "metadata": {"name": "bench"},
        "spec": {"expect": {"mtu": mtu}},
    }
    return load_policies(json.dumps(doc), source="bench")


async def _probe(done: asyncio.Event, lags: list[float]) -> None:
    while not done.is_set():
        start = time.perf_counter()
        await asyncio.sleep(PROBE_S)
        lags.append(time.perf_counter() - start - PROBE_S)


async def _feed(fleet: Fleet, rate: float, done: asyncio.Event, applied: list[int]) -> None:
    """Counter batches at `rate` per second, round-robin over the nodes."""
    names = fleet.names()
    i = 0
    start = time.perf_counter()
    while not done.is_set():
        due = int((time.perf_counter() - start) * rate)
        while i < due:
            record = fleet.get(names[i % len(names)])
            assert record is not None and record.counters is not None
            batch = msgspec.structs.replace(record.counters, seq=record.counters.seq + 1)
            fleet.apply_counters(batch, received_at=NOW)
            i += 1
        await asyncio.sleep(PROBE_S)
    applied.append(i)


async def _one(
    fleet: Fleet, rules: AllRules, mtu: int, off_loop: bool, rate: float
) -> dict[str, float]:
    """One policy change's evaluation with the probe and the feeder running."""
    done = asyncio.Event()
    lags: list[float] = []
    applied: list[int] = []
    policies = _policy(mtu)
    collections: list[float] = []  # full (generation 2) garbage collections: they stop all
    started: list[float] = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if info["generation"] == 2:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                collections.append(time.perf_counter() - started[0])

    gc.callbacks.append(on_gc)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(_probe(done, lags))
        tasks.create_task(_feed(fleet, rate, done, applied))
        await asyncio.sleep(0.05)  # both running
        start = time.perf_counter()
        if off_loop:
            await rules.evaluate_async(fleet, policies, NO_CLUSTER, NOW)
        else:
            rules.evaluate(fleet, policies, NO_CLUSTER, NOW)
        took = time.perf_counter() - start
        done.set()
    gc.callbacks.remove(on_gc)
    return {
        "evaluation_s": took,
        "max_stall_ms": max(lags) * 1000,
        "applied": applied[0],
        "max_gc2_ms": max(collections, default=0.0) * 1000,
    }


async def measure(nodes: int, runs: int, rate: float) -> dict[str, object]:
    fleet = build(nodes)
    result: dict[str, object] = {"nodes": nodes, "runs": runs, "rate": rate}
    modes = (("on_loop", False, False), ("off_loop", True, False), ("off_loop_frozen", True, True))
    for mode, off_loop, frozen in modes:
        rules = AllRules()
        rules.evaluate(fleet, _policy(1), NO_CLUSTER, NOW)  # the first evaluation, untimed
        if frozen:  # what the aggregator does after loading KV (aggregator/service.py)
            gc.freeze()
        samples = [await _one(fleet, rules, 4000 + i, off_loop, rate) for i in range(runs)]
        if frozen:
            gc.unfreeze()
        result[mode] = {
            key: round(statistics.median(s[key] for s in samples), 2)
            for key in ("evaluation_s", "max_stall_ms", "applied", "max_gc2_ms")
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[3000, 10000])
    parser.add_argument("--runs", type=int, default=3, help="policy changes per size and mode")
    parser.add_argument("--rate", type=float, default=2000.0, help="counter batches per s")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run of the same code path, numbers meaningless "
        "(--nodes 30 --runs 1 --rate 200; options given still win)",
    )
    args = parser.parse_args()
    if args.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    results = [asyncio.run(measure(n, args.runs, args.rate)) for n in args.nodes]
    if args.json:
        print(json.dumps({"results": results, **({"smoke": True} if args.smoke else {})}))
        return
    for r in results:
        print(f"{r['nodes']} nodes x 12 adapters, policy change, {r['rate']:g} counter "
              f"batches/s ingested (median of {r['runs']}):")  # fmt: skip
        for mode in ("on_loop", "off_loop", "off_loop_frozen"):
            m = r[mode]
            assert isinstance(m, dict)
            print(f"  {mode:9} evaluation {m['evaluation_s']:>7} s, longest stall "
                  f"{m['max_stall_ms']:>9} ms (longest full GC {m['max_gc2_ms']} ms), "
                  f"batches applied {m['applied']:>7}")  # fmt: skip


if __name__ == "__main__":
    main()
