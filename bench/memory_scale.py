"""Benchmark: aggregator memory per node (issue 8): RSS of a real process, and where it goes.

`--process`: a real nats-server and `python -m aggregator run`; per node a 12-NIC lab snapshot,
a full counter batch with rates and a delta on it (every port busy) are published, paced by
the process's own ingest counters; RSS (VmRSS) settled after ingest minus RSS when empty,
over N. `--where`: the same messages decoded into an in-process Fleet; a deep walk (shared
objects counted once) splits the bytes by part and type, and estimates interning and
`gc=False`. Never a test. Run: .venv/bin/python bench/memory_scale.py --json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec
import nats

REPO: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.counters.deltas import delta_against  # noqa: E402
from agent.counters.rates import with_rates  # noqa: E402
from agent.counters.reader import CounterReader  # noqa: E402
from agent.host.inventory import collect_snapshot  # noqa: E402
from agent.host.sysfs import Sysfs  # noqa: E402
from agent.lab import faults  # noqa: E402
from agent.lab.render import render  # noqa: E402
from agent.lab.spec import load_builtin, with_node_name  # noqa: E402
from aggregator.bus.natsserver import NatsServer, NatsServerSettings  # noqa: E402
from aggregator.fleet.heldcounters import CounterBase, HeldCounters  # noqa: E402
from aggregator.fleet.state import Fleet  # noqa: E402
from bench.loadgen import busy_round  # noqa: E402
from proto import codec, subjects  # noqa: E402
from proto.inventory import NodeSnapshot  # noqa: E402
from proto.messages.counters import CounterBatch  # noqa: E402
from proto.packedcounters import PackedCounterBatch, pack, unpack  # noqa: E402

TARGET_KB: Final = 50.0
# --smoke: both paths on a few nodes (make test runs it; its numbers mean nothing).
SMOKE: Final = {"nodes": [50], "runs": 1, "process": True, "where": 20, "sample": 10}
LAB: Final = "h100-ib-12nic"
CHUNK: Final = 250
# "interned": the decode proposed before interning landed (proto/compact.py, packedcounters).
VARIANTS: Final = (
    ("baseline", "interned") if "--interned" in sys.argv else ("baseline",)
)  # nodes published before waiting for the aggregator to catch up


@dataclass(frozen=True)
class Templates:
    snapshot: NodeSnapshot
    full: CounterBatch
    delta: CounterBatch


def build_templates() -> Templates:
    """One 12-NIC lab node: its snapshot, a full counter batch with rates, a busy delta."""
    with tempfile.TemporaryDirectory(prefix="nicfleet-mem-") as tmp:
        root = Path(tmp) / "tpl"
        render(with_node_name(load_builtin(LAB), "tpl"), root)
        sysfs = Sysfs(root)
        now = time.time()
        snap = collect_snapshot(sysfs, node="tpl", seq=1, now=now - 2, agent_version="bench")
        with CounterReader(sysfs) as reader:
            first = reader.collect(node="tpl", seq=1, now=now - 1)
            port = first.ports[0]
            name = next(iter(port.counters))
            faults.bump_counter(root, port.device, port.port, f"counters/{name}", 1000)
            full = with_rates(first, reader.collect(node="tpl", seq=2, now=now))
    delta = delta_against(full, busy_round(full))
    assert delta is not None
    return Templates(snapshot=snap, full=full, delta=delta)


def messages(tpl: Templates, node: str) -> Iterator[tuple[str, bytes]]:
    """The node's three messages as agents send them (counters packed)."""
    rep = msgspec.structs.replace
    yield subjects.node_subject(node, subjects.SNAPSHOT), codec.encode(rep(tpl.snapshot, node=node))
    yield (
        subjects.node_subject(node, subjects.COUNTERS),
        codec.encode(pack(rep(tpl.full, node=node))),
    )
    yield (
        subjects.node_subject(node, subjects.COUNTERS),
        codec.encode(pack(rep(tpl.delta, node=node))),
    )


