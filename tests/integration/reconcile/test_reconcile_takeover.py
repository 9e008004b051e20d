"""A replica that becomes leader while the config bucket cannot be read must not crash:
it leads nothing that round, says why, and takes over once the bucket answers again."""

from __future__ import annotations

import logging
from pathlib import Path

import nats
import pytest

from aggregator.bus.natsserver import NatsServer
from aggregator.errors import StoreError
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.state import Fleet
from aggregator.reconcile.apply import ConfigStore, open_config_bucket
from aggregator.reconcile.loop import Reconciler, ReconcileSettings
from aggregator.reconcile.policies import FilePolicies


async def test_unreadable_config_bucket_raises_a_store_error(own_nats: NatsServer) -> None:
    nc = await nats.connect(own_nats.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    try:
        store = ConfigStore(await open_config_bucket(nc.jetstream()))
        assert await store.load() == {}
        own_nats.stop(kill=True)
        with pytest.raises(StoreError, match="nicfleet-config"):
            await store.load()
    finally:
        await nc.close()


async def test_leader_takeover_with_the_bucket_down_retries_instead_of_crashing(
    own_nats: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nc = await nats.connect(own_nats.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    policy = tmp_path / "policy.yaml"
    policy.write_text("")
    try:
        store = ConfigStore(await open_config_bucket(nc.jetstream()))
        rec = Reconciler(
            ReconcileSettings(),
            fleet=Fleet(),
            changes=ChangeFeed().subscribe(),
            policies=FilePolicies(policy, interval=60.0),
            store=store,
            kube=None,
            is_leader=lambda: True,
        )
        own_nats.stop(kill=True)
        with caplog.at_level(logging.WARNING, logger="aggregator.reconcile.loop"):
            report = await rec.reconcile_once()
        assert not report.leader
        assert "stored configs are unreadable" in caplog.text

        own_nats.start()
        report = await rec.reconcile_once()
        assert report.leader
    finally:
        await nc.close()
