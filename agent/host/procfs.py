"""Reads the few procfs files the snapshot needs (the kernel command line and release,
the NVIDIA driver's version line) below an explicit root.

I/O only, like agent.host.sysfs: returns text or raises ReadFailed carrying the errno
name, with the path named `/proc/<rel>` whatever the root. These files are global, not
namespaced: a container's own /proc shows the host kernel's, so no host mount is needed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from agent.errors import ReadFailed
from agent.host.sysfs import TOO_LARGE, errno_name

MAX_BYTES: Final = 4096  # COMMAND_LINE_SIZE is 2048 on x86, 4096 on arm64
_FLAGS: Final = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK


class Procfs:
    """A procfs tree rooted at `root` (the host's /proc, or a captured copy)."""

    def __init__(self, root: Path) -> None:
        self._root = Path(os.path.abspath(root))

    @property
    def root(self) -> Path:
        return self._root

    def read_text(self, rel: str) -> str:
        """The text of `rel` (e.g. `cmdline`); raises ReadFailed as `/proc/<rel>`."""
        rel = rel.strip("/")
        name = f"/proc/{rel}"
        if ".." in rel.split("/"):
            raise ReadFailed(name, "EINVAL")
        try:
            fd = os.open(self._root / rel, _FLAGS)
            try:
                data = os.read(fd, MAX_BYTES + 1)
            finally:
                os.close(fd)
        except OSError as exc:
            raise ReadFailed(name, errno_name(exc)) from exc
        if len(data) > MAX_BYTES:
            raise ReadFailed(name, TOO_LARGE)
        return data.decode("utf-8", "replace")
