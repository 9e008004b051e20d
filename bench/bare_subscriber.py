"""The ceiling for one Python process (issue 8): a bare nats-py subscriber on the node
subjects that only parses the subject and decodes each message with the real codec as the
aggregator's ingest does, the same subscription settings as the aggregator. Prints one JSON
line per second to stdout: messages decoded so far, lag (now - send time) of the counter
batches of that second. `--smoke`: its own nats-server, a few messages of each kind, then
one JSON document (the last line) instead of the stream.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import nats

REPO: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aggregator.bus.natsserver import NatsServer, NatsServerSettings  # noqa: E402
from proto import subjects  # noqa: E402
from proto.codec import CodecError, decode, decode_counters, encode  # noqa: E402
from proto.inventory import NodeSnapshot  # noqa: E402
from proto.messages.counters import CounterBatch  # noqa: E402
from proto.messages.events import LinkEvent  # noqa: E402
from proto.messages.status import DevicePluginStatus  # noqa: E402

TYPES: Final[dict[str, Any]] = {
    subjects.SNAPSHOT: NodeSnapshot,
    subjects.COUNTERS: CounterBatch,
    subjects.EVENT: LinkEvent,
    subjects.STATUS: DevicePluginStatus,
}


COUNTERS: Final = subjects.COUNTERS
SMOKE_NODE: Final = "bench-bare-01"
SMOKE_BATCHES: Final = 20


def emit(line: dict[str, Any]) -> None:
    print(json.dumps(line), flush=True)


async def run(url: str, every: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await subscribe(url, every, stop, emit, ready=lambda: emit({"ready": True}))


async def smoke(every: float) -> dict[str, Any]:
    """The same subscriber against a nats-server of its own: SMOKE_BATCHES counter batches
    and one link event, then the report line that counted them all."""
    lines: list[dict[str, Any]] = []
    subscribed = asyncio.Event()
    stop = asyncio.Event()
    with NatsServer(NatsServerSettings()) as server:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(subscribe(server.url, every, stop, lines.append, subscribed.set))
            await asyncio.wait_for(subscribed.wait(), 10)
            nc = await nats.connect(server.url)
            for seq in range(1, SMOKE_BATCHES + 1):
                batch = CounterBatch(node=SMOKE_NODE, seq=seq, collected_at=time.time())
                await nc.publish(subjects.node_subject(SMOKE_NODE, COUNTERS), encode(batch))
            event = LinkEvent(node=SMOKE_NODE, seq=1, kind="port-state", device="mlx5_0",
                              port=1, old_state="ACTIVE", new_state="DOWN",
                              observed_at=time.time())  # fmt: skip
            await nc.publish(subjects.node_subject(SMOKE_NODE, subjects.EVENT), encode(event))
            await nc.flush()
            await nc.close()
            deadline = time.monotonic() + 10
            while not lines or lines[-1]["counts"][subjects.EVENT] < 1:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the subscriber did not count them: {lines[-1:]}")
                await asyncio.sleep(every)
            stop.set()
    return {**lines[-1], "smoke": True}


async def subscribe(
    url: str,
    every: float,
    stop: asyncio.Event,
    report: Callable[[dict[str, Any]], None],
    ready: Callable[[], None],
) -> None:
    counts = dict.fromkeys(TYPES, 0)
    errors = {"decode": 0, "nats": 0}
    lags: list[float] = []

    async def on_error(exc: Exception) -> None:
        errors["nats"] += 1

    async def on_message(msg: Any) -> None:
        try:
            _, kind = subjects.parse_node_subject(msg.subject)
            # Counters as the aggregator's ingest decodes them (a packed delta checked, not
            # unpacked: proto.codec.decode_counters).
            if kind == COUNTERS:
                message = decode_counters(msg.data)
            else:
                message = decode(msg.data, TYPES[kind])
        except (ValueError, CodecError):
            errors["decode"] += 1
            return
        counts[kind] += 1
        if kind == subjects.COUNTERS:
            lags.append(time.time() - message.collected_at)

    nc = await nats.connect(url, name="bare-subscriber", error_cb=on_error)
    sub = await nc.subscribe(subjects.NODE_WILDCARD, cb=on_message, pending_msgs_limit=200_000)
    await nc.flush()
    ready()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
        window, lags[:] = sorted(lags), []
        line = {
            "t": time.time(),
            "counts": counts,
            "errors": errors,
            "pending_msgs": sub.pending_msgs,
            "lag_p50_s": round(statistics.median(window), 4) if window else None,
            "lag_max_s": round(window[-1], 4) if window else None,
        }
        report(line)
    await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nats-url", help="required unless --smoke")
    parser.add_argument("--every", type=float, default=1.0, help="report interval (s)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long check on a nats-server of its own (--every 0.2 unless given); "
        "prints one JSON document: the report line that counted what it sent",
    )
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(every=0.2)  # options given explicitly still win
        args = parser.parse_args()
        emit(asyncio.run(smoke(args.every)))
        return
    if args.nats_url is None:
        parser.error("--nats-url is required (or --smoke)")
    asyncio.run(run(args.nats_url, args.every))


if __name__ == "__main__":
    main()
