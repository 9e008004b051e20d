"""Simulated agents for bench/policy_fanout.py: the desired-config side of `agent/bus/desired.py`
over core NATS, nothing else (no device plugin, no sysfs).

Each agent subscribes to its own `nicfleet.v1.desired.<token>`, asks once on `.get` with a
reply under `_INBOX.<token>.` (the only answers the aggregator sends), admits updates with
the agent's own `RevisionGate`, decodes and validates the inner `DesiredConfig` as the
agent does and reports a `DevicePluginStatus` carrying the new `rdmaHcaMax`. A library,
not a script: `bench/policy_fanout.py --sim` runs it, and `bench/policy_fanout.py --smoke`
(make test) runs that path.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import time
from pathlib import Path
from typing import Final

import nats
from nats.aio.msg import Msg
from nats.errors import NoRespondersError

from agent.bus.desiredorder import RevisionGate, Via
from proto import subjects
from proto.codec import CodecError, decode, encode
from proto.dpconfig import ConfigError, validate_device_plugin_config
from proto.messages.config import DesiredConfig, DesiredUpdate, DevicePluginConfig
from proto.messages.status import DevicePluginStatus, ResourceStatus
from proto.runtime.natsconnect import agent_inbox_prefix

RESOURCE: Final = "rdma/bench"
REQUEST_TIMEOUT_S: Final = 5.0  # generous: thousands ask at once and share 2 cores
SETUP_CONCURRENCY: Final = 64  # requests in flight per process (the feed answers 64 at once)


def node_name(i: int) -> str:
    return f"sim-{i:05d}"


def touch(path: Path) -> None:
    path.write_text("ok")


class Validated:
    """`validate_device_plugin_config` once per distinct config in this process. It is
    pure, and costs ~0.3 ms a call (msgspec.structs.fields evaluated each time): a real
    agent pays that once per change on its own node, but 1,500 simulated agents sharing a
    process (and 2 cores with the aggregator) would add ~0.5 s to every fan-out."""

    def __init__(self) -> None:
        self._seen: dict[DevicePluginConfig, ConfigError | None] = {}

    def check(self, config: DevicePluginConfig) -> None:
        if config not in self._seen:
            try:
                validate_device_plugin_config(config, source="bench")
                self._seen[config] = None
            except ConfigError as exc:
                self._seen[config] = exc
        error = self._seen[config]
        if error is not None:
            raise error


class SimAgent:
    """One node's desired-config watcher. `nc` is shared with other agents unless it was
    opened for this node alone with `inbox_prefix=agent_inbox_prefix(node)` (`own_inbox`),
    which is how the real agent connects."""

    def __init__(self, nc: nats.NATS, node: str, *, own_inbox: bool, validated: Validated) -> None:
        self.nc, self.node, self.own_inbox, self.validated = nc, node, own_inbox, validated
        self.gate = RevisionGate()
        self.rejected = 0
        self._status_subject = subjects.node_subject(node, subjects.STATUS)

    async def report(self, generation: int, advertised: int) -> None:
        status = DevicePluginStatus(
            node=self.node,
            config_generation=generation,
            registered=True,
            resources=(ResourceStatus(name=RESOURCE, advertised=advertised, healthy=advertised,
                                      registration="registered"),),
            observed_at=time.time(),
        )  # fmt: skip
        await self.nc.publish(self._status_subject, encode(status))

    def admit(self, data: bytes, via: Via) -> DesiredConfig | None:
        """What `DesiredConfigWatcher._receive` decides: the config to apply, or None (not
        newer, removed, or invalid: the last good one stays)."""
        try:
            update = decode(data, DesiredUpdate)
            if update.node != self.node:
                raise ConfigError("bench", "$.node", f"is {update.node!r}, not this node")
            if not self.gate.admit(update.revision, via) or update.config is None:
                return None
            config = decode(update.config, DesiredConfig)
            if config.node != self.node:
                raise ConfigError("bench", "$.node", f"is {config.node!r}, not this node")
            self.validated.check(config.device_plugin)
        except (CodecError, ConfigError):
            self.rejected += 1
            return None
        return config

    async def receive(self, data: bytes, via: Via) -> None:
        config = self.admit(data, via)
        if config is not None:
            await self.report(config.generation, config.device_plugin.config_list[0].rdma_hca_max)

    async def on_announced(self, msg: Msg) -> None:
        await self.receive(msg.data, Via.ANNOUNCED)

    async def ask(self) -> bytes:
        """One `.get` request; raises NoRespondersError / TimeoutError when unanswered."""
        subject = subjects.desired_get_subject(self.node)
        if self.own_inbox:  # nats-py's own request: its inbox is _INBOX.<token>.<nuid>.*
            msg = await self.nc.request(subject, b"", timeout=REQUEST_TIMEOUT_S)
            return msg.data
        # A shared connection's inbox prefix is not this node's: the same request by hand.
        inbox = f"{agent_inbox_prefix(self.node)}.{secrets.token_hex(8)}"
        sub = await self.nc.subscribe(inbox, max_msgs=1)
        try:
            await self.nc.publish(subject, b"", reply=inbox)
            msg = await sub.next_msg(timeout=REQUEST_TIMEOUT_S)
        finally:
            await sub.unsubscribe()
        if not msg.data:  # the server's 503 status: nobody subscribed to .get yet
            raise NoRespondersError
        return msg.data

    async def start(self, setup: asyncio.Semaphore) -> None:
        """Subscribe, make the node known, then ask until answered (as the agent does at
        start; its periodic re-ask is minutes apart and left out)."""
        await self.nc.subscribe(subjects.desired_subject(self.node), cb=self.on_announced)
        await self.report(0, 0)
        while True:
            try:
                async with setup:
                    data = await self.ask()
                break
            except (NoRespondersError, nats.errors.TimeoutError, TimeoutError):
                await asyncio.sleep(0.2)
        await self.receive(data, Via.ANSWERED)


async def sim_main(url: str, first: int, count: int, ready_file: Path, per_conn: int) -> None:
    """`count` agents from node `first` on, `per_conn` to a NATS connection (1: each its own,
    with its node's inbox prefix); writes `ready_file` once every agent had its answer."""
    setup = asyncio.Semaphore(SETUP_CONCURRENCY)
    validated = Validated()
    agents: list[SimAgent] = []
    conns: list[nats.NATS] = []
    for i in range(count):
        node = node_name(first + i)
        if i % per_conn == 0:
            prefix = agent_inbox_prefix(node) if per_conn == 1 else "_INBOX"
            conns.append(await nats.connect(url, max_reconnect_attempts=-1, inbox_prefix=prefix))
        agents.append(SimAgent(conns[-1], node, own_inbox=per_conn == 1, validated=validated))
    async with asyncio.TaskGroup() as tasks:
        for agent in agents:
            tasks.create_task(agent.start(setup))
    touch(ready_file)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for nc in conns:
        await nc.close()
