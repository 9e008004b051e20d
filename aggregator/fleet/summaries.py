"""Node summaries for the paged `/api/v1/nodes`, summarized once per snapshot.

`views.summarize` walks every device and port (~10 µs for a 12-NIC node); only the
snapshot feeds that part, so it is kept per node until the record holds another snapshot
object, and the parts that move with every message and the clock (state, last_seen,
age_s) are filled per call. Pure: no I/O, `now` passed in.
"""

from __future__ import annotations

from collections.abc import Collection

import msgspec

from aggregator.fleet.state import NodeRecord
from aggregator.fleet.views import node_state, summarize
from proto.http import NodeSummary
from proto.inventory import NodeSnapshot


class SummaryCache:
    def __init__(self) -> None:
        self._by_name: dict[str, tuple[NodeSnapshot | None, NodeSummary]] = {}

    def summary(self, record: NodeRecord, now: float, stale_after: float) -> NodeSummary:
        """Equal to `summarize(record, now, stale_after)`."""
        held = self._by_name.get(record.name)
        if held is None or held[0] is not record.snapshot:
            fresh = summarize(record, now, stale_after)
            self._by_name[record.name] = (record.snapshot, fresh)
            return fresh
        return msgspec.structs.replace(
            held[1],
            state=node_state(record, now, stale_after),
            last_seen=record.last_seen,
            age_s=max(0.0, now - record.last_seen),
        )

    def retain(self, names: Collection[str]) -> None:
        """Forget nodes no longer in `names` once they are a fair share of what is held."""
        if len(self._by_name) > 2 * len(names) + 100:
            self._by_name = {n: held for n, held in self._by_name.items() if n in names}

    def __len__(self) -> int:
        return len(self._by_name)
