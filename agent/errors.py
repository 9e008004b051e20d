"""The agent's exception tree and the log of per-file read errors.

Readers translate OS errors into these at their boundary (`raise X(...) from exc`); the
shell decides what is fatal. Retryable vs permanent is the class attribute `retryable`
(False unless the class line says `retryable=True`), never a string or a marker class.
Classes keep a builtin base where callers catch it. No I/O. tests/unit/test_error_trees.py
checks this tree, and its (retryable) marks, against the code.

    AgentError
    ├── SysfsRootError        the --sysfs-root is missing or is not a sysfs tree
    ├── ReadFailed            one file could not be read (per file: record it, go on)
    │   └── CollectionTimeout   a whole collection kept blocking in the kernel (retryable)
    ├── ParseError            a file's text is not in the kernel's format (also a ValueError)
    │   └── HeaderOnly          only the unprivileged 64-byte PCI config header was readable
    ├── NetlinkUnavailable    netlink cannot be used (no permission, no netns, socket lost)
    ├── RegistrationFailed    the kubelet did not accept a device-plugin registration (retryable)
    ├── ServeError            a device-plugin socket could not be served (retryable)
    ├── InvalidRequest        a kubelet device request that cannot be honoured (a ValueError)
    ├── PublishFailed         a verify result could not reach NATS before its deadline
    ├── HandshakeError        the verify peer broke the handshake
    ├── RdmaTestError         the verify queue pair could not be set up or a transfer failed
    ├── PerftestParseError    perftest output with no result table (a ValueError)
    ├── AnnotationsError      a downward-API annotations file verify cannot parse (a ValueError)
    ├── SpecError             a lab node spec that cannot be loaded (a ValueError)
    ├── FaultError            a lab fault whose target does not exist (a ValueError)
    ├── RenderError           a lab tree cannot be written where asked
    ├── LabInputError         bad `nicfleet-agent lab` arguments (a click.ClickException)
    ├── ConfigCheckInputError bad `device-plugin check-config` input (a click.ClickException)
    ├── PrepareError          a DRA claim that cannot be prepared here (per claim; others can)
    ├── InvalidClaim          a DRA claim object that is malformed or not the one asked for
    ├── ClaimUnavailable      a DRA claim's allocation is not known yet (retryable)
    └── CheckpointError       the DRA checkpoint file cannot be read as one (kept aside)

Outside the tree on purpose: `agent.host.deadlines.ReadAbandoned` is a BaseException that
ends a worker thread stuck in a read, so that no `except Exception` on the way stops it.
"""

from __future__ import annotations

from typing import ClassVar

from proto.inventory import ReadError


class AgentError(Exception):
    """Base of every error the agent raises on purpose.

    `retryable` is a property of the class: a subclass that may succeed when tried again
    says so in its class line (`class X(AgentError, retryable=True)`).
    """

    retryable: ClassVar[bool] = False

    def __init_subclass__(cls, *, retryable: bool | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if retryable is not None:
            cls.retryable = retryable


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


class CollectionTimeout(ReadFailed, retryable=True):
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
