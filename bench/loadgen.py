"""Load generator for issue 8: simulated agents in a few processes, one NATS connection each.
Every node publishes a NodeSnapshot, then a CounterBatch (16 ports, made by the agent's own
code) at `hz`, phases spread over the interval: packed full batches every `full_every` rounds,
packed deltas (every port busy) between, spliced from pre-encoded templates and sent in bursts.
Chosen nodes send a port-down LinkEvent; `collected_at`/`observed_at` carry the send time.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.synchronize import Event as MpEvent
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
from agent.lab.spec import with_node_name  # noqa: E402
from agent.lab.synthetic import synthetic_spec  # noqa: E402
from aggregator.bus.natsserver import NatsServer, NatsServerSettings  # noqa: E402
from proto import codec, subjects  # noqa: E402
from proto.compact import inventory_only  # noqa: E402
from proto.inventory import NodeSnapshot  # noqa: E402
from proto.messages.counters import CounterBatch, PortCounters  # noqa: E402
from proto.messages.events import LinkEvent  # noqa: E402
from proto.packedcounters import pack  # noqa: E402

BATCH_SLEEP: Final = 0.002  # snapshots: publish everything due within 2 ms in one go
# Counter batches due within 20 ms go out in one burst (at most 2 % of a 1 s interval early):
# every wake-up costs a loop turn and a socket write, so at 1,000 nodes 2 ms bursts cost
# ~150 ms CPU per 1,000 msgs and 20 ms ones ~40 (10,000 nodes: ~30 -> ~15).
BURST_S: Final = 0.02
ENCODINGS: Final = ("packed", "map")
# Counters a busy port moves every second (with their rates and the byte counts).
BUSY: Final = (
    "port_rcv_data",
    "port_xmit_data",
    "port_rcv_packets",
    "port_xmit_packets",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
)


@dataclass(frozen=True, kw_only=True)
class NodeShape:
    """The synthetic lab node every simulated agent reports (8 dual-port cards = 16 ports)."""

    adapters: int = 8
    ports_per_adapter: int = 2
    counters: int = 21  # PMA files per port (real mlx5 names)
    hw_counters: int = 30


@dataclass(frozen=True, kw_only=True)
class LoadSpec:
    nats_url: str
    nodes: int
    processes: int = 2
    duration_s: float = 20.0  # of counter publishing
    hz: float = 1.0
    snapshot_rate: float = 250.0  # snapshots/s over all processes (agents start staggered)
    prefix: str = "sim"
    shape: NodeShape = field(default_factory=NodeShape)
    # (node index, seconds after the counter start) of each injected port-down event
    port_down: tuple[tuple[int, float], ...] = ()
    encoding: str = "packed"  # of full counter batches: packed (agents today) | map (before)
    full_every: int = 30  # a full batch every n rounds, deltas between (1: full only)
    snapshots: bool = True  # False: no snapshot phase (a run that only needs the counters)
    burst_s: float = BURST_S  # counter batches due within this are sent in one burst


@dataclass
class Templates:
    snapshot: bytes  # encoded NodeSnapshot of node "tpl"
    counters: bytes  # encoded CounterBatch (with rates) of node "tpl"
    device: str  # first RDMA device: the port-down events target <device>/1
    delta: bytes = b""  # the round after `counters` with every port busy, as a delta on it


def node_name(prefix: str, index: int) -> str:
    return f"{prefix}-{index:05d}"


def spread_port_downs(
    nodes: int, count: int, first_s: float, last_s: float
) -> tuple[tuple[int, float], ...]:
    """`count` events on distinct nodes spread over the node range, evenly in [first, last]."""
    count = min(count, nodes)
    if count <= 0:
        return ()
    step_t = (last_s - first_s) / max(count - 1, 1)
    return tuple(
        ((k * nodes) // count + nodes // (2 * count), first_s + k * step_t) for k in range(count)
    )


def build_templates(shape: NodeShape) -> Templates:
    """Render one synthetic node, collect its snapshot and two counter rounds (so rates are
    present) with the agent's own code, and encode them."""
    spec = synthetic_spec(
        shape.adapters, shape.ports_per_adapter, shape.hw_counters, shape.counters
    )
    with tempfile.TemporaryDirectory(prefix="nicfleet-loadgen-") as tmp:
        root = Path(tmp) / "tpl"
        render(with_node_name(spec, "tpl"), root)
        sysfs = Sysfs(root)
        now = time.time()
        snap = collect_snapshot(sysfs, node="tpl", seq=1, now=now - 2, agent_version="loadgen")
        device = snap.devices[0].name
        with CounterReader(sysfs) as reader:
            first = reader.collect(node="tpl", seq=1, now=now - 1)
            port = first.ports[0]
            name = next(iter(port.counters), None) or next(iter(port.hw_counters), None)
            if name is not None:  # one counter moves, so the batch carries a real rate
                group = "counters" if name in port.counters else "hw_counters"
                faults.bump_counter(root, port.device, port.port, f"{group}/{name}", 1000)
            batch = with_rates(first, reader.collect(node="tpl", seq=2, now=now))
    delta = delta_against(batch, busy_round(batch))
    return Templates(
        snapshot=codec.encode(inventory_only(snap)),  # as agents publish it (docs/wire.md)
        counters=codec.encode(batch),
        device=device,
        delta=codec.encode(delta) if delta is not None else b"",
    )