def node_name(i: int) -> str:
    return f"mem-{i:05d}"


# --- a real aggregator process ---------------------------------------------------------


def rss_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of `pid` in KiB."""
    text = Path(f"/proc/{pid}/status").read_text()
    fields = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", text, re.M))
    return int(fields["VmRSS"]), int(fields["VmHWM"])


def ingested(api_url: str) -> float:
    """Node messages the aggregator applied; -1 while its API does not answer in time."""
    try:
        with urllib.request.urlopen(f"{api_url}/metrics", timeout=30) as resp:
            text = resp.read().decode()
    except (TimeoutError, OSError):
        return -1
    return sum(
        float(v) for v in re.findall(r"^nicfleet_ingest_messages_total\{[^}]*\} (\S+)", text, re.M)
    )


async def wait_for(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(cond):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout}s")
        await asyncio.sleep(0.1)


async def settled_rss(pid: int, timeout: float = 180.0, every: float = 0.5) -> int:
    """RSS once it moved < 1 % over the last 6 samples `every` s apart (3 s: the first rule
    evaluation runs meanwhile; --smoke samples faster)."""
    samples: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        samples.append(rss_kb(pid)[0])
        last = samples[-7:]
        if len(last) == 7 and max(last) - min(last) < 0.01 * max(last):
            return last[-1]
        await asyncio.sleep(every)
    return samples[-1]


def spawn(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def process_run(tpl: Templates, nodes: int, work: Path, every: float) -> dict[str, Any]:
    with NatsServer(NatsServerSettings(store_dir=work / "js")) as server:
        ready = work / "aggregator.ready"
        argv = [sys.executable, "-m", "aggregator", "run", "--nats-url", server.url,
                "--listen", "127.0.0.1:0", "--ready-file", str(ready)]  # fmt: skip
        proc = spawn(argv)
        try:
            await wait_for(ready.exists, 60, "aggregator ready")
            doc = json.loads(ready.read_text())
            pid, api = int(doc["pid"]), str(doc["api_url"])
            empty = await settled_rss(pid, every=every)
            nc = await nats.connect(server.url)
            sent = 0
            started = time.monotonic()
            for first in range(0, nodes, CHUNK):
                for i in range(first, min(nodes, first + CHUNK)):
                    for subject, data in messages(tpl, node_name(i)):
                        await nc.publish(subject, data)
                        sent += 1
                await nc.flush()
                target = sent - CHUNK  # at most one chunk in flight
                await wait_for(lambda t=target: ingested(api) >= t, 600, "ingest")
            await wait_for(lambda: ingested(api) >= sent, 600, "ingest")
            ingest_s = time.monotonic() - started
            await nc.close()
            full = await settled_rss(pid, every=every)
            peak = rss_kb(pid)[1]
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
    return {"rss_empty_kb": empty, "rss_kb": full, "hwm_kb": peak, "ingest_s": round(ingest_s, 1),
            "per_node_kb": round((full - empty) / nodes, 1)}  # fmt: skip


def measure_process(tpl: Templates, nodes: int, runs: int, every: float) -> dict[str, Any]:
    results = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="nicfleet-mem-") as tmp:
            results.append(asyncio.run(process_run(tpl, nodes, Path(tmp), every)))
            print(json.dumps({"nodes": nodes, **results[-1]}), file=sys.stderr)
    per_node = [r["per_node_kb"] for r in results]
    return {
        "nodes": nodes,
        "runs": results,
        "per_node_kb": {"median": statistics.median(per_node), "min": min(per_node),
                        "max": max(per_node)},
        "rss_mb_median": round(statistics.median(r["rss_kb"] for r in results) / 1024, 1),
    }  # fmt: skip


# --- where it goes (in-process) --------------------------------------------------------


def _interned(value: Any) -> Any:
    """Builtins with every str (keys and values) interned."""
    if isinstance(value, str):
        return sys.intern(value)
    if isinstance(value, dict):
        return {sys.intern(k): _interned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_interned(v) for v in value]
    return value


_snapshot_builtins = msgspec.msgpack.Decoder()


def decode_interned(data: bytes, kind: str) -> NodeSnapshot | CounterBatch:
    """The proposed decode: counters with the packed names interned before unpacking (one
    intern per name per message), snapshots (rare) via builtins with all strings interned."""
    if kind == subjects.SNAPSHOT:
        return msgspec.convert(_interned(_snapshot_builtins.decode(data)), NodeSnapshot)
    packed = msgspec.msgpack.decode(data, type=PackedCounterBatch)
    names = tuple(map(sys.intern, packed.names))
    return unpack(msgspec.structs.replace(packed, names=names))


def build_fleet(tpl: Templates, nodes: int, variant: str) -> tuple[Fleet, float]:
    """The fleet after every node's messages, and the seconds spent decoding them."""
    fleet = Fleet()
    decoding = 0.0
    for i in range(nodes):
        for subject, data in messages(tpl, node_name(i)):
            kind = subject.rsplit(".", 1)[1]
            t0 = time.perf_counter()
            if variant == "interned":
                msg = decode_interned(data, kind)
            elif kind == subjects.SNAPSHOT:
                msg = codec.decode(data, NodeSnapshot)
            else:
                msg = codec.decode(data, CounterBatch)
            decoding += time.perf_counter() - t0
            if isinstance(msg, NodeSnapshot):
                fleet.apply_snapshot(msg, 1.0)
            else:
                fleet.apply_counters(msg, 1.0, data)  # held as received, like the ingest
    return fleet, decoding


