"""Benchmark: how fast a change the aggregator missed reaches it through a resync request.

`restart`: an in-process agent (snapshot interval 1 h) and aggregator on a real nats-server;
per run the aggregator stops, a port flips, a new aggregator starts; timed from its ready
until its fleet shows the flip. `cut`: `python -m aggregator run` SIGSTOPped, cut off by
nats-server as a slow consumer (1 MiB / 1 s), a port flips, SIGCONT; timed until the API
shows the flip. A script for docs/reliability.md, never a test:
.venv/bin/python bench/resync.py --jitter 0.2 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import nats

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the aggregator process helper lives in tests/

from agent.bus.republishpacing import RepublishPolicy  # noqa: E402
from agent.lab.faults import port_down, port_up  # noqa: E402
from agent.lab.render import render  # noqa: E402
from agent.lab.spec import load_builtin, with_node_name  # noqa: E402
from agent.service import AgentService, AgentSettings  # noqa: E402
from aggregator.bus.natsserver import NatsServer, NatsServerSettings  # noqa: E402
from aggregator.service import AggregatorService, AggregatorSettings  # noqa: E402
from proto import subjects  # noqa: E402
from tests.support.faults import AggregatorProcess, free_port  # noqa: E402

NODE = "bench-resync-01"
SLOW_CONF = 'max_pending: 1048576\nwrite_deadline: "1s"\n'


async def wait_for(predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {getattr(predicate, '__name__', predicate)}")
        await asyncio.sleep(0.002)


def fleet_state(agg: AggregatorService) -> str | None:
    record = agg.fleet.get(NODE)
    if record is None or record.snapshot is None:
        return None
    return record.snapshot.devices[0].ports[0].state


def snapshot_sent(agent: AgentService) -> Callable[[], bool]:
    """True once the agent published a snapshot after this call."""
    before = agent.publish_stats.published.get(subjects.SNAPSHOT, 0)
    return lambda: agent.publish_stats.published.get(subjects.SNAPSHOT, 0) > before


def flip(root: Path, down: bool) -> str:
    (port_down if down else port_up)(root, "mlx5_0", 1)
    return "DOWN" if down else "ACTIVE"


def agent_settings(root: Path, url: str, jitter: float) -> AgentSettings:
    return AgentSettings(
        node_name=NODE,
        sysfs_root=root,
        nats_url=url,
        netlink=False,
        inventory_interval=3600.0,
        republish=RepublishPolicy(jitter_s=jitter, min_interval_s=0.0),
    )


async def restart(work: Path, runs: int, jitter: float) -> list[float]:
    root = work / NODE
    render(with_node_name(load_builtin("roce-cx6dx"), NODE), root)
    times: list[float] = []
    with NatsServer(NatsServerSettings(store_dir=work / "js")) as server:
        agent = AgentService(agent_settings(root, server.url, jitter))
        agent_stop = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(agent.run(agent_stop))
            try:
                for run in range(runs + 1):
                    sent = snapshot_sent(agent)
                    wanted = flip(root, down=run % 2 == 1) if run else "ACTIVE"
                    if run:  # the flip went to nobody
                        await wait_for(sent)
                    agg = AggregatorService(AggregatorSettings(nats_url=server.url, listen_port=0))
                    stop = asyncio.Event()
                    async with asyncio.TaskGroup() as inner:
                        inner.create_task(agg.run(stop))
                        await asyncio.wait_for(agg.ready.wait(), 30)
                        started = time.perf_counter()
                        await wait_for(lambda: fleet_state(agg) == wanted)  # noqa: B023
                        if run:  # run 0 only sets the stage
                            times.append(time.perf_counter() - started)
                        await wait_for(lambda: not agent.control.pending)
                        stop.set()
            finally:
                agent_stop.set()
    return times


async def api_state(api: httpx.AsyncClient) -> str | None:
    try:
        response = await api.get(f"/api/v1/nodes/{NODE}")
    except httpx.TransportError:  # seen right after SIGCONT on a busy machine: poll again
        return None
    snapshot = response.json().get("snapshot") if response.status_code == 200 else None
    return None if snapshot is None else str(snapshot["devices"][0]["ports"][0]["state"])


async def cut(work: Path, runs: int, jitter: float) -> list[float]:
    root = work / NODE
    render(with_node_name(load_builtin("roce-cx6dx"), NODE), root)
    conf = work / "slow.conf"
    conf.write_text(SLOW_CONF)
    port = free_port()
    settings = NatsServerSettings(
        store_dir=work / "js", extra_args=("-c", str(conf), "-m", str(port))
    )
    times: list[float] = []
    with NatsServer(settings) as server:
        process = AggregatorProcess(server.url, work, "aggregator").start()
        nc = await nats.connect(server.url)
        agent = AgentService(agent_settings(root, server.url, jitter))
        stop = asyncio.Event()
        try:
            async with asyncio.TaskGroup() as tasks, httpx.AsyncClient() as mon:
                tasks.create_task(agent.run(stop))
                try:
                    await wait_for(process.is_ready)
                    async with httpx.AsyncClient(base_url=process.api_url) as api:
                        await wait_for(lambda: _is(api_state(api), "ACTIVE"))
                        for run in range(1, runs + 1):
                            await wait_for(lambda: not agent.control.pending)
                            before = await _aggregator_cids(mon, port)
                            assert process.proc is not None
                            process.proc.send_signal(signal.SIGSTOP)
                            try:
                                for _ in range(400):
                                    await nc.publish(
                                        "nicfleet.v1.node.flood.counters", b"x" * 60_000
                                    )
                                await nc.flush()
                                await wait_for(
                                    lambda: _gone(mon, port, before)  # noqa: B023
                                )
                                sent = snapshot_sent(agent)
                                wanted = flip(root, down=run % 2 == 1)
                                await wait_for(sent)
                            finally:
                                process.proc.send_signal(signal.SIGCONT)
                            started = time.perf_counter()
                            await wait_for(lambda: _is(api_state(api), wanted))  # noqa: B023
                            times.append(time.perf_counter() - started)
                finally:
                    stop.set()
        except BaseException:
            print(process.log.read_text()[-3000:], file=sys.stderr)  # why, when it breaks
            raise
        finally:
            process.stop()
            await nc.close()
    return times


async def _is(state: Awaitable[str | None], wanted: str) -> bool:
    return await state == wanted


async def _aggregator_cids(mon: httpx.AsyncClient, port: int) -> set[int]:
    connz = (await mon.get(f"http://127.0.0.1:{port}/connz")).json()
    return {
        int(c["cid"])
        for c in connz.get("connections") or ()
        if c.get("name") == "nicfleet-aggregator"
    }


async def _gone(mon: httpx.AsyncClient, port: int, before: set[int]) -> bool:
    return not (await _aggregator_cids(mon, port)) & before


def summary(times: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(times), 3),
        "min": round(min(times), 3),
        "max": round(max(times), 3),
    }


# --smoke: the same path, shortest (make test runs it; its numbers mean nothing).
SMOKE = {"runs": 1, "jitter": 0.2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jitter", type=float, default=5.0, help="agent resync jitter_s")
    parser.add_argument("--scenario", choices=("restart", "cut", "both"), default="both")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run of the same code path, numbers meaningless "
        "(--runs 1 --jitter 0.2, both scenarios; options given still win)",
    )
    opts = parser.parse_args()
    if opts.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(**SMOKE)
        opts = parser.parse_args()
    result: dict[str, object] = {"benchmark": "resync", "runs": opts.runs, "jitter_s": opts.jitter}
    for name, scenario in (("restart", restart), ("cut", cut)):
        if opts.scenario in (name, "both"):
            with tempfile.TemporaryDirectory(prefix="nicfleet-bench-") as tmp:
                times = asyncio.run(scenario(Path(tmp), opts.runs, opts.jitter))
            result[f"{name}_converge_s"] = summary(times)
    if opts.smoke:
        result["smoke"] = True
    print(json.dumps(result) if opts.json else f"resync: {result}")


if __name__ == "__main__":
    main()