def busy_round(base: CounterBatch, step: int = 1_000_000) -> CounterBatch:
    """`base` one second later with every port moving `step` bytes and packets."""

    def port(p: PortCounters) -> PortCounters:
        counters = {k: v + step if k in BUSY else v for k, v in p.counters.items()}
        moving = {f"counters/{name}" for name in BUSY} | {"rx_bytes", "tx_bytes"}
        rates = {k: float(step) if k in moving else v for k, v in p.rates.items()}
        return msgspec.structs.replace(
            p,
            counters=counters,
            rx_bytes=(p.rx_bytes or 0) + step,
            tx_bytes=(p.tx_bytes or 0) + step,
            rates=rates,
        )

    return msgspec.structs.replace(
        base,
        seq=base.seq + 1,
        collected_at=base.collected_at + 1,
        ports=tuple(map(port, base.ports)),
    )


VARYING: Final = ("node", "seq", "collected_at", "interval_s", "base_seq")
_encoder: Final = msgspec.msgpack.Encoder()


class Spliced:
    """One message type's template encoded once: every field but `VARYING` is kept as
    pre-encoded msgpack (`msgspec.Raw`) in the map or array the Struct encodes to (tag
    first, fields in order), so a message costs one small encode — byte-identical to
    encoding the whole Struct with those fields replaced."""

    def __init__(self, template: msgspec.Struct) -> None:
        config = template.__struct_config__
        items: list[tuple[str, Any]] = []
        if config.tag_field is not None:
            items.append((config.tag_field, config.tag))
        slots: dict[str, str | int] = {}
        for f in msgspec.structs.fields(template):
            if f.name in VARYING:
                slots[f.name] = len(items) if config.array_like else f.encode_name
                items.append((f.encode_name, None))
            else:
                fixed = msgspec.Raw(_encoder.encode(getattr(template, f.name)))
                items.append((f.encode_name, fixed))
        if set(slots) != set(VARYING):
            raise ValueError(f"{type(template).__name__} lacks {set(VARYING) - set(slots)}")
        self._frame: Any = [v for _, v in items] if config.array_like else dict(items)
        self._slots = tuple(slots[name] for name in VARYING)

    def encode(
        self, node: str, seq: int, collected_at: float, interval_s: float, base_seq: int | None
    ) -> bytes:
        frame = self._frame.copy()
        a, b, c, d, e = self._slots
        frame[a], frame[b], frame[c], frame[d], frame[e] = (
            node,
            seq,
            collected_at,
            interval_s,
            base_seq,
        )
        return _encoder.encode(frame)


