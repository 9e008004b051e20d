"""The issue-8 load generator's messages are what real agents send (they decode with the
real codec, 16 ports, rates present), and the harness's pure helpers (port-down spread,
py-spy summary) count what they should. No timing is asserted here."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from loadgen import NodeShape, build_templates, node_name, spread_port_downs  # noqa: E402
from scale_probes import summarize_profile  # noqa: E402

from proto import subjects  # noqa: E402
from proto.codec import decode  # noqa: E402
from proto.inventory import NodeSnapshot  # noqa: E402
from proto.messages import CounterBatch  # noqa: E402


def test_templates_are_real_agent_messages() -> None:
    tpl = build_templates(NodeShape())
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
        "_run_once (asyncio/base_events.py:1922);handle (aggregator/ingest.py:55);"
        "decode (proto/codec.py:66) 3\n"
        "_run_once (asyncio/base_events.py:1922);cycle (aggregator/alerts/engine.py:170) 1\n"
        "garbage line\n"
    )
    summary = summarize_profile(raw)
    assert summary["samples"] == 4
    assert summary["self"][0] == {"function": "decode (proto/codec.py)", "pct": 75.0}
    inclusive = {e["function"]: e["pct"] for e in summary["inclusive"]}
    assert inclusive["handle (aggregator/ingest.py)"] == 75.0
    assert inclusive["cycle (alerts/engine.py)"] == 25.0
    assert not any("asyncio/" in name for name in inclusive)
