"""The emulated plugin watcher's directory scan: sockets only, new or replaced ones once."""

from __future__ import annotations

import socket
from pathlib import Path

from agent.lab.pluginwatch import SocketScan


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