class CounterStream:
    """One worker's counter messages: the full batch and the delta (both packed, as
    codec.encode sends them, or maps as older agents did) spliced from pre-encoded
    templates; per message only node, seq, times and base_seq are encoded."""

    def __init__(self, tpl: Templates, encoding: str) -> None:
        full = codec.decode(tpl.counters, CounterBatch)
        delta = codec.decode(tpl.delta, CounterBatch) if tpl.delta else full
        self._full = Spliced(pack(full) if encoding == "packed" else full)
        self._delta = Spliced(pack(delta) if encoding == "packed" else delta)

    def message(
        self, node: str, seq: int, now: float, period: float, base_seq: int | None
    ) -> bytes:
        frame = self._full if base_seq is None else self._delta
        return frame.encode(node, seq, now, period, base_seq)


@dataclass
class WorkerStats:
    worker: int
    nodes: int
    snapshots: int = 0
    counters: int = 0
    counter_bytes: int = 0
    cpu_s: float = 0.0  # process CPU time of the counter phase
    events: list[tuple[str, float]] = field(default_factory=list)  # (node, sent wall time)
    late_ms: dict[str, float] = field(default_factory=dict)  # publish time after due time
    errors: list[str] = field(default_factory=list)


def phase_offsets(mine: list[int], nodes: int, period: float) -> list[float]:
    """Each node's send time within a round: phases spread evenly over the interval (so a
    worker's offsets ascend with its node indexes)."""
    return [(i / nodes) * period for i in mine]


def burst_end(offsets: list[float], start: int, round_at: float, horizon: float) -> int:
    """One past the last node (from `start`) due by `horizon` in the round starting at
    `round_at`: the burst sent in one go."""
    return bisect.bisect_right(offsets, horizon - round_at, lo=start)


def lateness_summary(late_s: list[float]) -> dict[str, float]:
    """p50 / p99 / max of how late (s) messages left after their due time, in ms."""
    if not late_s:
        return {}
    ordered = sorted(late_s)
    return {
        "p50": round(statistics.median(ordered) * 1000, 1),
        "p99": round(ordered[int(0.99 * (len(ordered) - 1))] * 1000, 1),
        "max": round(ordered[-1] * 1000, 1),
    }


def is_full_round(tick: int, index: int, full_every: int) -> bool:
    """A full batch in the first round, then every `full_every` rounds, phases spread over
    the nodes (node `index` sends its full batch when (tick + index) % full_every == 0)."""
    return tick == 0 or (tick + index) % full_every == 0


