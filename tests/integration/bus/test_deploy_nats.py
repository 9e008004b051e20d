"""deploy/base's NATS config, run for real: three nats-servers on loopback, each started
with the ConfigMap's nats.conf (only addresses and paths moved to this machine) and the
server-auth.conf `nicfleet-aggregator nats-auth` writes, form one JetStream cluster that
the aggregator's seed can use with three-way replicated KV and an agent's seed can
publish its node subjects to."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import nats
import nats.aio.msg
import pytest

from aggregator.bus.keys import Provisioned, provision
from proto import subjects
from proto.runtime.natsconnect import NatsClientSecurity, agent_inbox_prefix, connect_options
from proto.runtime.natsflush import flush_in_order
from tests.support.waits import wait_until
from tests.unit.deploy.test_deploy import find, render

pytestmark = pytest.mark.integration

NODE = "gpu-node-01"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Server:
    process: subprocess.Popen[bytes]
    client: int
    monitor: int

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client}"


def local_config(conf: str, work: Path, ports: tuple[int, int, int], routes: list[int]) -> str:
    """The ConfigMap's nats.conf with this machine's (client, monitor, route) ports, paths."""
    client, monitor, route = ports
    text = re.sub(r"^listen: \S+", f"listen: 127.0.0.1:{client}", conf, flags=re.M)
    text = re.sub(r"http_port: \d+", f"http_port: {monitor}", text)
    text = re.sub(r"pid_file: \S+", f"pid_file: {work / 'nats.pid'}", text)
    text = re.sub(r"store_dir: \S+", f"store_dir: {work / 'jetstream'}", text)
    text = re.sub(r"(cluster \{[^}]*?)listen: \S+", rf"\g<1>listen: 127.0.0.1:{route}", text)
    urls = "\n".join(f"    nats://127.0.0.1:{p}" for p in routes)
    text, count = re.subn(r"routes: \[[^\]]*\]", f"routes: [\n{urls}\n  ]", text)
    assert count == 1
    return text


@pytest.fixture
def keys(tmp_path: Path) -> Provisioned:
    return provision(tmp_path / "auth-out", (NODE,))


@pytest.fixture
def cluster(tmp_path: Path, keys: Provisioned) -> Iterator[list[Server]]:
    """Three `nats-server --config` processes, as the StatefulSet's pods run them."""
    conf = find(render(""), "ConfigMap", "nicfleet-nats")["data"]["nats.conf"]
    binary = Path(sys.executable).parent / "nats-server"
    routes = [_free_port() for _ in range(3)]
    servers: list[Server] = []
    try:
        for i, route in enumerate(routes):
            name = f"nicfleet-nats-{i}"
            work = tmp_path / name
            (work / "config").mkdir(parents=True)
            (work / "auth").mkdir()
            (work / "auth" / "server-auth.conf").write_text(keys.config.read_text())
            client, monitor = _free_port(), _free_port()
            path = work / "config" / "nats.conf"
            path.write_text(local_config(conf, work, (client, monitor, route), routes))
            log = (work / "server.log").open("wb")
            process = subprocess.Popen(
                [str(binary), "--config", str(path)],
                env={"POD_NAME": name},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            log.close()
            servers.append(Server(process, client, monitor))
        yield servers
    finally:
        for server in servers:
            server.process.terminate()
        for server in servers:
            server.process.wait(timeout=30)


async def test_the_deployed_config_forms_an_authenticated_jetstream_cluster(
    cluster: list[Server], keys: Provisioned
) -> None:
    async with httpx.AsyncClient() as http:

        async def healthy() -> bool:
            for server in cluster:
                assert server.process.poll() is None, "a nats-server exited: see server.log"
                try:
                    answer = await http.get(f"http://127.0.0.1:{server.monitor}/healthz")
                except httpx.TransportError:
                    return False
                if answer.status_code != 200:
                    return False
            return True

        # The readinessProbe's endpoint: 200 once JetStream has a meta leader and is current.
        await wait_until(healthy, timeout=60, interval=0.2, what="3 healthy JetStream servers")

    aggregator = await nats.connect(
        cluster[0].url,
        **connect_options(NatsClientSecurity(nkey_seed_file=keys.aggregator_seed)),
    )
    agent = await nats.connect(
        cluster[2].url,
        **connect_options(
            NatsClientSecurity(nkey_seed_file=keys.agent_seeds[NODE]),
            inbox_prefix=agent_inbox_prefix(NODE),
        ),
    )
    try:
        js = aggregator.jetstream()
        kv = await js.create_key_value(bucket="deploy-check", replicas=3, history=1)
        await kv.put(NODE, b"desired")
        info = await js.stream_info("KV_deploy-check")
        assert info.cluster is not None and len(info.cluster.replicas or []) == 2  # + leader
        got: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_message(msg: nats.aio.msg.Msg) -> None:
            await got.put(msg.data)

        subject = subjects.node_subject(NODE, "snapshot")
        await aggregator.subscribe(subject, cb=on_message)
        await flush_in_order(aggregator)

        async def delivered() -> bool:
            # Interest reaches the agent's server over a route asynchronously: until it
            # has, a core publish finds no subscriber and is dropped, so publish again.
            await agent.publish(subject, b"hello")
            await agent.flush()
            return not got.empty()

        await wait_until(delivered, timeout=20, interval=0.1, what="a message over a route")
        assert got.get_nowait() == b"hello"
    finally:
        await agent.close()
        await aggregator.close()
