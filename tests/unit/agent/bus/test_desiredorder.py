"""RevisionGate: which desired-config updates an agent applies, as sequences of
(revision, path) and whether each was applied."""

from __future__ import annotations

import pytest

from agent.bus.desiredorder import RevisionGate, Via

A, N = Via.ANSWERED, Via.ANNOUNCED


@pytest.mark.parametrize(
    ("updates", "applied"),
    [
        pytest.param([(0, A)], [True], id="nothing-stored-first-answer"),
        pytest.param([(3, A), (4, N), (5, N)], [True, True, True], id="newer-each-time"),
        pytest.param([(6, N), (5, A)], [True, False], id="older-answer-after-newer-announcement"),
        pytest.param([(6, A), (5, N)], [True, False], id="older-announcement-after-newer-answer"),
        pytest.param([(6, N), (6, A), (6, N)], [True, False, False], id="same-entry-again"),
        pytest.param(
            [(9, N), (2, A), (2, A), (3, N)], [True, False, True, True], id="bucket-recreated"
        ),
        pytest.param([(9, N), (2, N), (2, N)], [True, False, False], id="announcements-never-heal"),
        pytest.param(
            [(9, N), (2, A), (9, A), (2, A)], [True, False, False, False], id="stale-reads-apart"
        ),
        pytest.param([(9, N), (2, A), (3, A)], [True, False, False], id="two-different-lower"),
    ],
)
def test_revision_gate(updates: list[tuple[int, Via]], applied: list[bool]) -> None:
    gate = RevisionGate()
    assert [gate.admit(revision, via) for revision, via in updates] == applied
