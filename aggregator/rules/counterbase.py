"""Whether two records' counter batches agree on some counter/rate keys, from the delta
bookkeeping alone (`NodeRecord.counters_base_seq` / `counters_delta`), without reading them.

Pure. Unknown bookkeeping (None) or a new full batch answers False: compare the values.
"""

from __future__ import annotations

from aggregator.fleet import NodeRecord


def base_of(record: NodeRecord) -> tuple[int, frozenset[str]] | None:
    """(base seq, delta keys) of a merged delta, or None (a full batch, unknown, none)."""
    held, base, delta = record.counters_held, record.counters_base_seq, record.counters_delta
    if held is None or base is None or delta is None or held.seq == base:
        return None
    return base, delta


def same_counter_inputs(old: NodeRecord | None, new: NodeRecord, keys: frozenset[str]) -> bool:
    """True when every port of both counter batches has the same values under `keys` (the
    port list of a merged delta is its base's): both derive from the same full batch, and
    neither delta changed one of `keys`. A full batch that is not the very same object
    answers False (an agent restarted with the same seq would be another base)."""
    if old is None:
        return False
    if old.counters_held is new.counters_held:
        return True
    merged = base_of(new)
    if merged is None:
        return False
    base, delta = merged
    if old.counters_held is None or old.counters_base_seq != base or old.counters_delta is None:
        return False
    return delta.isdisjoint(keys) and old.counters_delta.isdisjoint(keys)
