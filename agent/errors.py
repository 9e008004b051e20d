"""The agent's exception tree and the log of per-file read errors.

Readers translate OS errors into these at their boundary (`raise X(...) from exc`); the
shell decides what is fatal; retryable vs permanent is a type, never a string. No I/O.

    AgentError
    ├── SysfsRootError      the --sysfs-root is missing or is not a sysfs tree (permanent)
    ├── ReadFailed          one file could not be read (per file: record it, go on)
    │   └── CollectionTimeout  a whole collection kept blocking in the kernel (retry later)
    └── ParseError          a file's text is not in the kernel's format (also a ValueError)
"""

from __future__ import annotations

from proto.inventory import ReadError


class AgentError(Exception):
    """Base of every error the agent raises on purpose."""


class SysfsRootError(AgentError):
    """The sysfs root cannot be used at all; retrying will not help."""

    def __init__(self, root: str, reason: str) -> None:
        self.root = root
        self.reason = reason
        super().__init__(f"sysfs root {root!r} is unusable: {reason}")


class ReadFailed(AgentError):
    """One sysfs file (or link, or directory) could not be read.

    `path` is the path the agent asked for, relative to the sysfs root and starting with
    '/'; `error` is the errno name (ENOENT, EACCES, ...) or a short reason.
    """

    def __init__(self, path: str, error: str) -> None:
        self.path = path
        self.error = error
        super().__init__(f"{path}: {error}")

    def to_read_error(self) -> ReadError:
        return ReadError(path=self.path, error=self.error)


class CollectionTimeout(ReadFailed):
    """Reads kept blocking past the time bound, more often than a collection retries.

    `path` names the last file a read was stuck on ("/" when none was in flight).
    """


class ParseError(AgentError, ValueError):
    """Text that is not in the format the kernel writes; names what was being parsed."""

    def __init__(self, what: str, text: str, reason: str = "unexpected format") -> None:
        self.what = what
        self.text = text
        self.reason = reason
        super().__init__(f"cannot parse {what} from {text[:80]!r}: {reason}")

    def short(self) -> str:
        """How a snapshot's `errors` list shows this: `empty` or `unparsable: '<text>'`."""
        value = self.text.strip()
        return "empty" if not value else f"unparsable: {value[:40]!r}"


class ReadErrorLog:
    """The per-file read errors of one collection; the first error per path wins."""

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
