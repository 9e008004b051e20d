"""Reads text, directories and links from a sysfs tree under an explicit root.

I/O only: returns raw text and names, translates OS errors into `ReadFailed` carrying the
errno name, and never interprets values (that is agent.parse). Symlinks are resolved
inside the root like a chroot would, so a captured or rendered tree can never make the
agent read the host's own /sys or anything else outside the root.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Final

from agent.errors import ReadFailed, SysfsRootError
from proto.inventory import ReadError

# A sysfs attribute is at most one page; anything longer is not an attribute we want.
MAX_ATTRIBUTE_BYTES: Final = 65536
# Same bound as the kernel's MAXSYMLINKS: a loop in a broken tree ends as ELOOP.
MAX_LINK_HOPS: Final = 40
# Linux reuses 95 for ENOTSUP and EOPNOTSUPP; sysfs show() methods return -EOPNOTSUPP.
_ERRNO_NAMES: Final = {**errno.errorcode, errno.EOPNOTSUPP: "EOPNOTSUPP"}
_SYSFS_TOP_DIRS: Final = ("class", "devices", "bus")


def errno_name(exc: OSError) -> str:
    """The symbolic errno of an OSError ("ENOENT"), or "EIO" when it carries none."""
    return _ERRNO_NAMES.get(exc.errno or 0, "EIO")


def _split(path: str) -> list[str]:
    return [part for part in path.split("/") if part and part != "."]


class ReadErrorLog:
    """The per-file read errors of one collection round; the first error per path wins."""

    def __init__(self) -> None:
        self._errors: dict[str, str] = {}

    def record(self, path: str, error: str) -> None:
        self._errors.setdefault(path, error)

    def add(self, failure: ReadFailed) -> None:
        self.record(failure.path, failure.error)

    def get(self, path: str) -> str | None:
        return self._errors.get(path)

    def __len__(self) -> int:
        return len(self._errors)

    def __contains__(self, path: object) -> bool:
        return path in self._errors

    def to_tuple(self) -> tuple[ReadError, ...]:
        """Every recorded error as wire structs, sorted by path."""
        return tuple(ReadError(path=p, error=e) for p, e in sorted(self._errors.items()))


class Sysfs:
    """A sysfs tree rooted at `root`; every path argument is relative to it.

    Paths may be written with or without a leading '/'; errors always name the path as
    asked (`/class/infiniband/mlx5_0/fw_ver`), not where links led.
    """

    def __init__(self, root: Path) -> None:
        absolute = Path(os.path.abspath(root))
        if not absolute.is_dir():
            reason = "does not exist" if not absolute.exists() else "is not a directory"
            raise SysfsRootError(str(root), reason)
        if not any((absolute / top).is_dir() for top in _SYSFS_TOP_DIRS):
            raise SysfsRootError(str(root), "has none of class/, devices/, bus/")
        self._root = absolute
        self._root_str = str(absolute)

    @property
    def root(self) -> Path:
        return self._root

    def read_text(self, path: str) -> str:
        """The text of one attribute file, links followed; raises ReadFailed."""
        return self.read_resolved(self.resolve(path), path)

    def read_optional(self, path: str, errors: ReadErrorLog) -> str | None:
        """`read_text`, but a failure is recorded in `errors` and answered with None."""
        try:
            return self.read_text(path)
        except ReadFailed as failure:
            errors.add(failure)
            return None

    def read_resolved(self, host_path: Path, path: str) -> str:
        """Read a file located by `resolve`, or a plain name inside a directory it located.

        The hot loops' entry point (counters, port states): no walk, one open and read.
        `path` only names the file in errors. O_NOFOLLOW refuses a final component that
        is (or was swapped for) a link, so this can never be led outside the root.
        """
        logical = "/" + "/".join(_split(path))
        try:
            fd = os.open(host_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                data = os.read(fd, MAX_ATTRIBUTE_BYTES)
            finally:
                os.close(fd)
        except OSError as exc:
            raise ReadFailed(logical, errno_name(exc)) from exc
        return data.decode("utf-8", errors="replace")

    def list_dir(self, path: str) -> list[str]:
        """Sorted entry names of a directory, links followed; raises ReadFailed."""
        host = self.resolve(path)
        try:
            return sorted(os.listdir(host))
        except OSError as exc:
            raise ReadFailed("/" + "/".join(_split(path)), errno_name(exc)) from exc

    def exists(self, path: str) -> bool:
        try:
            self.resolve(path)
        except ReadFailed:
            return False
        return True

    def is_dir(self, path: str) -> bool:
        try:
            return os.path.isdir(self.resolve(path))
        except ReadFailed:
            return False

    def realpath(self, path: str) -> str:
        """Where `path` really is inside the root, '/'-prefixed; raises ReadFailed."""
        return "/" + "/".join(self._walk(path, follow_last=True))

    def resolve(self, path: str) -> Path:
        """The host path of `path` with every link resolved inside the root."""
        return Path(self._root_str, *self._walk(path, follow_last=True))

    def link_target(self, path: str) -> str:
        """The existing target of the symlink at `path`, as a root-relative path.

        Like readlink(2), a `path` that is not a link fails with EINVAL; a dangling link
        (a half-unbound device, or a partial capture) fails with ENOENT: read as absent.
        """
        own = self._walk(path, follow_last=False)
        try:
            mode = os.lstat(os.path.join(self._root_str, *own)).st_mode
        except OSError as exc:
            raise ReadFailed("/" + "/".join(_split(path)), errno_name(exc)) from exc
        if not stat.S_ISLNK(mode):
            raise ReadFailed("/" + "/".join(_split(path)), "EINVAL")
        return self.realpath(path)

    def link_name(self, path: str) -> str:
        """Basename of an existing link target (e.g. a `driver` link -> "mlx5_core")."""
        return self.link_target(path).rsplit("/", 1)[-1]

    def _walk(self, path: str, *, follow_last: bool) -> list[str]:
        """Resolve `path` one component at a time, links included, never leaving the root.

        `..` at the root stays at the root, and an absolute link target restarts at the
        root: captured trees hold links such as `/sys/devices/...`, whose `/sys` prefix
        stands for the root itself.
        """
        logical = "/" + "/".join(_split(path))
        pending = list(reversed(_split(path)))
        resolved: list[str] = []
        hops = 0
        while pending:
            name = pending.pop()
            if name == "..":
                if resolved:
                    resolved.pop()
                continue
            host = os.path.join(self._root_str, *resolved, name)
            try:
                mode = os.lstat(host).st_mode
            except OSError as exc:
                raise ReadFailed(logical, errno_name(exc)) from exc
            last = not pending
            if stat.S_ISLNK(mode) and (follow_last or not last):
                hops += 1
                if hops > MAX_LINK_HOPS:
                    raise ReadFailed(logical, "ELOOP")
                try:
                    target = os.readlink(host)
                except OSError as exc:
                    raise ReadFailed(logical, errno_name(exc)) from exc
                if target.startswith("/"):
                    resolved = []
                    target = target.removeprefix("/sys/") if target != "/sys" else ""
                pending.extend(reversed(_split(target)))
                continue
            if not last and not stat.S_ISDIR(mode):
                raise ReadFailed(logical, "ENOTDIR")
            resolved.append(name)
        return resolved
