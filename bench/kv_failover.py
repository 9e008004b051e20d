"""Benchmark: R3 KV write availability when the stream leader of a 3-server JetStream
cluster on loopback is SIGKILLed — time from the kill until a put is acknowledged again.

Uses the test cluster launcher (tests/support/jscluster.py); a fresh cluster per run.
Never a test. Run: .venv/bin/python bench/kv_failover.py   (`--smoke`: one run, seconds)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nats
from nats.errors import Error as NatsError

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the cluster launcher lives in tests/

from tests.support.jscluster import js_cluster  # noqa: E402

BUCKET = "bench-r3"
# --smoke: the same path with one failover (make test runs it; its numbers mean nothing).
SMOKE = {"runs": 1}


async def one_run(work: Path) -> float:
    with js_cluster(work) as servers:
        nc = await nats.connect(
            servers=[s.url for s in servers.values()],
            reconnect_time_wait=0.1,
            max_reconnect_attempts=-1,
        )
        try:
            js = nc.jetstream()
            while True:  # the meta leader is elected a few seconds after start
                try:
                    kv = await js.create_key_value(bucket=BUCKET, history=1, replicas=3)
                    break
                except (NatsError, TimeoutError):
                    await asyncio.sleep(0.1)
            await kv.put("before", b"1")
            info = await js.stream_info(f"KV_{BUCKET}")
            assert info.cluster is not None and info.cluster.leader in servers
            started = time.perf_counter()
            await asyncio.to_thread(servers[info.cluster.leader].stop, kill=True)
            while True:
                try:
                    await kv.put("after", b"2")
                    return time.perf_counter() - started
                except (NatsError, TimeoutError):
                    await asyncio.sleep(0.02)
        finally:
            await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run that checks the script still works, numbers meaningless "
        "(--runs 1; options given still win)",
    )
    opts = parser.parse_args()
    if opts.smoke:
        parser.set_defaults(**SMOKE)
        opts = parser.parse_args()
    times = []
    for run in range(opts.runs):
        with tempfile.TemporaryDirectory(prefix="nicfleet-bench-") as tmp:
            times.append(asyncio.run(one_run(Path(tmp) / str(run))))
    result = {
        "benchmark": "kv_failover",
        "runs": opts.runs,
        "write_resumed_s": {
            "median": round(statistics.median(times), 3),
            "min": round(min(times), 3),
            "max": round(max(times), 3),
        },
        **({"smoke": True} if opts.smoke else {}),
    }
    print(json.dumps(result) if opts.json else f"R3 KV writes resumed after: {result}")


if __name__ == "__main__":
    main()
