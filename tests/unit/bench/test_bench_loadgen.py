"""The issue-8 load generator's messages are what real agents send (they decode with the
real codec, 16 ports, rates present; spliced messages equal the whole-Struct encode byte for
byte), and the pure helpers (schedule, lateness, port-down spread, py-spy summary, capacity)
count what they should. No timing is asserted here."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tests.support.paths import REPO

BENCH = REPO / "bench"
sys.path.insert(0, str(BENCH))

import msgspec  # noqa: E402
import pytest  # noqa: E402
from ingest_verdict import analyse, capacity  # noqa: E402
from loadgen import (  # noqa: E402
    BUSY,
    CounterStream,
    NodeShape,
    Spliced,
    Templates,
    build_templates,
    burst_end,
    is_full_round,
    lateness_summary,
    node_name,
    phase_offsets,
    spread_port_downs,
)
from scale_probes import summarize_profile  # noqa: E402

from proto import codec, subjects  # noqa: E402
from proto.codec import decode  # noqa: E402
from proto.inventory import NodeSnapshot  # noqa: E402
from proto.messages.counters import CounterBatch  # noqa: E402
from proto.messages.events import LinkEvent  # noqa: E402
from proto.packedcounters import pack  # noqa: E402

_TEMPLATES = build_templates(NodeShape())


def test_templates_are_real_agent_messages() -> None:
    tpl = _TEMPLATES
    snap = decode(tpl.snapshot, NodeSnapshot)
    batch = decode(tpl.counters, CounterBatch)
    assert sum(len(d.ports) for d in snap.devices) == 16
    assert len(batch.ports) == 16
    assert all(p.counters and p.hw_counters for p in batch.ports)
    assert any(p.rates for p in batch.ports)
    assert tpl.device == snap.devices[0].name


def test_node_names_are_valid_subject_tokens() -> None:
    assert subjects.node_subject(node_name("sim", 7), subjects.COUNTERS) == (
        "nicfleet.v1.node.sim-00007.counters"
    )


def test_port_downs_hit_distinct_nodes_within_the_window() -> None:
    downs = spread_port_downs(1000, 10, 5.0, 17.0)
    assert len(downs) == 10
    assert len({node for node, _ in downs}) == 10
    assert all(0 <= node < 1000 for node, _ in downs)
    assert [t for _, t in downs] == sorted(t for _, t in downs)
    assert downs[0][1] == 5.0 and downs[-1][1] == 17.0


def test_port_downs_never_exceed_the_node_count() -> None:
    assert len(spread_port_downs(3, 10, 1.0, 2.0)) == 3
    assert spread_port_downs(10, 0, 1.0, 2.0) == ()


def test_profile_summary_counts_self_and_inclusive(tmp_path: Path) -> None:
    raw = tmp_path / "profile.txt"
    raw.write_text(
        "_run_once (asyncio/base_events.py:1922);handle (aggregator/fleet/ingest.py:55);"
        "decode (proto/codec.py:66) 3\n"
        "_run_once (asyncio/base_events.py:1922);cycle (aggregator/alerts/engine.py:170) 1\n"
        "garbage line\n"
    )
    summary = summarize_profile(raw)
    assert summary["samples"] == 4
    assert summary["self"][0] == {"function": "decode (proto/codec.py)", "pct": 75.0}
    inclusive = {e["function"]: e["pct"] for e in summary["inclusive"]}
    assert inclusive["handle (aggregator/fleet/ingest.py)"] == 75.0
    assert inclusive["cycle (aggregator/alerts/engine.py)"] == 25.0
    assert not any("asyncio/" in name for name in inclusive)


def _slow_path(tpl: Templates, encoding: str, base_seq: int | None) -> bytes:
    """What the generator sent before splicing: replace fields of the whole Struct, encode."""
    message = decode(tpl.counters if base_seq is None else tpl.delta, CounterBatch)
    template: msgspec.Struct
    if encoding == "packed":
        template, encode_ = pack(message), codec.encode
    else:
        template, encode_ = message, codec.encode_map
    return encode_(
        msgspec.structs.replace(
            template,
            node="sim-00042",
            seq=77,
            collected_at=1_790_000_000.25,
            interval_s=1.0,
            base_seq=base_seq,
        )
    )


@pytest.mark.parametrize(
    ("encoding", "base_seq"),
    [("packed", None), ("map", None), ("packed", 61), ("map", 61)],
    ids=["full-packed", "full-map", "delta-in-packed-run", "delta-in-map-run"],
)
def test_spliced_messages_equal_the_slow_path(encoding: str, base_seq: int | None) -> None:
    tpl = _TEMPLATES
    stream = CounterStream(tpl, encoding)
    spliced = stream.message("sim-00042", 77, 1_790_000_000.25, 1.0, base_seq)
    slow = _slow_path(tpl, encoding, base_seq)
    assert decode(spliced, CounterBatch) == decode(slow, CounterBatch)
    assert spliced == slow  # byte for byte: the aggregator sees exactly the same wire
    got = decode(spliced, CounterBatch)
    assert (got.node, got.seq, got.collected_at, got.base_seq) == (
        "sim-00042",
        77,
        1_790_000_000.25,
        base_seq,
    )
    assert (spliced[0] in range(0x90, 0xA0)) == (encoding == "packed")


def test_a_delta_carries_busy_ports_only_as_changes() -> None:
    delta = decode(CounterStream(_TEMPLATES, "packed").message("n", 3, 5.0, 1.0, 2), CounterBatch)
    assert delta.base_seq == 2 and len(delta.ports) == 16
    assert all(set(p.counters) <= set(BUSY) for p in delta.ports)


def test_splicing_needs_every_varying_field() -> None:
    with pytest.raises(ValueError, match="lacks"):
        Spliced(LinkEvent(node="n", seq=1, kind="port-state", observed_at=1.0))


def test_phases_spread_over_the_interval_in_node_order() -> None:
    mine = list(range(1, 10, 2))  # worker 1 of 2, 10 nodes
    offsets = phase_offsets(mine, 10, 2.0)
    assert offsets == [0.2, 0.6, 1.0, 1.4, 1.8]
    assert offsets == sorted(offsets)


def test_a_burst_takes_every_node_due_by_the_horizon() -> None:
    offsets = [0.0, 0.1, 0.2, 0.3]
    assert burst_end(offsets, 0, 100.0, 100.0) == 1  # due exactly now: in
    assert burst_end(offsets, 1, 100.0, 100.15) == 2
    assert burst_end(offsets, 2, 100.0, 100.15) == 2  # nothing due yet: empty burst
    assert burst_end(offsets, 0, 100.0, 200.0) == 4  # far behind: everything left


def test_lateness_summary_in_ms() -> None:
    late = [0.0] * 98 + [0.1, 0.3]
    assert lateness_summary(late) == {"p50": 0.0, "p99": 100.0, "max": 300.0}
    assert lateness_summary([]) == {}


def test_full_batches_are_spread_over_the_nodes() -> None:
    assert all(is_full_round(0, node, 30) for node in range(100))
    fulls = [node for node in range(60) if is_full_round(7, node, 30)]
    assert fulls == [23, 53]
    assert all(is_full_round(t, 5, 1) for t in range(5))  # --full-every 1: no deltas


def test_capacity_is_the_largest_node_count_sustained() -> None:
    points = [
        {"nodes": 1000, "sustained": True},
        {"nodes": 3000, "sustained": True},
        {"nodes": 10000, "sustained": False},
    ]
    assert capacity(points, 1.0) == {
        "hz": 1.0,
        "tried": [1000, 3000, 10000],
        "largest_sustained_nodes": 3000,
        "largest_sustained_msgs_s": 3000,
        "smallest_broken_nodes": 10000,
    }
    assert capacity([{"nodes": 100, "sustained": False}], 2.0)["largest_sustained_nodes"] is None


def _load(nodes: int, sent: int, late_ms: float = 3.0) -> dict[str, Any]:
    return {"nodes": nodes, "counters": sent, "late_ms_p99_worst": late_ms, "events": []}


def test_a_bare_only_run_gives_bare_figures_and_no_verdict() -> None:
    args = argparse.Namespace(warmup=2.0, duration=10.0, hz=1.0)
    lines = [
        {"t": 100.0 + s, "counts": {"counters": 100 * s}, "errors": {"nats": 0}, "lag_p50_s": 0.01}
        for s in range(11)
    ]
    rows = [{"t": 100.0 + s, "bare_cpu_s": 0.2 * s} for s in range(11)]
    out = analyse(rows, _load(100, 1000), {}, lines, {}, 100.0, args)
    assert out["bare_msgs_s"] == 100 and out["bare_cpu_pct"] == 20 and out["bare_lost"] == 0
    assert out["generator_kept_up"] and "sustained" not in out and "alerts" not in out


def test_an_aggregator_only_run_is_judged_on_its_own() -> None:
    args = argparse.Namespace(warmup=2.0, duration=10.0, hz=1.0)
    rows = [
        {"t": 100.0 + s, "applied": 100 * s, "cpu_s": 0.5 * s, "lag_s": [0.01], "age_s": [0.5]}
        for s in range(11)
    ]
    final = {"messages:counters": 1000.0}
    out = analyse(rows, _load(100, 1000), final, None, {}, 100.0, args)
    assert out["aggregator_msgs_s"] == 100 and out["aggregator_cpu_pct"] == 50
    assert out["sustained"] and out["aggregator_lost"] == 0 and "bare_msgs_s" not in out
    late = analyse(rows, _load(100, 1000, late_ms=900.0), final, None, {}, 100.0, args)
    assert not late["sustained"] and not late["generator_kept_up"]
