"""Which desired-config updates an agent applies, by KV revision (pure: no I/O, no clock).

Announcements and answers reach the agent on different paths (the writing replica's
publish, any replica's KV read), so an older entry can arrive after a newer one; only a
newer revision is applied. A lower revision answered twice in a row is taken as the truth:
the bucket was recreated (its revisions start again) or a bogus high revision got in.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Via(StrEnum):
    ANNOUNCED = "announced"  # published by the aggregator after a write
    ANSWERED = "answered"  # the answer to this agent's own request, read from KV


@dataclass
class RevisionGate:
    """Remembers the revision last applied; `admit` says whether an update is applied."""

    applied: int | None = None
    _lower: int | None = None  # a lower revision the last answer reported

    def admit(self, revision: int, via: Via) -> bool:
        if self.applied is None or revision > self.applied:
            self.applied, self._lower = revision, None
            return True
        if via is Via.ANNOUNCED:
            return False  # not newer; a later answer heals a recreated bucket
        if revision == self.applied:
            self._lower = None
            return False  # the same entry again
        if self._lower == revision:
            self.applied, self._lower = revision, None
            return True
        self._lower = revision
        return False
