"""The figures and verdict of bench/ingest_scale.py (issue 8), pure: samples, the bare
subscriber's lines and the load generator's result in; msgs/s, lag, alert latency,
"sustained", the capacity over the node counts tried and the table row out.

A library, not a script: `bench/ingest_scale.py --smoke` runs it (make test).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any, Final

from scale_probes import pct

LAG_GROWTH_LIMIT_S: Final = 0.5  # lag end - lag start above this: not sustained
ALERT_P99_LIMIT_S: Final = 1.0
GENERATOR_LATE_LIMIT_MS: Final = 250.0


MEDIAN_KEYS: Final = (
    "aggregator_msgs_s",
    "bare_msgs_s",
    "ratio_aggregator_to_bare",
    "rss_per_node_kb",
    "aggregator_cpu_pct",
    "bare_cpu_pct",
)
BARE_KEYS: Final = (
    "bare_msgs_s",
    "bare_cpu_pct",
    "bare_lag_start_s",
    "bare_lag_end_s",
    "bare_lost",
    "bare_nats_errors",
)


def analyse(
    rows: list[dict[str, Any]],
    load: dict[str, Any],
    final: dict[str, float],
    bare_lines: list[dict[str, Any]] | None,
    alerts: dict[str, float],
    t0: float,
    args: argparse.Namespace,
) -> dict[str, Any]:
    start, end = t0 + args.warmup, t0 + args.duration
    out: dict[str, Any] = {"window_s": None, "published": load["counters"]}
    # A generator that cannot keep its schedule does not offer the load it claims.
    out["generator_kept_up"] = load["late_ms_p99_worst"] < GENERATOR_LATE_LIMIT_MS
    if bare_lines is not None:
        out.update(analyse_bare(bare_lines, rows, load["counters"], start, end))
    if final or any("applied" in r for r in rows):
        out.update(analyse_aggregator(rows, load, final, alerts, start, end, args))
    if out.get("bare_msgs_s") and out.get("aggregator_msgs_s") is not None:
        out["ratio_aggregator_to_bare"] = round(out["aggregator_msgs_s"] / out["bare_msgs_s"], 2)
    return out


def analyse_bare(
    bare_lines: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    sent: int,
    start: float,
    end: float,
) -> dict[str, Any]:
    """The bare subscriber's own lines, so the aggregator's API stalls do not narrow it."""
    out: dict[str, Any] = {}
    cpu = [r for r in rows if start <= r["t"] <= end and r.get("bare_cpu_s") is not None]
    if len(cpu) >= 2:
        dt = cpu[-1]["t"] - cpu[0]["t"]
        out["bare_cpu_pct"] = round(100 * (cpu[-1]["bare_cpu_s"] - cpu[0]["bare_cpu_s"]) / dt)
    lines = [x for x in bare_lines if "t" in x and start <= x["t"] <= end]
    if len(lines) >= 2:
        counted = lines[-1]["counts"]["counters"] - lines[0]["counts"]["counters"]
        out["bare_msgs_s"] = round(counted / (lines[-1]["t"] - lines[0]["t"]))
    bare_lags = [x["lag_p50_s"] for x in lines if x.get("lag_p50_s") is not None]
    out["bare_lag_start_s"] = bare_lags[0] if bare_lags else None
    out["bare_lag_end_s"] = bare_lags[-1] if bare_lags else None
    last = bare_lines[-1] if bare_lines else None
    out["bare_lost"] = sent - (last["counts"]["counters"] if last else 0)
    out["bare_nats_errors"] = last["errors"]["nats"] if last else None
    return out


def analyse_aggregator(
    rows: list[dict[str, Any]],
    load: dict[str, Any],
    final: dict[str, float],
    alerts: dict[str, float],
    start: float,
    end: float,
    args: argparse.Namespace,
) -> dict[str, Any]:
    window = [r for r in rows if start <= r["t"] <= end and "applied" in r]
    out: dict[str, Any] = {}
    if len(window) >= 2:
        a, b = window[0], window[-1]
        dt = b["t"] - a["t"]
        out["window_s"] = round(dt, 1)
        out["aggregator_msgs_s"] = round((b["applied"] - a["applied"]) / dt)
        out["aggregator_cpu_pct"] = round(100 * (b["cpu_s"] - a["cpu_s"]) / dt)
        if a.get("rule_cycles") is not None and b.get("rule_cycles") is not None:
            out["rule_cycles_s"] = round((b["rule_cycles"] - a["rule_cycles"]) / dt, 1)
        out["findings_end"] = b.get("findings")
        out["alerts_firing_end"] = b.get("alerts_firing")
        for key, name in (("lag_s", "lag"), ("age_s", "age")):
            head = [x for r in window[:3] for x in r.get(key, [])]
            tail = [x for r in window[-3:] for x in r.get(key, [])]
            out[f"{name}_start_s"] = round(statistics.median(head), 3) if head else None
            out[f"{name}_end_s"] = round(statistics.median(tail), 3) if tail else None
    out["window_rows"] = len(window)  # fewer than the seconds: the API stalled
    sent = load["counters"]
    out["aggregator_applied_total"] = final.get("messages:counters", 0)
    out["aggregator_lost"] = sent - out["aggregator_applied_total"]
    latencies = [alerts[node] - at for node, at in load["events"] if node in alerts]
    out["alerts"] = {
        "injected": len(load["events"]),
        "seen": len(latencies),
        "p50_ms": _ms(pct(latencies, 0.5)),
        "p99_ms": _ms(pct(latencies, 0.99)),
    }
    lag_ok = all(
        out.get(k) is not None for k in ("lag_start_s", "lag_end_s", "age_start_s", "age_end_s")
    )
    lag_ok = lag_ok and out["lag_end_s"] - out["lag_start_s"] < LAG_GROWTH_LIMIT_S
    lag_ok = lag_ok and out["age_end_s"] - out["age_start_s"] < LAG_GROWTH_LIMIT_S
    alert_p99 = out["alerts"]["p99_ms"]
    out["sustained"] = bool(
        lag_ok
        and load["late_ms_p99_worst"] < GENERATOR_LATE_LIMIT_MS
        and out.get("aggregator_msgs_s", 0) >= 0.95 * load["nodes"] * args.hz
        and out["aggregator_lost"] <= 0.01 * sent
        and out["alerts"]["seen"] == out["alerts"]["injected"]
        and (alert_p99 is None or alert_p99 < ALERT_P99_LIMIT_S * 1000)
    )
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def capacity(points: list[dict[str, Any]], hz: float) -> dict[str, Any]:
    """The largest node count sustained among those tried (at `hz`), and the smallest that
    was not: the capacity lies between them."""
    ok = [p["nodes"] for p in points if p["sustained"]]
    broken = [p["nodes"] for p in points if not p["sustained"]]
    best = max(ok) if ok else None
    return {
        "hz": hz,
        "tried": [p["nodes"] for p in points],
        "largest_sustained_nodes": best,
        "largest_sustained_msgs_s": None if best is None else round(best * hz),
        "smallest_broken_nodes": min(broken) if broken else None,
    }


HEADER: Final = (
    f"{'nodes':>6} {'offered':>8} {'agg/s':>7} {'bare/s':>7} {'ratio':>5} "
    f"{'lag0':>6} {'lag1':>6} {'age0':>6} {'age1':>6} {'bare0':>6} {'bare1':>6} "
    f"{'alert50':>8} {'alert99':>8} {'seen':>5} {'aggCPU':>6} {'KB/node':>7} {'lost':>7} "
    f"{'slowC':>5} {'slowS':>5} {'snaps':>6} {'genLate':>7} {'bLate':>6} {'genCPU':>6} ok"
)


def row_text(p: dict[str, Any]) -> str:
    def f(v: Any, w: int) -> str:
        return f"{'-' if v is None else v:>{w}}"

    al = p["alerts"]
    return " ".join(
        [
            f(p["nodes"], 6),
            f(p["offered_msgs_s"], 8),
            f(p.get("aggregator_msgs_s"), 7),
            f(p.get("bare_msgs_s"), 7),
            f(p.get("ratio_aggregator_to_bare"), 5),
            f(p.get("lag_start_s"), 6),
            f(p.get("lag_end_s"), 6),
            f(p.get("age_start_s"), 6),
            f(p.get("age_end_s"), 6),
            f(p.get("bare_lag_start_s"), 6),
            f(p.get("bare_lag_end_s"), 6),
            f(al["p50_ms"], 8),
            f(al["p99_ms"], 8),
            f(f"{al['seen']}/{al['injected']}", 5),
            f(p.get("aggregator_cpu_pct"), 6),
            f(p.get("rss_per_node_kb"), 7),
            f(p.get("aggregator_lost"), 7),
            f(p.get("nats_after", {}).get("slow_consumers"), 5),
            f(p.get("slow_consumers_after_snapshots"), 5),
            f(p.get("snapshots_applied"), 6),
            f(p["load"]["late_ms_p99_worst"], 7),
            f(p.get("bare_phase", {}).get("generator_late_ms_p99"), 6),
            f(p["load"].get("cpu_ms_per_1000_msgs"), 6),
            "yes" if p["sustained"] else "NO",
        ]
    )
