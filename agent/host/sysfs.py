"""Reads bytes, text, directories and links from a sysfs tree under an explicit root.

I/O only: translates OS errors into `ReadFailed` carrying the errno name and never
interprets values (that is agent.host.parse). Links resolve inside the root like a chroot;
only regular files are read, and only up to a size bound; every read goes through the
agent.host.deadlines guard, so one that blocks in the kernel cannot stall a whole collection.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeVar

from agent.errors import ParseError, ReadErrorLog, ReadFailed, SysfsRootError
from agent.host.deadlines import ReadAbandoned, ReadGuard

T = TypeVar("T")

# A sysfs attribute is at most one page; anything longer is not an attribute we want.
MAX_ATTRIBUTE_BYTES: Final = 65536
# Same bound as the kernel's MAXSYMLINKS: a loop in a broken tree ends as ELOOP.
MAX_LINK_HOPS: Final = 40
NOT_REGULAR: Final = "not a regular file"
TOO_LARGE: Final = "EFBIG"
# O_NONBLOCK: opening a FIFO planted where an attribute should be must not wait for a
# writer (the fstat check then refuses it). O_NOFOLLOW: the last component was resolved
# inside the root already; a link swapped in since then is refused, not followed.
_OPEN_FLAGS: Final = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
_PATH_FLAGS: Final = os.O_PATH | os.O_CLOEXEC
# Linux reuses 95 for ENOTSUP and EOPNOTSUPP; sysfs show() methods return -EOPNOTSUPP.
_ERRNO_NAMES: Final = {**errno.errorcode, errno.EOPNOTSUPP: "EOPNOTSUPP"}
_SYSFS_TOP_DIRS: Final = ("class", "devices", "bus")


def errno_name(exc: OSError) -> str:
    """The symbolic errno of an OSError ("ENOENT"), or "EIO" when it carries none."""
    return _ERRNO_NAMES.get(exc.errno or 0, "EIO")


def _split(path: str) -> list[str]:
    return [part for part in path.split("/") if part and part != "."]


def _logical(path: str) -> str:
    return "/" + "/".join(_split(path))


class Sysfs:
    """A sysfs tree rooted at `root`; every path argument is relative to it.

    Paths may be written with or without a leading '/'; errors always name the path as
    asked (`/class/infiniband/mlx5_0/fw_ver`), not where links led. Safe to share
    between threads: the counter loop, the port-state poll and a snapshot run at once.
    """

    def __init__(self, root: Path) -> None:
        absolute = Path(os.path.abspath(root))
        if not absolute.is_dir():
            reason = "does not exist" if not absolute.exists() else "is not a directory"
            raise SysfsRootError(str(root), reason)
        if not any((absolute / top).is_dir() for top in _SYSFS_TOP_DIRS):
            raise SysfsRootError(str(root), "has none of class/, devices/, bus/")
        self._root = absolute
        # Host paths are built on the real root, so the kernel's answer to "where is this
        # really" (see _locate) can be compared with it.
        self._root_str = os.path.realpath(absolute)
        self._root_prefix = self._root_str.rstrip("/") + "/"
        self._guard = ReadGuard()

    @property
    def root(self) -> Path:
        return self._root

    # --- the only places that touch file contents ------------------------------------

    def read_file(self, host: str, path: str, limit: int = MAX_ATTRIBUTE_BYTES) -> bytes:
        """The bytes of one regular file at host path `host` (located through `dir`).

        `path` names it in errors. More than `limit` bytes is EFBIG; a directory is
        EISDIR; a FIFO, socket or device node is refused without reading it.
        """
        me = self._guard.enter(path)
        try:
            return self._load(host, path, limit)
        except OSError as exc:
            raise ReadFailed(path, errno_name(exc)) from exc
        finally:
            self._guard.leave(me, path)

    def open_file(self, host: str, path: str) -> int:
        """A descriptor on a regular file, for `pread` in a sampling loop; caller closes."""
        me = self._guard.enter(path)
        fd = -1
        try:
            fd = os.open(host, _OPEN_FLAGS)
            self._check_regular(fd, path)
        except BaseException as exc:
            if fd >= 0:
                os.close(fd)
                fd = -1
            if isinstance(exc, OSError):
                raise ReadFailed(path, errno_name(exc)) from exc
            raise
        finally:
            try:
                self._guard.leave(me, path)
            except ReadAbandoned:
                if fd >= 0:
                    os.close(fd)
                raise
        return fd

    def pread(self, fd: int, path: str, size: int) -> bytes:
        """Re-read an open attribute from offset 0: sysfs runs show() again on every read.

        A file that fills all `size` bytes may be longer: EFBIG, like `read_file`.
        """
        me = self._guard.enter(path)
        try:
            data = self._pread(fd, path, size)
        except OSError as exc:
            raise ReadFailed(path, errno_name(exc)) from exc
        finally:
            self._guard.leave(me, path)
        if len(data) >= size:
            raise ReadFailed(path, TOO_LARGE)
        return data

    def _load(self, host: str, path: str, limit: int) -> bytes:
        # Seam for tests that need a read which blocks (no real file can be made to).
        fd = os.open(host, _OPEN_FLAGS)
        try:
            data = os.read(fd, limit + 1)
            if not data:
                # Empty: a real empty attribute, or a FIFO/device node (which O_NONBLOCK
                # let us open without waiting); only then is fstat worth a syscall.
                self._check_regular(fd, path)
        finally:
            os.close(fd)
        if len(data) > limit:
            raise ReadFailed(path, TOO_LARGE)
        return data

    def _pread(self, fd: int, path: str, size: int) -> bytes:
        # Seam for tests: a removed device's open attribute fails with ENODEV on a real
        # kernfs, which no ordinary filesystem reproduces.
        return os.pread(fd, size, 0)

    @staticmethod
    def _check_regular(fd: int, path: str) -> None:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ReadFailed(path, "EISDIR")
        if not stat.S_ISREG(mode):
            raise ReadFailed(path, NOT_REGULAR)

    def run_bounded(self, work: Callable[[], T], *, timeout: float | None, retries: int = 3) -> T:
        """`work()` (reading this tree) in a worker thread, given up after `timeout`
        seconds; a file whose read blocked answers ETIMEDOUT in the next run. After
        `retries` hung files, CollectionTimeout (see agent.host.deadlines)."""
        return self._guard.run(work, timeout=timeout, retries=retries)

    # --- paths, directories, links --------------------------------------------------------

    def dir(self, path: str) -> SysDir:
        """The directory at `path`, links resolved once, for reading many files below it."""
        parts, host = self._locate(path, (), self._root_str, _logical(path))
        return SysDir(self, _logical(path), parts, host)

    def read_text(self, path: str) -> str:
        """The text of one attribute file, links followed; raises ReadFailed."""
        parts = self._walk(path, follow_last=True)
        data = self.read_file(os.path.join(self._root_str, *parts), _logical(path))
        return data.decode("utf-8", "replace")

    def list_dir(self, path: str) -> list[str]:
        """Sorted entry names of a directory, links followed; raises ReadFailed."""
        return self.dir(path).entries()

    def exists(self, path: str) -> bool:
        """Whether `path` resolves (a dangling link does not)."""
        try:
            self.dir(path)
        except ReadFailed:
            return False
        return True

    def _locate(
        self, path: str, base: tuple[str, ...], base_host: str, logical: str
    ) -> tuple[tuple[str, ...], str]:
        """`(parts, host path)` of `path` below `base`, links followed, inside the root.

        Fast path: let the kernel resolve it (one O_PATH open) and ask where it landed;
        anything that lands outside the root, or fails, takes the component-by-component
        `_walk`, which applies the chroot rules and names the error.
        """
        try:
            fd = os.open(f"{base_host}/{path.strip('/')}", _PATH_FLAGS)
        except OSError:
            pass
        else:
            try:
                real = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                real = ""  # no /proc: always walk
            finally:
                os.close(fd)
            if real.startswith(self._root_prefix):
                return tuple(real[len(self._root_prefix) :].split("/")), real
            if real == self._root_str:
                return (), real
        parts = tuple(self._walk(path, follow_last=True, base=base, logical=logical))
        return parts, os.path.join(self._root_str, *parts)

    def _walk(
        self, path: str, *, follow_last: bool, base: tuple[str, ...] = (), logical: str = ""
    ) -> list[str]:
        """Resolve `path` below `base` one component at a time, links included, never
        leaving the root.

        `..` at the root stays at the root, and an absolute link target restarts at the
        root: captured trees hold links such as `/sys/devices/...`, whose `/sys` prefix
        stands for the root itself.
        """
        logical = logical or _logical(path)
        pending = list(reversed(_split(path)))
        resolved = list(base)
        host = os.path.join(self._root_str, *resolved)  # kept in step with `resolved`
        hops = 0
        while pending:
            name = pending.pop()
            if name == "..":
                if resolved:
                    resolved.pop()
                    host = host[: host.rindex("/")]
                continue
            child = f"{host}/{name}"
            try:
                mode = os.lstat(child).st_mode
            except OSError as exc:
                raise ReadFailed(logical, errno_name(exc)) from exc
            last = not pending
            if stat.S_ISLNK(mode) and (follow_last or not last):
                hops += 1
                if hops > MAX_LINK_HOPS:
                    raise ReadFailed(logical, "ELOOP")
                try:
                    target = os.readlink(child)
                except OSError as exc:
                    raise ReadFailed(logical, errno_name(exc)) from exc
                if target.startswith("/"):
                    resolved, host = [], self._root_str
                    target = target.removeprefix("/sys/") if target != "/sys" else ""
                pending.extend(reversed(_split(target)))
                continue
            if not last and not stat.S_ISDIR(mode):
                raise ReadFailed(logical, "ENOTDIR")
            resolved.append(name)
            host = child
        return resolved


class SysDir:
    """A directory of the tree, resolved once: files below it are read with one open.

    `path` is the logical ('/'-prefixed, as asked) name used in errors, `parts` the
    resolved root-relative components, `host` the host path they make.
    """

    __slots__ = ("host", "parts", "path", "sysfs")

    def __init__(self, sysfs: Sysfs, path: str, parts: tuple[str, ...], host: str) -> None:
        self.sysfs = sysfs
        self.path = path
        self.parts = parts
        self.host = host

    @property
    def realpath(self) -> str:
        return "/" + "/".join(self.parts)

    def child(self, name: str) -> SysDir:
        """A directory (or link to one) below this one; raises ReadFailed."""
        logical = f"{self.path}/{name}"
        parts, host = self.sysfs._locate(name, self.parts, self.host, logical)
        return SysDir(self.sysfs, logical, parts, host)

    def renamed(self, path: str) -> SysDir:
        """The same directory under another logical name (how errors will call it)."""
        return SysDir(self.sysfs, path, self.parts, self.host)

    def ancestor(self, depth: int) -> SysDir:
        """The directory `depth` levels up, named by its real path."""
        parts = self.parts[:-depth]
        host = self.host.rsplit("/", depth)[0]
        return SysDir(self.sysfs, "/" + "/".join(parts), parts, host)

    def read_bytes(self, name: str, limit: int = MAX_ATTRIBUTE_BYTES) -> bytes:
        return self.sysfs.read_file(f"{self.host}/{name}", f"{self.path}/{name}", limit)

    def read(self, name: str) -> str:
        return self.read_bytes(name).decode("utf-8", "replace")

    def entries(self) -> list[str]:
        """Sorted entry names; raises ReadFailed."""
        try:
            return sorted(os.listdir(self.host))
        except OSError as exc:
            raise ReadFailed(self.path, errno_name(exc)) from exc

    def link_name(self, name: str) -> str:
        """Basename of where the link `name` below this directory leads, if it exists.

        Not a link: EINVAL (as readlink(2)); a dangling link: ENOENT.
        """
        try:
            mode = os.lstat(f"{self.host}/{name}").st_mode
        except OSError as exc:
            raise ReadFailed(f"{self.path}/{name}", errno_name(exc)) from exc
        if not stat.S_ISLNK(mode):
            raise ReadFailed(f"{self.path}/{name}", "EINVAL")
        return self.child(name).parts[-1]


# Errors that mean "this attribute does not exist here", not "reading it failed".
ABSENT: Final = frozenset({"ENOENT"})


def read_value(
    d: SysDir,
    name: str,
    parser: Callable[[str], T],
    errors: ReadErrorLog,
    *,
    quiet: frozenset[str] = frozenset(),
) -> T | None:
    """Read and parse one attribute; a failure is recorded in `errors` and gives None.

    `quiet` names read errors that are an answer, not a failure, for this attribute and
    are not recorded: ABSENT for files only some hardware has (SR-IOV files, a module's
    `version`), EINVAL where the kernel says "no value" (an IB GID's ndev).
    """
    try:
        text = d.read(name)
    except ReadFailed as failure:
        if failure.error not in quiet:
            errors.add(failure)
        return None
    try:
        return parser(text)
    except ParseError as exc:
        errors.record(f"{d.path}/{name}", exc.short())
        return None
