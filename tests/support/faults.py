"""Helpers of the fault tests: an alert recorder backed by a JetStream stream, snapshot
comparison with what the agent reads from its tree, and subprocess aggregators and agents.

The recorder is a file-backed stream on `nicfleet.v1.alert.>`, so it counts every alert
the server accepted even while a core subscriber would be reconnecting.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client as NatsClient
from nats.js.api import StreamConfig

from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from proto.codec import decode
from proto.compact import inventory_only
from proto.inventory import NodeSnapshot
from proto.messages.alerts import Alert
from tests.support.paths import REPO

ALERTS = "nicfleet.v1.alert.>"
RECORDER = "FAULTS_ALERTS"


async def add_alert_recorder(nc: NatsClient) -> None:
    """A stream keeping every alert message; dedupe window 100 ms, the server's minimum."""
    await nc.jetstream().add_stream(
        StreamConfig(name=RECORDER, subjects=[ALERTS], duplicate_window=0.1)
    )


async def recorded_alerts(nc: NatsClient) -> list[Alert]:
    js = nc.jetstream()
    info = await js.stream_info(RECORDER)
    found: list[Alert] = []
    if not info.state.messages:
        return found
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await js.get_msg(RECORDER, seq)
        found.append(decode(msg.data or b"", Alert))
    return found


def transitions(alerts: list[Alert], node: str, subject: str) -> list[str]:
    return [a.state for a in alerts if (a.node, a.subject) == (node, subject)]


def duplicates(alerts: list[Alert]) -> dict[tuple[str, str], int]:
    """(fingerprint, state) pairs notified more than once."""
    counts = Counter((a.fingerprint, a.state) for a in alerts)
    return {key: n for key, n in counts.items() if n > 1}


def comparable(snapshot: NodeSnapshot) -> dict[str, Any]:
    """The snapshot as builtins, without what differs per publish or process (seq, time,
    version, the agent process's epoch)."""
    doc: dict[str, Any] = msgspec.to_builtins(snapshot)
    for key in ("seq", "collected_at", "agent_version", "epoch"):
        doc.pop(key, None)
    return doc


def read_tree(root: Path, node: str) -> dict[str, Any]:
    """What the agent sees in its tree right now, as the aggregator stores it (no counters)."""
    snap = collect_snapshot(Sysfs(root), node=node, seq=0, now=0.0, agent_version="")
    return comparable(inventory_only(snap))


class AggregatorProcess:
    """`python -m aggregator run` as a child process; `kill()` is SIGKILL."""

    def __init__(
        self, nats_url: str, work: Path, name: str, *, extra: tuple[str, ...] = ()
    ) -> None:
        self.ready_file = work / f"{name}.ready"
        self.log = work / f"{name}.log"
        self._args = [
            sys.executable, "-m", "aggregator", "run",
            "--nats-url", nats_url,
            "--listen", "127.0.0.1:0",
            "--ready-file", str(self.ready_file),
            *extra,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> AggregatorProcess:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self._args, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        return self

    def is_ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"aggregator exited: {self.log.read_text()[-2000:]}")
        return self.ready_file.exists()

    @property
    def api_url(self) -> str:
        return str(json.loads(self.ready_file.read_text())["api_url"])

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


class AgentProcess:
    """`python -m agent run` on a lab tree as a child process, its device plugin (legacy
    registration) on `plugin_dir` and metrics on a free port; `kill()` is SIGKILL."""

    def __init__(
        self,
        nats_url: str,
        root: Path,
        node: str,
        *,
        work: Path,
        plugin_dir: Path | None = None,
        config: Path | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.log = work / f"agent-{node}.log"
        self._args = [
            sys.executable, "-m", "agent", "run",
            "--nats-url", nats_url,
            "--sysfs-root", str(root),
            "--node-name", node,
            "--no-netlink", "--verbs", "off",
            "--counter-interval", "0.2",
            "--metrics-addr", "127.0.0.1:0",
            *extra,
        ]  # fmt: skip
        if plugin_dir is not None:
            self._args += [
                "--device-plugin-dir", str(plugin_dir),
                "--plugins-registry-dir", str(plugin_dir.parent / "no-registry"),
                "--registration-mode", "legacy",
            ]  # fmt: skip
            self._args += ["--device-plugin-config", str(config)] if config else ["--device-plugin"]
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0

    def start(self) -> AgentProcess:
        self._log_start = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self._args, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        return self

    def output(self) -> str:
        """This run's log (earlier runs share the file)."""
        with self.log.open("rb") as f:
            f.seek(self._log_start)
            return f.read().decode(errors="replace")

    def metrics_url(self) -> str | None:
        """Set once this run logged its metrics address."""
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"agent exited: {self.output()[-2000:]}")
        found = re.search(r"serving metrics on (http://[^\s\"]+)", self.output())  # text or JSON
        return found.group(1) if found else None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def stalled_subscriber(port: int, name: str, subject: str = ALERTS) -> socket.socket:
    """A raw NATS client named `name` that subscribes to `subject` and never reads again."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.recv(4096)  # INFO
    connect = json.dumps({"verbose": False, "name": name})
    sock.sendall(f"CONNECT {connect}\r\nSUB {subject} 1\r\nPING\r\n".encode())
    sock.recv(4096)  # PONG: subscribed; from here on nothing is read
    return sock


def free_port() -> int:
    """A loopback port free right now (for a server flag that wants a number)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
