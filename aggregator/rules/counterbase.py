"""Whether two records' counter batches agree on some counter/rate keys, and whether a
record has a positive rate under some keys, from the delta bookkeeping alone
(`NodeRecord.counters_base_seq` / `counters_delta`, `CounterBase.moving`), without reading
the batches.

Pure. Unknown bookkeeping (None) or a new full batch answers False: compare the values.
"""

from __future__ import annotations

from aggregator.fleet.state import NodeRecord


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


def quiet(record: NodeRecord, keys: frozenset[str]) -> bool:
    """True when no port's rate under `keys` is > 0 — known from the ingest's facts of
    the delta base and the delta's keys, without reading (merging) the batch. Rules that
    fire only on such a rate above a limit >= 0 find nothing on a quiet record. False:
    not known; read the batch."""
    held = record.counters_held
    if held is None:
        return True
    moving = held.base.moving
    if moving is None or not moving.isdisjoint(keys):
        return False
    if held.is_full:
        return True
    delta = record.counters_delta  # set only for a delta of new values alone
    return delta is not None and delta.isdisjoint(keys)