class Walker:
    """Deep size with shared objects counted once; per type and per part."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.by_type: Counter[str] = Counter()
        self.structs = 0
        self.strings: Counter[str] = Counter()  # value -> bytes of its copies seen
        self.string_copies: Counter[str] = Counter()

    def size(self, obj: Any) -> int:
        total = 0
        stack = [obj]
        while stack:
            o = stack.pop()
            if id(o) in self.seen or o is None or isinstance(o, bool):
                continue
            self.seen.add(id(o))
            n = sys.getsizeof(o)
            total += n
            self.by_type[type(o).__name__ if not isinstance(o, msgspec.Struct) else "Struct"] += n
            if isinstance(o, msgspec.Struct):
                self.structs += 1
                stack.extend(getattr(o, f) for f in o.__struct_fields__)
            elif isinstance(o, HeldCounters | CounterBase):  # __slots__ classes
                stack.extend(getattr(o, f) for f in type(o).__slots__)
            elif isinstance(o, dict):
                stack.extend(o.keys())
                stack.extend(o.values())
            elif isinstance(o, tuple | list):
                stack.extend(o)
            elif isinstance(o, str):
                self.strings[o] += n
                self.string_copies[o] += 1
        return total


def walk(fleet: Fleet, sample: int) -> dict[str, Any]:
    walker = Walker()
    parts: Counter[str] = Counter()
    bases = fleet._counter_bases  # measuring what the fleet holds
    records = fleet.records()[:sample]
    for record in records:
        parts["record"] += sys.getsizeof(record)
        walker.seen.add(id(record))
        parts["snapshot"] += walker.size(record.snapshot)
        # The base first: what the latest batch holds beyond it is its own part.
        parts["counter base"] += walker.size(bases.get(record.name))
        parts["counters held (latest delta)"] += walker.size(record.counters_held)
        parts["events + status"] += walker.size(record.events) + walker.size(record.device_plugin)
    n = len(records)
    dup_bytes = sum(b - b // walker.string_copies[s] for s, b in walker.strings.items())
    gc_header = 16  # bytes per instance that gc=False saves (sys.getsizeof 48 -> 32)
    return {
        "walk_sample_nodes": n,
        "walk_per_node_kb": round(sum(parts.values()) / n / 1024, 1),
        "parts_per_node_kb": {k: round(v / n / 1024, 1) for k, v in parts.items()},
        "types_per_node_kb": {k: round(v / n / 1024, 1) for k, v in walker.by_type.most_common(8)},
        "structs_per_node": round(walker.structs / n),
        "saving_gc_false_per_node_kb": round(walker.structs * gc_header / n / 1024, 1),
        "duplicate_str_per_node_kb": round(dup_bytes / n / 1024, 1),
        "distinct_strings_in_sample": len(walker.strings),
    }


def decode_cost(tpl: Templates, variant: str, nodes: int = 300) -> float:
    """Median over 3 rounds of the decode time of one node's three messages, in µs."""
    rounds = []
    for _ in range(3):
        rounds.append(build_fleet(tpl, nodes, variant)[1] / nodes * 1e6)
    return round(statistics.median(rounds))


