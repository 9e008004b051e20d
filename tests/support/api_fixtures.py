"""Shared pieces for the API and nicfleetctl tests: a sample fleet, a settable clock and
readiness, and a real aiohttp server on 127.0.0.1 run in a background thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry

from aggregator.api.app import ApiSettings, build_app
from aggregator.fleet.state import Fleet
from tests.support.builders import T0, counters, device, port, port_event, snapshot

NOW = T0 + 5
STALE_AFTER = 30.0


@dataclass
class FakeClock:
    now: float = NOW

    def __call__(self) -> float:
        return self.now


@dataclass
class Readiness:
    ready: bool = True
    reason: str = "ok"
    error: Exception | None = None

    def __call__(self) -> tuple[bool, str]:
        if self.error is not None:
            raise self.error
        return self.ready, self.reason


@dataclass
class Harness:
    fleet: Fleet
    clock: FakeClock = field(default_factory=FakeClock)
    readiness: Readiness = field(default_factory=Readiness)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def app(self) -> web.Application:
        return build_app(
            fleet=self.fleet,
            settings=ApiSettings(stale_after=STALE_AFTER),
            readiness=self.readiness,
            clock=self.clock,
            metrics=self.registry,
        )


def sample_fleet() -> Fleet:
    """gpu-001/gpu-002/roce-01 ready (gpu-002 lost mlx5_1/1), gpu-003 stale, gpu-010 no snapshot."""
    fleet = Fleet()
    ib = (
        device("mlx5_0", pci="0000:3b:00.0", numa=0, netdev="ibp59s0"),
        device("mlx5_1", pci="0000:86:00.0", numa=1),
    )
    fleet.apply_snapshot(snapshot("gpu-001", devices=ib), T0)
    fleet.apply_counters(counters("gpu-001", seq=3, collected_at=T0 + 1, rx=1234), T0 + 1)
    fleet.apply_snapshot(snapshot("gpu-002", devices=ib), T0)
    fleet.apply_event(port_event("gpu-002", device="mlx5_1", observed_at=T0 + 2), T0 + 2.5)
    fleet.apply_snapshot(snapshot("gpu-003", devices=ib[:1]), T0 - 100)
    fleet.apply_counters(counters("gpu-010"), T0 + 3)
    eth = (device("mlx5_0", ports=(port(1, rate=200.0, link_layer="Ethernet"),), fw="22.36.1010"),)
    fleet.apply_snapshot(snapshot("roce-01", devices=eth, gpus=0), T0 + 4)
    return fleet


@contextmanager
def serve_in_thread(app: web.Application) -> Iterator[str]:
    """Serve `app` on 127.0.0.1:<ephemeral> from a thread with its own loop; yield its URL."""
    started = threading.Event()
    box: dict[str, object] = {}

    async def serve() -> None:
        stop = asyncio.Event()
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, port_ = runner.addresses[0][:2]
            box.update(url=f"http://{host}:{port_}", loop=asyncio.get_running_loop(), stop=stop)
            started.set()
            await stop.wait()
        finally:
            await runner.cleanup()

    def run() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:
            box["error"] = exc
            started.set()

    thread = threading.Thread(target=run, name="api-test-server", daemon=True)
    thread.start()
    if not started.wait(timeout=10) or "error" in box:
        raise RuntimeError(f"test API server did not start: {box.get('error')!r}")
    try:
        yield str(box["url"])
    finally:
        loop, stop = box["loop"], box["stop"]
        assert isinstance(loop, asyncio.AbstractEventLoop)
        assert isinstance(stop, asyncio.Event)
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=10)
        assert not thread.is_alive(), "test API server did not stop"
