"""The policies in force for this aggregator process, and the errors of rejected versions.

Without a cluster they come from `--policy FILE`, re-read when its mtime or size changes;
an invalid edit keeps the last good policies and is reported (named field, logged once
per version). With a cluster they come from the Kubernetes watcher (`aggregator.kube.client`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from proto.policy import Policy, PolicyError, load_policies

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PolicySet:
    policies: tuple[Policy, ...] = ()
    errors: tuple[str, ...] = ()  # "source: document 0: $.spec.x: reason"; last good in force
    # Errors of one named policy (cluster objects); its last good version stays in force.
    policy_errors: Mapping[str, str] = field(default_factory=dict)
    version: int = 0  # increases whenever policies or errors change


class PolicySource(Protocol):
    changed: asyncio.Event  # set when current() may differ; the reader clears it

    def current(self) -> PolicySet: ...

    def refresh(self) -> bool: ...  # bring current() up to date now; True when it changed

    async def run(self, stop: asyncio.Event) -> None: ...


class FilePolicies:
    """`--policy FILE`, or a fixed tuple when no file is given."""

    def __init__(
        self,
        path: Path | None,
        initial: tuple[Policy, ...] = (),
        *,
        interval: float = 0.5,
    ) -> None:
        self._path = path
        self._interval = interval
        self._set = PolicySet(policies=initial, version=1)
        self._stamp: tuple[int, int] | None = None  # first check() re-reads the file
        self.changed = asyncio.Event()

    def current(self) -> PolicySet:
        return self._set

    async def run(self, stop: asyncio.Event) -> None:
        if self._path is None:
            await stop.wait()
            return
        while not stop.is_set():
            self.check()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._interval)

    def refresh(self) -> bool:
        return self.check() if self._path is not None else False

    def check(self) -> bool:
        """Re-read the file if it changed; True when the policy set changed."""
        assert self._path is not None
        stamp = _stamp(self._path)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            policies = load_policies(self._path.read_text(), source=str(self._path))
        except PolicyError as exc:
            return self._reject(str(exc))
        except (OSError, UnicodeDecodeError) as exc:
            return self._reject(f"{self._path}: $: cannot read: {exc}")
        if policies == self._set.policies and not self._set.errors:
            return False
        log.info("policy file %s: %d policies in force", self._path, len(policies))
        self._set = PolicySet(policies=policies, version=self._set.version + 1)
        self.changed.set()
        return True

    def _reject(self, error: str) -> bool:
        log.error("policy file not applied, the last good version stays in force: %s", error)
        self._set = PolicySet(
            policies=self._set.policies, errors=(error,), version=self._set.version + 1
        )
        self.changed.set()
        return True


class NamedError(Protocol):
    @property
    def name(self) -> str: ...


class ClusterPolicySource(Protocol):
    def policies(self) -> tuple[Policy, ...]: ...

    def policy_errors(self) -> Iterable[NamedError]: ...


class ClusterPolicies:
    """Policies from the Kubernetes watcher. An object that turns invalid keeps its last
    good version in force (and its error is reported); a deleted one is gone."""

    def __init__(self, watcher: ClusterPolicySource, *, interval: float = 0.5) -> None:
        self._watcher = watcher
        self._interval = interval
        self._set = PolicySet(version=0)
        self._last_good: dict[str, Policy] = {}
        self.changed = asyncio.Event()
        self.refresh()

    def current(self) -> PolicySet:
        return self._set

    def refresh(self) -> bool:
        valid = {p.metadata.name: p for p in self._watcher.policies()}
        errors = {e.name: str(e) for e in self._watcher.policy_errors()}
        for name in errors:
            if name in self._last_good and name not in valid:
                valid[name] = self._last_good[name]
        self._last_good = valid
        policies = tuple(valid[n] for n in sorted(valid))
        if policies == self._set.policies and errors == self._set.policy_errors:
            return False
        for name, error in errors.items():
            if self._set.policy_errors.get(name) != error:
                log.error("policy %s not applied, the last good version stays: %s", name, error)
        self._set = PolicySet(
            policies=policies, policy_errors=errors, version=self._set.version + 1
        )
        self.changed.set()
        return True

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.refresh()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._interval)


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size
