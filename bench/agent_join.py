"""Benchmark: N agents joining NATS at once through the auth callout (docs/security.md).

A real nats-server configured by `nats-auth --auth-callout`, the responder
(`aggregator.bus.calloutservice`) on its own NKey connection, and N raw nats-py clients in
one event loop, each with its own node's ServiceAccount-shaped token, all connecting at
once. TokenReview is a stand-in that answers after `--review-ms` (the API server's round
trip). Admission time: from `connect()` called to connected. A second wave reconnects the
same tokens: answered from the cache (no new review). A script, never a test.
Run: .venv/bin/python bench/agent_join.py --json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError

from aggregator.bus import authcallout
from aggregator.bus.authcallout import JoinSettings, Reviewed
from aggregator.bus.calloutservice import MAX_CONCURRENT_REVIEWS, CalloutResponder
from aggregator.bus.keys import provision
from aggregator.bus.natsserver import NatsServer, NatsServerSettings
from proto.runtime.natsconnect import NatsClientSecurity, agent_inbox_prefix, connect_options

SETTINGS = JoinSettings(namespace="nicfleet-system", service_account="nicfleet-agent")


def token_for(node: str, ttl_s: float) -> str:
    claims = {"aud": ["nicfleet"], "exp": int(time.time() + ttl_s), "node": node,
              "kubernetes.io": {"node": {"name": node}}}  # fmt: skip
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"eyJhbGciOiJSUzI1NiJ9.{body}.c2ln"


class SlowReview:
    """TokenReview as an API server would answer a valid agent token, after `delay_s`."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.calls = 0

    async def __call__(self, token: str, audiences: tuple[str, ...]) -> Reviewed:
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        claims = authcallout.token_claims(token)
        node = claims.node if claims else None
        return Reviewed(
            authenticated=True,
            username=SETTINGS.username,
            audiences=("nicfleet",),
            extra={authcallout.NODE_NAME_EXTRA: (node,)} if node else {},
        )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


RETRY_WAIT_S = 0.25  # what a refused agent waits before its next try (its reconnect wait)


async def wave(
    url: str, tokens: dict[str, str]
) -> tuple[list[float], float, list[NatsClient], int]:
    """All agents at once; a refused one (the server's 2 s callout timeout) tries again."""
    refusals = 0

    async def quiet(_exc: Exception) -> None:
        pass

    async def one(node: str, token: str) -> tuple[float, NatsClient]:
        nonlocal refusals
        start = time.perf_counter()
        while True:
            nc = NatsClient()
            try:
                await nc.connect(
                    url,
                    token=token,
                    inbox_prefix=agent_inbox_prefix(node),
                    allow_reconnect=False,
                    max_reconnect_attempts=0,
                    connect_timeout=30,
                    error_cb=quiet,
                )
            except NatsError:
                refusals += 1
                await nc.close()
                await asyncio.sleep(RETRY_WAIT_S)
                continue
            return time.perf_counter() - start, nc

    began = time.perf_counter()
    done = await asyncio.gather(*(one(n, t) for n, t in tokens.items()))
    return [d for d, _ in done], time.perf_counter() - began, [nc for _, nc in done], refusals


async def measure(work: Path, agents: int, review_ms: float) -> dict[str, Any]:
    keys = provision(work / "auth", (), auth_callout=True)
    assert keys.callout_seed is not None and keys.callout_issuer_seed is not None
    server = NatsServer(NatsServerSettings(store_dir=work / "js", config_file=keys.config))
    server.start()
    review = SlowReview(review_ms / 1000)
    responder = CalloutResponder(
        settings=SETTINGS,
        review=review,
        issuer_seed=keys.callout_issuer_seed.read_text().strip(),
        wall_clock=time.time,
    )
    security = NatsClientSecurity(nkey_seed_file=keys.callout_seed)
    callout = await nats.connect(server.url, **connect_options(security))
    stop, ready = asyncio.Event(), asyncio.Event()
    tokens = {f"join-{i:05d}": token_for(f"join-{i:05d}", 600) for i in range(agents)}
    try:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(responder.serve(callout, stop, ready=ready))
            await ready.wait()
            first, first_wall, clients, first_refused = await wave(server.url, tokens)
            reviews_first = review.calls
            await asyncio.gather(*(nc.close() for nc in clients))
            again, again_wall, clients, again_refused = await wave(server.url, tokens)
            await asyncio.gather(*(nc.close() for nc in clients))
            stop.set()
    finally:
        await callout.close()
        server.close()

    def summary(times: list[float], wall: float) -> dict[str, float]:
        return {
            "all_admitted_s": round(wall, 3),
            "p50_s": round(statistics.median(times), 4),
            "p99_s": round(percentile(times, 0.99), 4),
            "max_s": round(max(times), 4),
        }

    return {
        "benchmark": "agent_join",
        "agents": agents,
        "review_ms": review_ms,
        "max_concurrent_reviews": MAX_CONCURRENT_REVIEWS,
        "first_join": {
            **summary(first, first_wall),
            "token_reviews": reviews_first,
            "refused_then_retried": first_refused,
        },
        "rejoin_cached": {
            **summary(again, again_wall),
            "token_reviews": review.calls - reviews_first,
            "refused_then_retried": again_refused,
        },
    }


# --smoke: the same path, shortest (make test runs it; its numbers mean nothing).
SMOKE = {"agents": 20, "review_ms": 1.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--review-ms", type=float, default=20.0,
                        help="simulated TokenReview round trip")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run of the same code path, numbers meaningless "
        "(--agents 20; options given still win)",
    )
    opts = parser.parse_args()
    if opts.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(**SMOKE)
        opts = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 2 * opts.agents + 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))  # one socket per agent
    with tempfile.TemporaryDirectory(prefix="nicfleet-bench-") as tmp:
        result = asyncio.run(measure(Path(tmp), opts.agents, opts.review_ms))
    if opts.smoke:
        result["smoke"] = True
    print(json.dumps(result) if opts.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
