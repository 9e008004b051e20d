"""Plot how the aggregator's costs grow with the fleet (issue 8): docs/performance-growth.png.

Reads the `--json` results under bench/results/ (restart, memory, fan-out; ingest and API
latency when their files exist) and draws one panel per figure against the node count,
with the issue's targets as dashed lines. Run: .venv/bin/python bench/plot_growth.py
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

REPO: Final = Path(__file__).resolve().parents[1]
RESULTS: Final = REPO / "bench" / "results"
Series = dict[str, list[tuple[int, float]]]


def load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def restart(doc: Any) -> Series:
    out: Series = {}
    for size in doc["sizes"]:
        for key, label in (("time_to_ready_s", "wall"), ("cpu_to_ready_s", "CPU")):
            for variant, stats in size.get(key, {}).items():
                out.setdefault(f"{label}, {variant}", []).append((size["nodes"], stats["median"]))
    return out


def memory(doc: Any) -> Series:
    out: Series = {}
    for label, part in (("RSS growth per node", doc), ("after (see doc)", doc.get("after", {}))):
        points = [(p["nodes"], p["per_node_kb"]["median"]) for p in part.get("process", [])]
        if points:
            out[label] = points
    return out


def fanout(doc: Any) -> Series:
    out: Series = {}
    for size in doc["sizes"]:
        out.setdefault("p50", []).append((size["agents"], size["median_p50_s"]))
        out.setdefault("p99", []).append((size["agents"], size["median_p99_s"]))
    return out


def ingest(doc: Any) -> Series:
    out: Series = {}
    for point in doc.get("points", []):
        for key in ("aggregator_msgs_s", "bare_msgs_s"):
            value = point.get(key)
            if isinstance(value, dict):
                value = value.get("median")
            if isinstance(value, int | float):
                out.setdefault(key.replace("_msgs_s", " msgs/s"), []).append(
                    (point["nodes"], value)
                )
    return out


def _p99_points(
    doc: Any, path: str = "", nodes: int | None = None
) -> Iterator[tuple[str, int, float]]:
    """Every numeric `*p99*` value under a dict that says `nodes`, named by its path."""
    if isinstance(doc, dict):
        here = doc.get("nodes")
        nodes = here if isinstance(here, int) else nodes
        for key, value in doc.items():
            if nodes is not None and "p99" in key and isinstance(value, int | float):
                yield (path or key), nodes, float(value)
            else:
                yield from _p99_points(value, f"{path}.{key}".strip(".") if path else key, nodes)
    elif isinstance(doc, list):
        for item in doc:
            yield from _p99_points(item, path, nodes)


def api(doc: Any) -> Series:
    """p99 of the paged endpoints, one client at a time (not the whole-list "before")."""
    out: Series = {}
    for name, nodes, value in _p99_points(doc):
        if name.endswith(".sequential") and ".before" not in name and "latency." in name:
            label = name.split("latency.", 1)[1].removesuffix(".sequential")
            out.setdefault(label, []).append((nodes, value))
    return out


def panel(ax: Axes, title: str, unit: str, series: Series, target: float | None) -> None:
    for name, points in series.items():
        points = sorted(points)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    if target is not None:
        ax.axhline(target, color="red", linestyle="--", linewidth=1, label=f"target {target}")
    ax.set_xscale("log")
    ax.set_xticks([1000, 3000, 10000], ["1k", "3k", "10k"])
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("nodes")
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "performance-growth.png")
    parser.add_argument("--json", action="store_true", help="print {out, bytes, panels} as JSON")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="draw the same figure into a temporary directory (never over docs/), "
        "print what was drawn, remove it; --out is ignored",
    )
    opts = parser.parse_args()
    if opts.smoke:
        with tempfile.TemporaryDirectory(prefix="nicfleet-plot-") as tmp:
            draw(opts.results, Path(tmp) / "performance-growth.png", opts.json, smoke=True)
        return
    draw(opts.results, opts.out, opts.json, smoke=False)


def draw(results: Path, out: Path, as_json: bool, *, smoke: bool) -> None:
    figures = [
        ("aggregator_restart.json", "Restart: cold start until ready", "s", restart, 10.0),
        ("memory_scale.json", "Memory: aggregator RSS per node", "KiB", memory, 50.0),
        ("policy_fanout.json", "Fan-out: config change to all applied", "s", fanout, 2.0),
        ("ingest_scale.json", "Ingest: counter batches applied", "msgs/s", ingest, None),
        ("api_latency.json", "API p99, paged, sequential", "ms", api, None),
    ]
    panels = []
    for name, title, unit, read, target in figures:
        doc = load(results / name)
        series = read(doc) if doc is not None else {}
        if any(series.values()):
            panels.append((title, unit, series, target))
    if not panels:
        raise SystemExit(f"no results under {results}")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (title, unit, series, target) in zip(axes[0], panels, strict=True):
        panel(ax, title, unit, series, target)
    fig.suptitle(
        "nicfleet aggregator at 1k / 3k / 10k nodes (2-core machine)",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    if not as_json:
        print(f"wrote {out} ({len(panels)} panels)")
        return
    doc: dict[str, Any] = {
        "out": str(out),
        "bytes": out.stat().st_size,
        "panels": [title for title, _, _, _ in panels],
    }
    if smoke:
        doc["smoke"] = True  # `out` was a temporary file, removed since
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