async def _run_worker(
    spec: LoadSpec, worker: int, tpl: Templates, sent: Any, go: MpEvent, start_at: Any
) -> WorkerStats:
    mine = list(range(worker, spec.nodes, spec.processes))
    names = [node_name(spec.prefix, i) for i in mine]
    stats = WorkerStats(worker=worker, nodes=len(mine))
    snap_t = codec.decode(tpl.snapshot, NodeSnapshot)
    stream = CounterStream(tpl, spec.encoding)
    last_full = [0] * len(names)  # seq of each node's last full batch
    replace = msgspec.structs.replace

    async def on_error(exc: Exception) -> None:
        if len(stats.errors) < 20:
            stats.errors.append(repr(exc))

    nc = await nats.connect(
        spec.nats_url, name=f"loadgen-{worker}", error_cb=on_error, pending_size=64 * 1024 * 1024
    )
    try:
        begin, gap = time.monotonic(), spec.processes / spec.snapshot_rate
        for k, name in enumerate(names if spec.snapshots else ()):
            ahead = begin + k * gap - time.monotonic()
            if ahead > BATCH_SLEEP:
                await asyncio.sleep(ahead)
            snap = replace(snap_t, node=name, collected_at=time.time())
            await nc.publish(subjects.node_subject(name, subjects.SNAPSHOT), codec.encode(snap))
            stats.snapshots += 1
        await nc.flush(timeout=60)
        sent.put(worker)
        await asyncio.to_thread(go.wait)
        t0 = float(start_at.value)
        cpu0 = time.process_time()
        downs = {mine.index(i): off for i, off in spec.port_down if i in mine}
        counter_subjects = [subjects.node_subject(n, subjects.COUNTERS) for n in names]
        period = 1.0 / spec.hz
        offsets = phase_offsets(mine, spec.nodes, period)
        late: list[float] = []
        publish, message, full_every = nc.publish, stream.message, spec.full_every
        for tick in range(int(spec.duration_s * spec.hz)):
            round_at, seq, j = t0 + tick * period, tick + 2, 0
            while j < len(names):
                now = time.time()
                ahead = round_at + offsets[j] - now
                if ahead > spec.burst_s:
                    await asyncio.sleep(ahead)
                    continue
                end = burst_end(offsets, j, round_at, now + spec.burst_s)
                for k in range(j, end):  # the burst: no suspension until it is all queued
                    late.append(max(0.0, now - round_at - offsets[k]))
                    if is_full_round(tick, mine[k], full_every):
                        last_full[k] = seq
                    base = None if last_full[k] == seq else last_full[k]
                    data = message(names[k], seq, now, period, base)
                    await publish(counter_subjects[k], data)  # queued (suspends only past 64 MB)
                    stats.counter_bytes += len(data)
                    off = downs.get(k)
                    if off is not None and tick * period <= off < (tick + 1) * period:
                        stats.events.append((names[k], await _port_down(nc, names[k], tpl.device)))
                stats.counters += end - j
                j = end
                await asyncio.sleep(0)  # let nats-py's flusher write the burst
        await nc.flush(timeout=60)
        stats.cpu_s = round(time.process_time() - cpu0, 3)
        stats.late_ms = lateness_summary(late)
    finally:
        await nc.close()
    return stats


async def _port_down(nc: Any, node: str, device: str) -> float:
    now = time.time()
    event = LinkEvent(
        node=node,
        seq=1,
        kind="port-state",
        device=device,
        port=1,
        old_state="ACTIVE",
        new_state="DOWN",
        phys_state="Disabled",
        observed_at=now,
    )
    await nc.publish(subjects.node_subject(node, subjects.EVENT), codec.encode(event))
    return now


def _worker_main(
    spec: LoadSpec,
    worker: int,
    tpl: Templates,
    sent: Any,
    go: MpEvent,
    start_at: Any,
    results: Any,
) -> None:
    try:
        stats = asyncio.run(_run_worker(spec, worker, tpl, sent, go, start_at))
    except Exception as exc:  # reported to the parent, which fails loudly
        stats = WorkerStats(worker=worker, nodes=0, errors=[f"worker crashed: {exc!r}"])
        sent.put(worker)
    results.put(asdict(stats))


class LoadGen:
    """Start the workers (they publish snapshots), then `go()` starts the counters."""

    def __init__(self, spec: LoadSpec, templates: Templates | None = None) -> None:
        self.spec = spec
        self.templates = templates or build_templates(spec.shape)
        ctx = mp.get_context("spawn")
        self._sent = ctx.Queue()
        self._results = ctx.Queue()
        self._go = ctx.Event()
        self._start_at = ctx.Value("d", 0.0)
        self._procs = [
            ctx.Process(
                target=_worker_main,
                daemon=True,
                args=(spec, w, self.templates, self._sent, self._go, self._start_at, self._results),
            )
            for w in range(spec.processes)
        ]
        self.start_at = 0.0

    def start(self, timeout: float = 300.0) -> None:
        """Spawn the workers and return once every snapshot is published."""
        for proc in self._procs:
            proc.start()
        for _ in self._procs:
            self._sent.get(timeout=timeout)

    def go(self, delay: float = 0.5) -> float:
        self.start_at = self._start_at.value = time.time() + delay
        self._go.set()
        return self.start_at

    def finish(self, timeout: float = 120.0) -> dict[str, Any]:
        stats = [self._results.get(timeout=self.spec.duration_s + timeout) for _ in self._procs]
        for proc in self._procs:
            proc.join(timeout=10)
        events = sorted((e for s in stats for e in s["events"]), key=lambda e: e[1])
        return {
            "nodes": self.spec.nodes,
            "processes": self.spec.processes,
            "hz": self.spec.hz,
            "encoding": self.spec.encoding,
            "full_every": self.spec.full_every,
            "counter_bytes_per_msg": round(
                sum(s["counter_bytes"] for s in stats) / max(1, sum(s["counters"] for s in stats))
            ),
            "snapshot_bytes": len(self.templates.snapshot),
            "snapshots": sum(s["snapshots"] for s in stats),
            "counters": sum(s["counters"] for s in stats),
            "counter_bytes": sum(s["counter_bytes"] for s in stats),
            "events": events,
            "late_ms_p99_worst": max((s["late_ms"].get("p99", 0.0) for s in stats), default=0),
            "late_ms_max": max((s["late_ms"].get("max", 0.0) for s in stats), default=0),
            "cpu_s": round(sum(s["cpu_s"] for s in stats), 3),
            "cpu_ms_per_1000_msgs": round(
                1e6 * sum(s["cpu_s"] for s in stats) / max(1, sum(s["counters"] for s in stats)),
                1,
            ),
            "errors": [e for s in stats for e in s["errors"]],
        }

    def stop(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)


