"""A pair-validation stack for tests: kmock's KubernetesEmulator (over real HTTP), a real
NATS connection, the runner, the API on 127.0.0.1 — and `Kubelet`, which plays what kmock
does not run: it gives each validation pod a phase and an IP and publishes the results the
verify pods would (a `Script` decides each side's answer)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import kmock
import nats
from aiohttp import web
from nats.aio.client import Client as NatsClient
from prometheus_client import CollectorRegistry

from aggregator.api.app import ApiSettings, build_app
from aggregator.api.auth import ApiAuth
from aggregator.api.validations import add_validation_routes
from aggregator.cluster import NO_CLUSTER, ClusterView
from aggregator.fleet.state import Fleet
from aggregator.kube.client import KubeClient, KubeSettings
from aggregator.validations.record import ID_LABEL, ROLE_LABEL, ValidationSettings
from aggregator.validations.runner import ValidationRunner, ValidationStore, load_template
from proto import subjects
from proto.codec import encode
from proto.messages.validation import LatencySummary, PairTestResult, ValidationResult
from tests.support.builders import plugin_status, resource_status

PODS = "v1/pods"
NS = "nicfleet-system"
RES = "rdma/ib"
NODES = ("gpu-001", "gpu-002", "gpu-003")  # advertise RES; gpu-009 advertises rdma/other
FAST = ValidationSettings(
    start_timeout_s=5.0,
    run_timeout_s=5.0,
    collect_timeout_s=1.0,
    result_grace_s=0.3,
    poll_interval_s=0.05,
    max_running=2,
    max_queued=4,
    nats_url="nats://127.0.0.1:4222",
)

# (validation id, role, node) -> what that pod publishes: a result, raw bytes, or nothing.
Script = Callable[[str, str, str], list[ValidationResult | bytes]]


def answer(
    validation_id: str, role: str, node: str, *, verdict: str = "rdma-path", rate: float = 24e9
) -> ValidationResult:
    now = time.time()
    return ValidationResult(
        validation_id=validation_id,
        role=role,  # type: ignore[arg-type]
        node=node,
        pod=f"nicfleet-validate-{validation_id}-{role}",
        verdict=verdict,  # type: ignore[arg-type]
        pair_test=PairTestResult(
            method="pyverbs",
            message_size=65536,
            iterations=5000,
            bytes_per_second=rate,
            latency=LatencySummary(samples=1000, p50_us=2.1, p99_us=3.9),
        )
        if verdict == "rdma-path"
        else None,
        started_at=now,
        finished_at=now,
    )


def everyone_passes(validation_id: str, role: str, node: str) -> list[ValidationResult | bytes]:
    return [answer(validation_id, role, node)]


def lab_fleet() -> Fleet:
    fleet = Fleet()
    now = time.time()
    for node in NODES:
        fleet.apply_status(plugin_status(node, resource_status(RES), observed_at=now), now)
    fleet.apply_status(
        plugin_status("gpu-009", resource_status("rdma/other"), observed_at=now), now
    )
    return fleet


class Kubelet:
    """Starts every validation pod (Running, an IP) and, once the client pod exists,
    publishes both sides' scripted answers on the validation's subject."""

    def __init__(self, emulator: kmock.KubernetesEmulator, nc: NatsClient, script: Script) -> None:
        self.emulator = emulator
        self.nc = nc
        self.script = script
        self.auto_start = True
        self.seen: dict[str, dict[str, Any]] = {}  # every pod ever created, as created

    def pods(self) -> dict[str, dict[str, Any]]:
        """The pods in the emulator now, as plain dicts."""
        found = self.emulator.objects.items()
        # A deleted object stays listed, empty (kmock keeps its history).
        return {name: plain(obj) for (res, _, name), obj in found if res == PODS and obj}

    def set_status(self, name: str, status: dict[str, Any]) -> None:
        pod = self.pods()[name]
        self.emulator.objects[PODS, NS, name] = {**pod, "status": status}

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for name, pod in self.pods().items():
                if name in self.seen:
                    continue
                self.seen[name] = pod
                if not self.auto_start:
                    continue
                self.set_status(name, {"phase": "Running", "podIP": f"10.0.0.{len(self.seen)}"})
                labels = pod["metadata"]["labels"]
                if labels[ROLE_LABEL] == "client":
                    await self.publish(labels[ID_LABEL])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.02)

    async def publish(self, validation_id: str) -> None:
        for role in ("server", "client"):
            name = f"nicfleet-validate-{validation_id}-{role}"
            node = node_of(self.seen[name])
            for message in self.script(validation_id, role, node):
                data = message if isinstance(message, bytes) else encode(message)
                await self.nc.publish(subjects.validation_subject(validation_id), data)
        await self.nc.flush()


class _PodsForbidden(kmock.KubernetesEmulator):
    """An API server whose RBAC does not let the aggregator create pods."""

    async def _handle(self, request: kmock.Request) -> web.StreamResponse:
        resource = request.resource
        if resource is not None and resource.plural == "pods" and request.method == "POST":
            message = 'pods is forbidden: User "nicfleet" cannot create resource "pods"'
            status = {"kind": "Status", "code": 403, "reason": "Forbidden", "message": message}
            return web.json_response(status, status=403)
        return await super()._handle(request)


def plain(value: Any) -> Any:
    """kmock's object views as plain JSON data (they wrap nested mappings too)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def node_of(pod: dict[str, Any]) -> str:
    affinity = pod["spec"]["affinity"]["nodeAffinity"]
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return str(terms[0]["matchFields"][0]["values"][0])


