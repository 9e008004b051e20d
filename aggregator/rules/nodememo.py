"""Per-node memo for facts several rules (or several evaluations) derive from one record
part: the value is reused while the part is the same object (records are immutable, so
the same object means the same value). One entry per node name: bounded by the fleet.

Pure in effect: the answers are those of `compute`; only repeated work is skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Final, Generic, TypeVar

V = TypeVar("V")
LIMIT: Final = 1 << 16  # node names remembered; beyond, all are forgotten (removed nodes)


class NodeMemo(Generic[V]):
    def __init__(self) -> None:
        self._last: dict[str, tuple[object, Hashable, V]] = {}

    def get(self, node: str, source: object, variant: Hashable, compute: Callable[[], V]) -> V:
        """`compute()`, unless it ran last for this node on this very `source` object
        and an equal `variant` (the other inputs it depends on)."""
        hit = self._last.get(node)
        if hit is not None and hit[0] is source and hit[1] == variant:
            return hit[2]
        value = compute()
        if len(self._last) >= LIMIT:
            self._last.clear()
        self._last[node] = (source, variant, value)
        return value
