"""The `validator` NATS role on a real nats-server: a validation pod may publish its
result on nicfleet.v1.validation.<id> and nothing else, and may subscribe to nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from aggregator.bus.keys import new_user_seed, public_key
from aggregator.bus.natsserver import NatsServer, NatsServerSettings
from aggregator.bus.permissions import Identity, Role, render_server_config
from proto import subjects
from proto.runtime.natsconnect import NatsClientSecurity, connect_options
from proto.runtime.natsflush import flush_in_order

pytestmark = pytest.mark.integration


@pytest.fixture
def validator_server(tmp_path: Path) -> Iterator[tuple[NatsServer, Path]]:
    seed = new_user_seed()
    seed_file = tmp_path / "validator.nk"
    seed_file.write_bytes(seed)
    aggregator = new_user_seed()
    (tmp_path / "aggregator.nk").write_bytes(aggregator)
    config = tmp_path / "auth.conf"
    config.write_text(
        render_server_config(
            (
                Identity(Role.VALIDATOR, public_key(seed)),
                Identity(Role.AGGREGATOR, public_key(aggregator)),
            )
        )
    )
    with NatsServer(NatsServerSettings(store_dir=tmp_path / "js", config_file=config)) as server:
        yield server, seed_file


async def test_validator_publishes_results_only(validator_server: tuple[NatsServer, Path]) -> None:
    server, seed_file = validator_server
    violations: asyncio.Queue[str] = asyncio.Queue()

    async def on_error(exc: Exception) -> None:
        await violations.put(str(exc))

    options = connect_options(NatsClientSecurity(nkey_seed_file=seed_file))
    nc = await nats.connect(server.url, error_cb=on_error, allow_reconnect=False, **options)
    try:
        await nc.publish(subjects.validation_subject("v-1"), b"result")
        await flush_in_order(nc)
        assert violations.empty()  # allowed: nothing reported
        await nc.publish(subjects.node_subject("gpu-01", subjects.SNAPSHOT), b"forged")
        await flush_in_order(nc)
        assert (
            "permissions violation for publish"
            in (await asyncio.wait_for(violations.get(), 5)).lower()
        )
        await nc.subscribe(subjects.VALIDATION_WILDCARD)
        await flush_in_order(nc)
        assert (
            "permissions violation for subscription"
            in (await asyncio.wait_for(violations.get(), 5)).lower()
        )
    finally:
        await nc.close()


async def test_the_aggregator_receives_the_validators_result(
    validator_server: tuple[NatsServer, Path],
) -> None:
    """The aggregator's role may subscribe to the results (else every validation under
    authentication would time out waiting for them)."""
    server, seed_file = validator_server
    aggregator_seed = seed_file.with_name("aggregator.nk")
    agg = await nats.connect(
        server.url, **connect_options(NatsClientSecurity(nkey_seed_file=aggregator_seed))
    )
    pod = await nats.connect(
        server.url, **connect_options(NatsClientSecurity(nkey_seed_file=seed_file))
    )
    try:
        sub = await agg.subscribe(subjects.VALIDATION_WILDCARD)
        await flush_in_order(agg)
        await pod.publish(subjects.validation_subject("v-2"), b"result")
        await flush_in_order(pod)
        # Bounded, with room for a stalled machine (a 5 s wait once timed out in CI).
        msg = await sub.next_msg(timeout=30)
        assert (msg.subject, msg.data) == (subjects.validation_subject("v-2"), b"result")
    finally:
        await pod.close()
        await agg.close()