# --smoke: the same path, a few nodes for two seconds against a nats-server of its own
# (make test runs it; its numbers mean nothing).
SMOKE: Final = {"nodes": 20, "processes": 1, "duration": 2.0, "port_downs": 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nats-url", help="required unless --smoke")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of counters")
    parser.add_argument("--hz", type=float, default=1.0)
    parser.add_argument("--port-downs", type=int, default=0, help="port-down events to inject")
    parser.add_argument("--encoding", choices=ENCODINGS, default="packed")
    parser.add_argument("--full-every", type=int, default=30, help="1: full batches only")
    parser.add_argument("--burst-ms", type=float, default=BURST_S * 1000, help="send window")
    parser.add_argument("--snapshot-rate", type=float, default=250.0, help="snapshots/s at start")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run of the same code path, numbers meaningless "
        "(a nats-server of its own unless --nats-url, --nodes 20 --processes 1 --duration 2 "
        "--port-downs 1; options given still win)",
    )
    args = parser.parse_args()
    if args.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    if args.nats_url is None and not args.smoke:
        parser.error("--nats-url is required (or --smoke)")
    with contextlib.ExitStack() as stack:
        if args.nats_url is None:
            args.nats_url = stack.enter_context(NatsServer(NatsServerSettings())).url
        result = generate(args)
    if args.smoke:
        result["smoke"] = True
    if args.json:
        print(json.dumps(result, indent=2))
        return
    rate = result["counters"] / args.duration
    print(
        f"{result['nodes']} nodes, {rate:.0f} counter msgs/s of "
        f"{result['counter_bytes_per_msg']} B, generator late p99 "
        f"{result['late_ms_p99_worst']} ms, CPU {result['cpu_ms_per_1000_msgs']} ms per 1,000 "
        f"msgs, {len(result['events'])} port-down events, "
        f"errors: {result['errors'] or 'none'}"
    )
    if args.smoke and result["errors"]:
        raise SystemExit(f"--smoke: the generator reported errors: {result['errors']}")


def generate(args: argparse.Namespace) -> dict[str, Any]:
    spec = LoadSpec(
        nats_url=args.nats_url,
        nodes=args.nodes,
        processes=args.processes,
        duration_s=args.duration,
        hz=args.hz,
        port_down=spread_port_downs(args.nodes, args.port_downs, 1.0, args.duration - 1.0),
        encoding=args.encoding,
        full_every=args.full_every,
        snapshot_rate=args.snapshot_rate,
        burst_s=args.burst_ms / 1000,
    )
    gen = LoadGen(spec)
    try:
        gen.start()
        gen.go()
        return gen.finish()
    finally:
        gen.stop()


if __name__ == "__main__":
    main()