def where(tpl: Templates, nodes: int, sample: int, top: int) -> dict[str, Any]:
    """Per variant (baseline: the code as it is; interned: the proposed decode)."""
    out: dict[str, Any] = {"nodes": nodes}
    for variant in VARIANTS:
        gc.collect()
        objects_before = len(gc.get_objects())
        tracemalloc.start()
        fleet, _ = build_fleet(tpl, nodes, variant)
        traced, _ = tracemalloc.get_traced_memory()
        snap = tracemalloc.take_snapshot()
        tracemalloc.stop()
        lines = [
            {"where": f"{Path(s.traceback[0].filename).name}:{s.traceback[0].lineno}",
             "mb": round(s.size / 2**20, 1), "per_node_kb": round(s.size / nodes / 1024, 2)}
            for s in snap.statistics("lineno")[:top]
        ]  # fmt: skip
        del snap
        gc.collect()
        tracked = len(gc.get_objects()) - objects_before
        t0 = time.perf_counter()
        gc.collect()
        full_gc_s = time.perf_counter() - t0
        out[variant] = {
            "traced_per_node_kb": round(traced / nodes / 1024, 1),
            "decode_us_per_node": decode_cost(tpl, variant),
            "top_allocations": lines,
            "gc_tracked_objects_per_node": round(tracked / nodes),
            "full_gc_s": round(full_gc_s, 3),
            **walk(fleet, sample),
        }
        del fleet
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--process", action="store_true", help="RSS of a real aggregator")
    parser.add_argument("--where", type=int, default=0, metavar="N", help="in-process, N nodes")
    parser.add_argument("--sample", type=int, default=300, help="nodes walked with --where")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--interned", action="store_true", help="--where: the old proposal too")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run of the same code path, numbers meaningless "
        "(--process --nodes 50 --runs 1 --where 20 --sample 10; options given still win)",
    )
    opts = parser.parse_args()
    if opts.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(**SMOKE)
        opts = parser.parse_args()
    tpl = build_templates()
    sizes = {
        "snapshot_bytes": len(codec.encode(tpl.snapshot)),
        "full_batch_bytes": len(codec.encode(pack(tpl.full))),
        "delta_batch_bytes": len(codec.encode(pack(tpl.delta))),
        "ports": len(tpl.full.ports),
    }
    result: dict[str, Any] = {"benchmark": "memory_scale", "target_kb_per_node": TARGET_KB,
                              "lab": LAB, "messages": sizes}  # fmt: skip
    if opts.process:
        every = 0.1 if opts.smoke else 0.5  # RSS sampling while it settles
        result["process"] = [measure_process(tpl, n, opts.runs, every) for n in opts.nodes]
    if opts.where:
        result["where"] = where(tpl, opts.where, opts.sample, top=10)
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                         "load_avg": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip
    if opts.smoke:
        result["smoke"] = True
    print(json.dumps(result, indent=2 if opts.json else None))


if __name__ == "__main__":
    main()
