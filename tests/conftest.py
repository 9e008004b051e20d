"""Shared fixtures: a real nats-server on loopback, root logging restored after each test.
Helpers the tests import live in tests/support/ (paths, waits, builders, fakes)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from aggregator.bus.natsserver import NatsServer, NatsServerSettings

# Fixtures that start a real server: a test using one is an integration test wherever it lives.
SERVER_FIXTURES = frozenset({"nats_server", "own_nats"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _restore_root_logging() -> Iterator[None]:
    """CLI commands run in-process (CliRunner) configure the root logger for the whole
    process; put it back so one test's log setup never leaks into the next test's output."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """One real nats-server (JetStream on) for the whole test session."""
    store = tmp_path_factory.mktemp("nats-store")
    with NatsServer(NatsServerSettings(store_dir=store)) as server:
        yield server


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server for one test, for tests that stop or restart it."""
    with NatsServer(NatsServerSettings(store_dir=tmp_path / "nats-store")) as server:
        yield server