@dataclass
class Stack:
    url: str
    emulator: kmock.KubernetesEmulator
    kubelet: Kubelet
    runner: ValidationRunner
    store: ValidationStore
    nc: NatsClient
    registry: CollectorRegistry
    stop: asyncio.Event


@contextlib.asynccontextmanager
async def validation_stack(
    nats_url: str,
    *,
    script: Script = everyone_passes,
    settings: ValidationSettings = FAST,
    with_cluster: bool = True,
    auth: ApiAuth | None = None,
    pods_api: bool = True,  # False: creating pods is forbidden (no RBAC rule)
    with_template: bool = True,
    cluster: ClusterView | None = None,  # what the API's trace routes see (default: none)
) -> AsyncIterator[Stack]:
    emulator = kmock.KubernetesEmulator() if pods_api else _PodsForbidden()
    emulator.resources[PODS] = kmock.ResourceInfo(kind="Pod", namespaced=True)
    async with emulator, kmock.Server(emulator) as server:
        kube = await KubeClient.connect(KubeSettings(host=str(server.url)))
        nc = await nats.connect(nats_url)
        registry = CollectorRegistry()
        store = await ValidationStore.open(nc, keep=settings.keep)
        runner = ValidationRunner(
            kube=kube if with_cluster else None,
            namespace=NS,
            nc=nc,
            store=store,
            settings=settings,
            template=load_template() if with_template else None,
            identity="test-replica",
            clock=time.time,
            registry=registry,
        )
        fleet = lab_fleet()
        app = build_app(
            fleet=fleet,
            settings=ApiSettings(),
            readiness=lambda: (True, "ok"),
            clock=time.time,
            metrics=registry,
            latest_validation=store.latest_for,
            auth=auth,
            cluster_source=None if cluster is None else (lambda: cluster),
        )
        add_validation_routes(app, runner=runner, fleet=fleet, cluster=lambda: NO_CLUSTER)
        app_runner = web.AppRunner(app, access_log=None)
        await app_runner.setup()
        site = web.TCPSite(app_runner, "127.0.0.1", 0)
        await site.start()
        host, port = app_runner.addresses[0][:2]
        kubelet = Kubelet(emulator, nc, script)
        stop = asyncio.Event()
        stack = Stack(
            url=f"http://{host}:{port}",
            emulator=emulator,
            kubelet=kubelet,
            runner=runner,
            store=store,
            nc=nc,
            registry=registry,
            stop=stop,
        )
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(runner.run(stop))
                tasks.create_task(kubelet.run(stop))
                try:
                    yield stack
                finally:
                    stop.set()
        finally:
            await app_runner.cleanup()
            try:
                await asyncio.wait_for(nc.drain(), 10)
            except TimeoutError:
                await nc.close()
            await kube.close()


@contextlib.contextmanager
def stack_in_thread(nats_url: str, **kwargs: Any) -> Iterator[Stack]:
    """`validation_stack` served from a thread with its own loop (for the sync CLI)."""
    started = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        async with validation_stack(nats_url, **kwargs) as stack:
            box.update(stack=stack, loop=asyncio.get_running_loop())
            started.set()
            await stack.stop.wait()

    def run() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:
            box["error"] = exc
            started.set()

    thread = threading.Thread(target=run, name="validation-stack", daemon=True)
    thread.start()
    if not started.wait(timeout=20) or "error" in box:
        raise RuntimeError(f"validation stack did not start: {box.get('error')!r}")
    stack: Stack = box["stack"]
    try:
        yield stack
    finally:
        box["loop"].call_soon_threadsafe(stack.stop.set)
        thread.join(timeout=60)  # generous: the machines are shared and slow at times
        if thread.is_alive():
            frame = sys._current_frames().get(thread.ident or 0)
            where = "".join(traceback.format_stack(frame)) if frame else "?"
            for task in asyncio.all_tasks(box["loop"]):  # racy, but only for the message
                where += f"\ntask {task.get_name()}: " + "".join(
                    traceback.format_stack(task.get_stack()[-1]) if task.get_stack() else "-"
                )
            raise AssertionError(f"validation stack did not stop; its thread is at:\n{where}")
