"""The ceiling for one Python process (issue 8): a bare nats-py subscriber on the node
subjects that only parses the subject and decodes each message with the real codec as the
aggregator's ingest does, the same subscription settings as the aggregator. Prints one JSON
line per second to stdout: messages decoded so far, lag (now - send time) of the counter
batches of that second.
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
from pathlib import Path
from typing import Any, Final

import nats

REPO: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from proto import subjects  # noqa: E402
from proto.codec import CodecError, decode, decode_counters  # noqa: E402
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


async def run(url: str, every: float) -> None:
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
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(json.dumps({"ready": True}), flush=True)
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
        print(json.dumps(line), flush=True)
    await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--every", type=float, default=1.0, help="report interval (s)")
    args = parser.parse_args()
    asyncio.run(run(args.nats_url, args.every))


if __name__ == "__main__":
    main()
