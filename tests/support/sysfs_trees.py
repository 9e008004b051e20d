"""Helpers for tests that build or copy sysfs trees: files, links, the captured trees
with their links restored, and a Sysfs whose reads can be made to block."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agent.host.sysfs import Sysfs
from tests.support.paths import FIXTURES

CAPTURED = FIXTURES / "captured"
PROCFS_SYS = CAPTURED / "procfs-sys"
NODE_EXPORTER_SYS = CAPTURED / "node_exporter-sys"
TOPOLOGY = FIXTURES / "topology"


def write(root: Path, rel: str, text: str | bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def link(root: Path, rel: str, target: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def attrs(root: Path, directory: str, **values: str) -> None:
    for name, value in values.items():
        write(root, f"{directory}/{name}", value + "\n")


# The captured node_exporter tree (tests/data/captured) stores each symlink as a regular
# file holding the link target (its archive format lost them). Rebuild real links in a copy,
# so the tree looks like the host it came from: bus/pci/devices/* links and dangling
# `driver`, `iommu`, `subsystem` links.
_LINK_FILE = re.compile(rb"(?:\.\./)+[^\n]+")


def materialize(src: Path, dst: Path) -> Path:
    for dirpath, _, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in filenames:
            data = (Path(dirpath) / name).read_bytes()
            if _LINK_FILE.fullmatch(data):
                (dst / rel / name).symlink_to(data.decode())
            else:
                (dst / rel / name).write_bytes(data)
    return dst


class BlockingSysfs(Sysfs):
    """A Sysfs whose reads of paths ending in `hang_on` block until `release` is set.

    Stands in for a driver's show() stuck on a firmware command: no file on an ordinary
    filesystem can make read(2) block (a FIFO is refused before it is read).
    """

    def __init__(self, root: Path, hang_on: str) -> None:
        super().__init__(root)
        self.hang_on = hang_on
        self.release = threading.Event()
        self.entered = threading.Event()

    def _load(self, host: str, path: str, limit: int) -> bytes:
        if path.endswith(self.hang_on) and not self.release.is_set():
            self.entered.set()
            self.release.wait(30)
        return super()._load(host, path, limit)

    def _pread(self, fd: int, path: str, size: int) -> bytes:
        if path.endswith(self.hang_on) and not self.release.is_set():
            self.entered.set()
            self.release.wait(30)
        return super()._pread(fd, path, size)


@contextmanager
def released(sysfs: BlockingSysfs) -> Iterator[BlockingSysfs]:
    """Unblock the stuck reads at the end and wait for their threads to finish."""
    try:
        yield sysfs
    finally:
        sysfs.release.set()
        for thread in threading.enumerate():
            if thread.name == "nicfleet-sysfs":
                thread.join(10)
