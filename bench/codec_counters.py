"""Micro-benchmark (issue 8): size, decode and encode time of one CounterBatch per encoding.

Messages are made by the agent's own code (bench/loadgen.py templates: 16 ports, every PMA
and hw counter, with rates): a full batch, and a delta in which every port is busy (data and
packet counters, their rates and the byte counts moved). Each is timed as the map encoding
(before packing) and packed; the delta also with the aggregator's merge onto its base.
(Agents send full batches packed and deltas as maps: see `proto.codec.encode`.)
`ingest_*`: CPU per message through the aggregator's `Ingest.handle` (subject, decode,
fleet apply, metrics), full batches with rising seq over 1,000 nodes; `ingest_delta_map_us`:
busy deltas (map form, as agents send them) on each node's full batch. Not a test:
.venv/bin/python bench/codec_counters.py --json   (CPU time, median of --runs)
(`--smoke`: a few loops over 20 nodes, seconds; checks the script still runs)
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import msgspec

REPO: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from loadgen import NodeShape, build_templates, busy_round  # noqa: E402

from agent.counters.deltas import delta_against  # noqa: E402
from aggregator.fleet.ingest import Ingest  # noqa: E402
from aggregator.fleet.state import Fleet, merge_counter_delta  # noqa: E402
from aggregator.metrics import Metrics  # noqa: E402
from proto import codec, subjects  # noqa: E402
from proto.messages.counters import CounterBatch  # noqa: E402

try:  # absent in a copy of an older tree (before packing)
    from proto.packedcounters import pack
except ImportError:
    pack = None  # type: ignore[assignment]

# Run from a copy of an older tree (before packing) it measures the map encoding only.
PACKED: Final = hasattr(codec, "encode_map")
encode_map: Callable[[Any], bytes] = getattr(codec, "encode_map", codec.encode)
INGEST_NODES: Final = 1000
# --smoke: the same path, tiny (make test runs it; its numbers mean nothing).
SMOKE: Final = {"loops": 5, "runs": 1, "ingest_nodes": 20}


def timed(fn: Callable[[], object], loops: int, runs: int) -> float:
    """Median over `runs` of the mean CPU µs per call of `loops` calls (GC on, as in the
    service). CPU time, not wall time: other processes share the machine."""
    results = []
    for _ in range(runs):
        gc.collect()
        start = time.process_time()
        for _ in range(loops):
            fn()
        results.append((time.process_time() - start) / loops * 1e6)
    return round(statistics.median(results), 1)


def packed(batch: CounterBatch) -> bytes:
    """The packed form, deltas included (agents pack only full batches: codec.encode)."""
    return codec.encode(pack(batch))


def ingest_cpu(
    full: CounterBatch, encoder: Callable[[Any], bytes], runs: int, nodes: int = INGEST_NODES
) -> float:
    """Median CPU µs per `Ingest.handle` of a counter batch (`nodes` x 3 rounds)."""
    names = [f"n-{i:04d}" for i in range(nodes)]
    messages = [
        (
            subjects.node_subject(name, subjects.COUNTERS),
            encoder(msgspec.structs.replace(full, node=name, seq=seq)),
        )
        for seq in (10, 11, 12)
        for name in names
    ]
    results = []
    for _ in range(runs):
        ingest = Ingest(
            fleet=Fleet(), metrics=Metrics.create(), clock=time.time, on_snapshot=lambda s, t: None
        )
        gc.collect()
        start = time.process_time()
        for subject, data in messages:
            ingest.handle(subject, data)
        results.append((time.process_time() - start) / len(messages) * 1e6)
    return round(statistics.median(results), 1)


def ingest_delta_cpu(
    full: CounterBatch, delta: CounterBatch, runs: int, nodes: int = INGEST_NODES
) -> float:
    """Median CPU µs per `Ingest.handle` of a busy delta (`nodes` x 3 deltas each on
    the node's full batch, which is applied first and not timed)."""
    names = [f"n-{i:04d}" for i in range(nodes)]
    subject = {name: subjects.node_subject(name, subjects.COUNTERS) for name in names}
    bases = [
        (subject[name], codec.encode(msgspec.structs.replace(full, node=name))) for name in names
    ]
    deltas = [
        (subject[name], encode_map(msgspec.structs.replace(delta, node=name, seq=delta.seq + k)))
        for k in (0, 1, 2)
        for name in names
    ]
    results = []
    for _ in range(runs):
        ingest = Ingest(
            fleet=Fleet(), metrics=Metrics.create(), clock=time.time, on_snapshot=lambda s, t: None
        )
        for subj, data in bases:
            ingest.handle(subj, data)
        gc.collect()
        start = time.process_time()
        for subj, data in deltas:
            ingest.handle(subj, data)
        results.append((time.process_time() - start) / len(deltas) * 1e6)
    return round(statistics.median(results), 1)


def measure(
    shape: NodeShape,
    loops: int,
    runs: int,
    ingest_only: bool = False,
    nodes: int = INGEST_NODES,
) -> dict[str, Any]:
    full = codec.decode(build_templates(shape).counters, CounterBatch)
    delta = delta_against(full, busy_round(full))
    assert delta is not None
    if ingest_only:
        return {
            "ingest_full_map_us": ingest_cpu(full, encode_map, runs, nodes),
            "ingest_delta_map_us": ingest_delta_cpu(full, delta, runs, nodes),
        }
    out: dict[str, Any] = {"ports": len(full.ports)}
    for label, batch in (("full", full), ("delta", delta)):
        forms = [("map", encode_map(batch))] + ([("packed", packed(batch))] if PACKED else [])
        for encoding, data in forms:
            assert codec.decode(data, CounterBatch) == batch
            row: dict[str, Any] = {
                "bytes": len(data),
                "decode_us": timed(lambda d=data: codec.decode(d, CounterBatch), loops, runs),
            }
            encoder = encode_map if encoding == "map" else packed
            row["encode_us"] = timed(lambda b=batch, e=encoder: e(b), loops, runs)
            if label == "delta":
                row["decode_merge_us"] = timed(
                    lambda d=data: merge_counter_delta(full, codec.decode(d, CounterBatch)),
                    loops,
                    runs,
                )
            out[f"{label}_{encoding}"] = row
    out["ingest_full_map_us"] = ingest_cpu(full, encode_map, runs, nodes)
    out["ingest_delta_map_us"] = ingest_delta_cpu(full, delta, runs, nodes)
    if not PACKED:
        return out
    out["ingest_full_packed_us"] = ingest_cpu(full, packed, runs, nodes)
    for label in ("full", "delta"):
        before, after = out[f"{label}_map"], out[f"{label}_packed"]
        out[f"{label}_size_ratio"] = round(before["bytes"] / after["bytes"], 1)
        out[f"{label}_decode_ratio"] = round(before["decode_us"] / after["decode_us"], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=500, help="calls per run")
    parser.add_argument("--runs", type=int, default=7, help="runs (median)")
    parser.add_argument("--counters", type=int, default=21, help="PMA counters per port")
    parser.add_argument("--hw-counters", type=int, default=30, help="hw_counters per port")
    parser.add_argument("--ingest-only", action="store_true", help="Ingest.handle, map form")
    parser.add_argument("--ingest-nodes", type=int, default=INGEST_NODES, help="for ingest_*")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run that checks the script still works, numbers meaningless "
        "(--loops 5 --runs 1 --ingest-nodes 20; options given still win)",
    )
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    shape = NodeShape(counters=args.counters, hw_counters=args.hw_counters)
    result = measure(shape, args.loops, args.runs, args.ingest_only, args.ingest_nodes)
    if args.smoke:
        result["smoke"] = True
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for key, row in result.items():
        print(f"{key:>20}: {row}")


if __name__ == "__main__":
    main()
