"""node_exporter as the baseline process of bench/agent_collect.py: find, start, scrape, stop.

Owns the `prometheus-node-exporter` child (Debian package, 1.5): an ephemeral loopback
port, readiness, timed scrapes over one kept-alive connection (as Prometheus scrapes) and
its CPU time from /proc. Never listens beyond 127.0.0.1; never outlives the `with` block.
A library, not a script: `bench/agent_collect.py --smoke` runs it (make test).
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Final, Self

BINARY: Final = "prometheus-node-exporter"
APT_PACKAGE: Final = "prometheus-node-exporter"
READY_TIMEOUT_S: Final = 15.0
STOP_TIMEOUT_S: Final = 5.0
START_ATTEMPTS: Final = 3  # the probed port can be taken between probe and bind


class BaselineUnavailable(RuntimeError):
    """node_exporter cannot be found, installed or started; the message says why."""


def find_binary(*, install: bool) -> Path:
    """The node_exporter binary, installed from Debian first when asked and missing."""
    found = shutil.which(BINARY)
    if found is None and install:
        _apt_install()
        found = shutil.which(BINARY)
    if found is None:
        hint = "run with --install (as root)" if not install else "apt-get install failed"
        raise BaselineUnavailable(f"{BINARY} not found on PATH: {hint}")
    return Path(found)


def _apt_install() -> None:
    if os.geteuid() != 0:
        raise BaselineUnavailable(f"installing {APT_PACKAGE} needs root")
    command = ["apt-get", "install", "-y", "--no-install-recommends", APT_PACKAGE]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(command, env=env, capture_output=True, check=False).returncode != 0:
        # A fresh machine has no package lists yet.
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, check=False)
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BaselineUnavailable(f"apt-get install {APT_PACKAGE}: {done.stderr[-300:]}")


def binary_version(binary: Path) -> str:
    """First line of `--version`, e.g. 'node_exporter, version 1.5.0 (...)'."""
    done = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=10, check=False
    )
    lines = (done.stdout or done.stderr).splitlines()
    return lines[0].strip() if lines else "unknown"


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class NodeExporter:
    """One node_exporter with only the infiniband and netclass collectors on `sysfs`."""

    def __init__(self, binary: Path, sysfs: Path, *, log: Path) -> None:
        self.binary = binary
        self.sysfs = sysfs
        self.log = log
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._connection: http.client.HTTPConnection | None = None

    def __enter__(self) -> Self:
        for _ in range(START_ATTEMPTS):
            if self._start():
                return self
        raise BaselineUnavailable(f"node_exporter did not start; see {self.log}")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _start(self) -> bool:
        self.port = _free_loopback_port()
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    str(self.binary),
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    f"--path.sysfs={self.sysfs}",
                    "--collector.disable-defaults",
                    "--collector.infiniband",
                    "--collector.netclass",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False  # most likely the port was taken meanwhile: try another
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            except OSError:
                time.sleep(0.01)  # a bench script polling a child: no event to wait on
                continue
            return True
        self.stop()
        raise BaselineUnavailable(f"node_exporter not answering after {READY_TIMEOUT_S}s")

    def scrape(self) -> bytes:
        """GET /metrics over the kept-alive connection (no gzip: the cheaper case for it)."""
        if self._connection is None:
            self._connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        self._connection.request("GET", "/metrics")
        response = self._connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise BaselineUnavailable(f"/metrics answered {response.status}: {body[:200]!r}")
        return body

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used so far (from /proc/<pid>/stat)."""
        if self._process is None:
            raise BaselineUnavailable("node_exporter is not running")
        stat = Path(f"/proc/{self._process.pid}/stat").read_text()
        # Fields after the ")" closing comm: state is field 3, utime 14, stime 15.
        fields = stat.rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
