"""Benchmark (issue 8): bytes per second one agent puts on NATS, full batches vs deltas.

Renders a lab node (default `h100-ib-12nic`), moves its counter files the way a node with
a few busy ports and many idle ones does, and runs the agent's counter path on it (real
CounterReader, with_rates, DeltaEncoder, codec) for --rounds rounds of 1 s (timestamps
passed in, no sleeping). Bytes are the encoded payloads plus the NATS PUB line; with
--nats they are also published to a real nats-server on 127.0.0.1 and checked against its
/varz `in_bytes`. Median of --runs (one motion seed each). Never a test.
Run: .venv/bin/python bench/agent_bytes.py --json   (`--smoke`: seconds, checks it still runs)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import socket
import statistics
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

REPO: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import nats  # noqa: E402

from agent import __version__  # noqa: E402
from agent.counters.deltas import DEFAULT_FULL_EVERY, DeltaEncoder  # noqa: E402
from agent.counters.rates import with_rates  # noqa: E402
from agent.counters.reader import CounterReader  # noqa: E402
from agent.host.inventory import collect_snapshot  # noqa: E402
from agent.host.sysfs import Sysfs  # noqa: E402
from agent.lab.render import render  # noqa: E402
from agent.lab.spec import load_builtin, with_node_name  # noqa: E402
from aggregator.bus.natsserver import NatsServer, NatsServerSettings  # noqa: E402
from proto import subjects  # noqa: E402
from proto.codec import decode, encode  # noqa: E402
from proto.compact import inventory_only  # noqa: E402
from proto.messages.counters import CounterBatch  # noqa: E402

NODE: Final = "bench-ib-01.example"
T0: Final = 1_800_000_000.0
INTERVAL: Final = 1.0
INVENTORY_INTERVAL: Final = 300.0  # the agent's default periodic snapshot
# --smoke: the same path on a few rounds (make test runs it; its numbers mean nothing).
SMOKE: Final = {"rounds": 10, "runs": 2, "nats": True}
# A busy port moves its data and packet counters every round (RDMA writes and reads of a
# training job) and now and then an error or congestion counter; an idle port sees a
# few management packets now and then.
BUSY_COUNTERS: Final = (
    ("counters", "port_rcv_data", 10**9), ("counters", "port_xmit_data", 10**9),
    ("counters", "port_rcv_packets", 10**6), ("counters", "port_xmit_packets", 10**6),
    ("counters", "unicast_rcv_packets", 10**6), ("counters", "unicast_xmit_packets", 10**6),
    ("counters", "port_xmit_wait", 10**5), ("hw_counters", "rx_write_requests", 10**6),
    ("hw_counters", "rx_read_requests", 10**4),
)  # fmt: skip
BUSY_SOMETIMES: Final = (
    ("hw_counters", "out_of_sequence"), ("hw_counters", "packet_seq_err"),
    ("hw_counters", "local_ack_timeout_err"), ("counters", "port_rcv_errors"),
)  # fmt: skip
IDLE_COUNTERS: Final = (
    ("counters", "port_rcv_packets"), ("counters", "port_xmit_packets"),
    ("counters", "multicast_rcv_packets"),
)  # fmt: skip


@dataclass
class Run:
    seed: int
    rounds: int
    full_messages: int  # batches sent full in the delta run
    full_payload_bytes: int  # every batch full (before)
    delta_payload_bytes: int  # deltas between periodic full ones (after)
    full_wire_bytes: int  # payload + PUB line + CRLF
    delta_wire_bytes: int
    snapshot_bytes: int  # one NodeSnapshot of the node, inventory only (as published)
    ports: int = 0
    varz_full_in_bytes: int | None = None
    varz_delta_in_bytes: int | None = None


class Motion:
    """Moves counter files in place (same inode: the reader's descriptors stay valid)."""

    def __init__(self, root: Path, busy: int, seed: int) -> None:
        self.rng = random.Random(seed)
        ports = sorted((root / "class/infiniband").glob("*/ports/*"))
        self.rng.shuffle(ports)
        self.busy, self.idle = ports[:busy], ports[busy:]
        self.values: dict[Path, int] = {}

    def bump(self, path: Path, by: int) -> None:
        if not path.exists():
            return
        value = self.values.get(path)
        if value is None:
            value = int(path.read_text().split()[0])
        self.values[path] = value + by
        with path.open("r+") as file:
            file.write(f"{value + by}\n")
            file.truncate()

    def step(self) -> None:
        for port in self.busy:
            for group, name, scale in BUSY_COUNTERS:
                self.bump(port / group / name, self.rng.randint(scale // 2, scale))
            for group, name in BUSY_SOMETIMES:
                if self.rng.random() < 0.05:
                    self.bump(port / group / name, 1)
        for port in self.idle:
            if self.rng.random() < 0.1:
                for group, name in IDLE_COUNTERS:
                    self.bump(port / group / name, self.rng.randint(1, 3))


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for the server's monitoring endpoint."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pub_line_bytes(subject: str, payload: int) -> int:
    """Client-to-server bytes of one core-NATS publish without headers."""
    return len(f"PUB {subject} {payload}\r\n") + payload + 2


def simulate(
    spec: str, busy: int, rounds: int, full_every: int, seed: int, root: Path
) -> tuple[list[bytes], list[bytes], int, int]:
    """Encoded full batches, the messages actually sent, how many of those were full,
    and the size of the snapshot as the agent publishes it (inventory only, no counters)."""
    render(with_node_name(load_builtin(spec), NODE), root)
    sysfs = Sysfs(root)
    snapshot = collect_snapshot(sysfs, node=NODE, seq=1, now=T0, agent_version=__version__)
    motion = Motion(root, busy, seed)
    jitter = random.Random(seed + 1)
    encoder = DeltaEncoder(full_every=full_every, size=lambda m: len(encode(m)))
    fulls: list[bytes] = []
    deltas: list[bytes] = []
    full_messages = 0
    previous: CounterBatch | None = None
    with CounterReader(sysfs) as reader:
        for seq in range(1, rounds + 1):
            motion.step()
            now = T0 + seq * INTERVAL + jitter.uniform(-0.002, 0.002)
            previous = batch = with_rates(previous, reader.collect(node=NODE, seq=seq, now=now))
            message = encoder.encode(batch)
            encoder.sent(message, True)
            full_messages += message.base_seq is None
            fulls.append(encode(batch))
            deltas.append(encode(message))
    return fulls, deltas, full_messages, len(encode(inventory_only(snapshot)))


async def varz_in_bytes(server: NatsServer, monitor: int, payloads: list[bytes]) -> int:
    """Publish `payloads` to a fresh connection and return the server's in_bytes delta."""

    def in_bytes() -> int:
        url = f"http://127.0.0.1:{monitor}/varz"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(json.load(resp)["in_bytes"])

    before = await asyncio.to_thread(in_bytes)
    nc = await nats.connect(server.url)
    subject = subjects.node_subject(NODE, subjects.COUNTERS)
    for payload in payloads:
        await nc.publish(subject, payload)
    await nc.flush()
    await nc.close()
    return await asyncio.to_thread(in_bytes) - before


def measure(args: argparse.Namespace, seed: int, server: tuple[NatsServer, int] | None) -> Run:
    subject = subjects.node_subject(NODE, subjects.COUNTERS)
    with tempfile.TemporaryDirectory(prefix="nicfleet-bytes-") as tmp:
        fulls, deltas, full_messages, snapshot = simulate(
            args.spec, args.busy, args.rounds, args.full_every, seed, Path(tmp)
        )
    run = Run(
        seed=seed,
        rounds=args.rounds,
        full_messages=full_messages,
        full_payload_bytes=sum(map(len, fulls)),
        delta_payload_bytes=sum(map(len, deltas)),
        full_wire_bytes=sum(pub_line_bytes(subject, len(p)) for p in fulls),
        delta_wire_bytes=sum(pub_line_bytes(subject, len(p)) for p in deltas),
        snapshot_bytes=snapshot,
        ports=len(decode(fulls[0], CounterBatch).ports),
    )
    if server is not None:
        run.varz_full_in_bytes = asyncio.run(varz_in_bytes(*server, fulls))
        run.varz_delta_in_bytes = asyncio.run(varz_in_bytes(*server, deltas))
    return run


def summarize(runs: list[Run], args: argparse.Namespace) -> dict[str, Any]:
    seconds = float(args.rounds) * INTERVAL

    def per_s(values: list[int]) -> float:
        return float(statistics.median(values)) / seconds

    before = per_s([r.full_wire_bytes for r in runs])
    after = per_s([r.delta_wire_bytes for r in runs])
    snapshot = statistics.median(r.snapshot_bytes for r in runs) / INVENTORY_INTERVAL
    result: dict[str, Any] = {
        "spec": args.spec,
        "ports": runs[0].ports,
        "busy_ports": args.busy,
        "rounds": args.rounds,
        "full_every": args.full_every,
        "runs": len(runs),
        "counters_bytes_per_s_before": round(before, 1),
        "counters_bytes_per_s_after": round(after, 1),
        "counters_payload_bytes_per_s_before": round(
            per_s([r.full_payload_bytes for r in runs]), 1
        ),
        "counters_payload_bytes_per_s_after": round(
            per_s([r.delta_payload_bytes for r in runs]), 1
        ),
        "ratio_after_to_before": round(after / before, 3),
        "snapshot_bytes": statistics.median(r.snapshot_bytes for r in runs),
        "snapshot_bytes_per_s_periodic": round(snapshot, 1),
        "python": platform.python_version(),
        "details": [asdict(r) for r in runs],
    }
    if args.smoke:
        result["smoke"] = True
    if all(r.varz_full_in_bytes is not None for r in runs):
        result["varz_in_bytes_per_s_before"] = per_s([r.varz_full_in_bytes or 0 for r in runs])
        result["varz_in_bytes_per_s_after"] = per_s([r.varz_delta_in_bytes or 0 for r in runs])
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--spec", default="h100-ib-12nic", help="built-in lab spec")
    parser.add_argument("--busy", type=int, default=3, help="ports carrying traffic")
    parser.add_argument("--rounds", type=int, default=120, help="1 s counter rounds per run")
    parser.add_argument("--full-every", type=int, default=DEFAULT_FULL_EVERY)
    parser.add_argument("--runs", type=int, default=5, help="runs (one seed each); median")
    parser.add_argument("--nats", action="store_true", help="also count /varz in_bytes")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run that checks the script still works, numbers meaningless "
        "(--rounds 10 --runs 2 --nats; options given still win)",
    )
    args = parser.parse_args(argv)
    if args.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    runs: list[Run] = []
    server: NatsServer | None = None
    monitor = 0
    if args.nats:
        monitor = free_port()
        server = NatsServer(NatsServerSettings(extra_args=("-m", str(monitor)))).start()
    try:
        for seed in range(args.runs):
            runs.append(measure(args, seed, (server, monitor) if server is not None else None))
    finally:
        if server is not None:
            server.stop()
    result = summarize(runs, args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            if key != "details":
                print(f"{key:40} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
