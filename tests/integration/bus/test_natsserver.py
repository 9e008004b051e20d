"""The embedded nats-server launcher: real process, server-chosen port, clean stop."""

from __future__ import annotations

import socket
from pathlib import Path

import nats
import pytest

from aggregator.bus.natsserver import NatsServer, NatsServerSettings
from aggregator.errors import EmbeddedNatsError

pytestmark = pytest.mark.integration


async def test_start_accepts_jetstream_and_restart_keeps_port_and_store(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with NatsServer(NatsServerSettings(store_dir=store)) as server:
        url = server.url
        assert url.startswith("nats://127.0.0.1:")
        nc = await nats.connect(url)
        kv = await nc.jetstream().create_key_value(bucket="launcher-test")
        await kv.put("k", b"v1")
        await nc.close()
        server.restart()
        assert server.url == url  # clients reconnect to the same address
        nc = await nats.connect(url)
        kv = await nc.jetstream().key_value("launcher-test")
        assert (await kv.get("k")).value == b"v1"  # the JetStream store survived
        await nc.close()
    assert not server.running
    port = int(url.rsplit(":", 1)[1])
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0  # nothing listens any more


def test_temporary_workdir_is_removed_on_close() -> None:
    server = NatsServer().start()
    store = server.store_dir
    assert store.parent.exists()
    server.close()
    assert not store.parent.exists()


def test_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    settings = NatsServerSettings(binary=tmp_path / "no-such-nats-server")
    with pytest.raises(EmbeddedNatsError, match="no-such-nats-server"):
        NatsServer(settings).start()


def test_server_that_exits_at_start_reports_why(tmp_path: Path) -> None:
    settings = NatsServerSettings(extra_args=("--no-such-flag",), start_timeout=5)
    with pytest.raises(EmbeddedNatsError, match="exited with code"):
        NatsServer(settings).start()
