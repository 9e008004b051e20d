"""A 3-server JetStream cluster on loopback for fault tests (test support, not product).

Each server is an `aggregator.bus.natsserver.NatsServer` with its own name, store directory
and cluster (route) port; every server routes to all three.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aggregator.bus.natsserver import NatsServer, NatsServerSettings


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def js_cluster(
    work: Path, size: int = 3, name: str = "faults", config: Path | None = None
) -> Iterator[dict[str, NatsServer]]:
    """Start `size` clustered servers named n1..nN (each with `config`, e.g. subject
    mappings, when given); yields them by server name."""
    route_ports = [_free_port() for _ in range(size)]
    routes = ",".join(f"nats://127.0.0.1:{p}" for p in route_ports)
    servers: dict[str, NatsServer] = {}
    try:
        for i, route_port in enumerate(route_ports, start=1):
            server_name = f"n{i}"
            settings = NatsServerSettings(
                store_dir=work / server_name,
                config_file=config,
                extra_args=(
                    "-n", server_name,
                    "--cluster_name", name,
                    "--cluster", f"nats://127.0.0.1:{route_port}",
                    "--routes", routes,
                ),
            )  # fmt: skip
            servers[server_name] = NatsServer(settings).start()
        yield servers
    finally:
        for server in servers.values():
            server.close()
