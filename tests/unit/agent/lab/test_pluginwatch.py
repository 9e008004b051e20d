"""The emulated plugin watcher's directory scan: sockets only, new or replaced ones once."""

from __future__ import annotations

import socket
from pathlib import Path

from agent.lab.pluginwatch import RETRY_FIRST, RETRY_MAX, SocketScan


def _bind(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


def test_sockets_are_reported_once_until_replaced(tmp_path: Path) -> None:
    scan = SocketScan(tmp_path)
    (tmp_path / "notes.txt").write_text("not a socket")
    first = _bind(tmp_path / "a.sock")
    try:
        assert scan.changed() == [tmp_path / "a.sock"]
        assert scan.changed() == []  # unchanged: not again
        first.close()
        (tmp_path / "a.sock").unlink()
        assert scan.changed() == []  # gone: forgotten
        second = _bind(tmp_path / "a.sock")
        try:
            assert scan.changed() == [tmp_path / "a.sock"]  # a new socket at the same path
        finally:
            second.close()
    finally:
        first.close()


def test_clear_reports_everything_again(tmp_path: Path) -> None:
    scan = SocketScan(tmp_path)
    sock = _bind(tmp_path / "b.sock")
    try:
        assert scan.changed() == [tmp_path / "b.sock"]
        scan.clear()
        assert scan.changed() == [tmp_path / "b.sock"]
    finally:
        sock.close()


def test_an_unanswered_socket_is_offered_again_after_a_growing_pause(tmp_path: Path) -> None:
    # The kubelet retries a registration whose GetInfo failed; a socket asked once and
    # never again would leave a plugin "waiting" for good (a busy machine, a slow start).
    scan = SocketScan(tmp_path)
    sock = _bind(tmp_path / "c.sock")
    path = tmp_path / "c.sock"
    try:
        assert scan.changed(now=0.0) == [path]
        scan.unanswered(path, now=0.0)
        assert scan.changed(now=0.01) == []  # the first pause (RETRY_FIRST) not over
        assert scan.changed(now=RETRY_FIRST) == [path]
        assert scan.changed(now=RETRY_FIRST) == []  # offered once until judged again
        scan.unanswered(path, now=1.0)
        assert scan.changed(now=1.0 + RETRY_FIRST) == []  # the pause doubled
        assert scan.changed(now=1.0 + 2 * RETRY_FIRST) == [path]
        for _ in range(20):  # bounded: the pause stops growing at RETRY_MAX
            scan.unanswered(path, now=10.0)
        assert scan.changed(now=10.0 + RETRY_MAX) == [path]
        scan.answered(path)
        assert scan.changed(now=100.0) == []  # answered: not again until replaced
    finally:
        sock.close()


def test_a_replaced_socket_starts_over_and_a_gone_one_is_not_retried(tmp_path: Path) -> None:
    scan = SocketScan(tmp_path)
    path = tmp_path / "d.sock"
    sock = _bind(path)
    try:
        assert scan.changed(now=0.0) == [path]
        scan.unanswered(path, now=0.0)
    finally:
        sock.close()
    path.unlink()
    assert scan.changed(now=RETRY_MAX) == []  # gone: no retry of a removed socket
