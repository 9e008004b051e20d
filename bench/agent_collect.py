"""Benchmark: the agent's collection cost against node_exporter's, on the same lab trees.

Renders synthetic lab nodes of growing size and measures, medians of --runs: a full
snapshot, one counter cycle (read + rates + encode) alternating with one node_exporter
scrape of the same tree, and CPU per cycle at 1 s sampling. Feeds docs/performance.md;
never a test (shared machines are noisy). Run: .venv/bin/python bench/agent_collect.py
(`--smoke`: seconds; without node_exporter installed it leaves the baseline out and says so)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from exporter import BaselineUnavailable, NodeExporter, binary_version, find_binary

from agent.counters.rates import with_rates
from agent.counters.reader import CounterReader
from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from agent.lab.render import render
from agent.lab.synthetic import synthetic_spec
from proto import codec
from proto.inventory import NodeSnapshot
from proto.messages.counters import CounterBatch

NODE: Final = "bench-node"
AGENT_VERSION: Final = "bench"
MIN_RUNS: Final = 5
COUNTER_GROUPS: Final = ("counters", "counters_ext", "hw_counters")
# The targets (issue 3, "Performance").
TARGET_RATIO: Final = 0.5
TARGET_CPU_PERCENT: Final = 1.0
TARGET_SNAPSHOT_MS: Final = 50.0
# --smoke: the same path on one small tree (make test runs it; its numbers mean nothing).
SMOKE: Final = {"runs": 3, "adapters": "1,2", "cycles": 3}


@dataclass
class Tree:
    label: str
    root: Path
    adapters: int  # cards
    devices: int  # mlx5 RDMA devices: one per port (PCI function), as mlx5 does
    ports: int
    counter_files: int  # files under ports/*/{counters,counters_ext,hw_counters}, no lifespan


@dataclass
class Stat:
    median: float
    min: float
    max: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stat:
        return cls(statistics.median(samples), min(samples), max(samples))


@dataclass
class Result:
    tree: Tree
    agent: dict[str, Any] = field(default_factory=dict)
    node_exporter: dict[str, Any] = field(default_factory=dict)
    ratio_cycle_to_scrape: float | None = None  # wall-clock medians
    ratio_cpu_to_scrape_cpu: float | None = None  # CPU per cycle / node_exporter CPU per scrape
    targets_met: dict[str, bool] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


# --- trees -----------------------------------------------------------------------------


def count_counter_files(root: Path) -> int:
    total = 0
    for group in COUNTER_GROUPS:
        for path in root.glob(f"class/infiniband/*/ports/*/{group}/*"):
            total += path.name != "lifespan"
    return total


def render_trees(sizes: Sequence[int], ports_per_adapter: int, base: Path) -> list[Tree]:
    """One synthetic node per size: `size` ConnectX-7 cards of `ports_per_adapter` ports."""
    trees = []
    for size in sizes:
        spec = synthetic_spec(size, ports_per_adapter=ports_per_adapter)
        root = base / f"adapters-{size}"
        render(spec, root)
        ports = sum(len(adapter.ports) for adapter in spec.adapters)
        label = f"{size} x {ports_per_adapter}p"
        trees.append(Tree(label, root, size, len(spec.adapters), ports, count_counter_files(root)))
    return trees


# --- measuring -------------------------------------------------------------------------


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


class CounterLoop:
    """What the agent's counter loop does each tick: read, add rates, encode."""

    def __init__(self, reader: CounterReader) -> None:
        self.reader = reader
        self.previous: CounterBatch | None = None
        self.seq = 0

    def cycle(self) -> tuple[float, float, float]:
        """Seconds spent reading, computing rates and encoding, in that order."""
        self.seq += 1
        t0 = time.perf_counter()
        batch = self.reader.collect(node=NODE, seq=self.seq, now=time.time())
        t1 = time.perf_counter()
        batch = with_rates(self.previous, batch)
        t2 = time.perf_counter()
        codec.encode(batch)
        t3 = time.perf_counter()
        self.previous = batch
        return t1 - t0, t2 - t1, t3 - t2

    @property
    def values_read(self) -> int:
        """Counter values in the last batch (rx/tx bytes not counted: derived)."""
        ports = self.previous.ports if self.previous is not None else ()
        return sum(len(p.counters) + len(p.counters_ext) + len(p.hw_counters) for p in ports)

    def cpu_per_cycle(self, cycles: int) -> float:
        """Process CPU seconds per cycle over `cycles` back-to-back cycles."""
        start = time.process_time()
        for _ in range(cycles):
            self.cycle()
        return (time.process_time() - start) / cycles

    def paced_cpu_percent(self, seconds: int) -> float:
        """CPU % of one core over `seconds` real cycles, one per second."""
        start_cpu, start = time.process_time(), time.monotonic()
        for tick in range(1, seconds + 1):
            self.cycle()
            time.sleep(max(0.0, start + tick - time.monotonic()))
        return 100 * (time.process_time() - start_cpu) / (time.monotonic() - start)


def count_series(body: bytes) -> dict[str, int]:
    samples = [line for line in body.decode().splitlines() if line and not line.startswith("#")]
    return {
        "infiniband_series": sum(s.startswith("node_infiniband_") for s in samples),
        "netclass_series": sum(s.startswith("node_network_") for s in samples),
        "samples": len(samples),
        "bytes": len(body),
    }


def ms(stat: Stat) -> dict[str, float]:
    return {k: round(v * 1000, 3) for k, v in asdict(stat).items()}


def measure(tree: Tree, args: argparse.Namespace, binary: Path | None) -> Result:
    """Every measurement of one tree, node_exporter running beside the agent."""
    result = Result(tree)
    sysfs = Sysfs(tree.root)

    def snapshot() -> NodeSnapshot:
        return collect_snapshot(
            sysfs, node=NODE, seq=1, now=time.time(), agent_version=AGENT_VERSION
        )

    samples: dict[str, list[float]] = {}
    with ExitStack() as stack:
        loop = CounterLoop(stack.enter_context(CounterReader(sysfs)))
        loop.cycle()  # discovery and opening the files happen once, outside the hot loop
        loop.cycle()  # the first cycle that has a previous sample
        seen = snapshot()
        result.agent["snapshot_devices"] = len(seen.devices)
        result.agent["snapshot_errors"] = len(seen.errors) + sum(
            len(d.errors) for d in seen.devices
        )
        for _ in range(args.runs):
            samples.setdefault("snapshot", []).append(timed(snapshot))
        exporter = _start_baseline(stack, binary, tree, result)
        body = exporter.scrape() if exporter is not None else b""  # warm-up
        # Cycle and scrape alternate, so each runs right after the other as often and
        # machine drift hits both; the snapshot (every few minutes in the agent) is timed
        # on its own above, since whatever runs right after it pays for its cache misses.
        for _ in range(args.runs):
            read, rates, encode = loop.cycle()
            samples.setdefault("cycle", []).append(read + rates + encode)
            samples.setdefault("read", []).append(read)
            samples.setdefault("rates", []).append(rates)
            samples.setdefault("encode", []).append(encode)
            if exporter is not None:
                start = time.perf_counter()
                body = exporter.scrape()
                samples.setdefault("scrape", []).append(time.perf_counter() - start)
        if exporter is not None:
            cpu_start = exporter.cpu_seconds()
            for _ in range(args.cycles):
                exporter.scrape()
            cpu = (exporter.cpu_seconds() - cpu_start) / args.cycles
            result.node_exporter.update(
                scrape_ms=ms(Stat.of(samples["scrape"])),
                cpu_ms_per_scrape=round(cpu * 1000, 3),
                **count_series(body),
            )
        for name in ("snapshot", "cycle", "read", "rates", "encode"):
            result.agent[f"{name}_ms"] = ms(Stat.of(samples[name]))
        cpu = loop.cpu_per_cycle(args.cycles)
        result.agent["cpu_ms_per_cycle"] = round(cpu * 1000, 3)
        result.agent["cpu_percent_at_1s"] = round(cpu * 100, 3)
        result.agent["counter_values_read"] = loop.values_read
        if args.paced:
            result.agent["paced_cpu_percent"] = round(loop.paced_cpu_percent(args.paced), 3)
    _judge(result, samples)
    return result


def _start_baseline(
    stack: ExitStack, binary: Path | None, tree: Tree, result: Result
) -> NodeExporter | None:
    if binary is None:
        return None
    log = tree.root.parent / "node_exporter.log"
    try:
        return stack.enter_context(NodeExporter(binary, tree.root, log=log))
    except BaselineUnavailable as exc:
        result.errors.append(f"node_exporter: {exc}")
        return None


def _judge(result: Result, samples: dict[str, list[float]]) -> None:
    if "cycle" in samples and "scrape" in samples:
        ratio = statistics.median(samples["cycle"]) / statistics.median(samples["scrape"])
        result.ratio_cycle_to_scrape = round(ratio, 3)
        result.targets_met["cycle_le_half_scrape"] = ratio <= TARGET_RATIO
        ne_cpu = result.node_exporter.get("cpu_ms_per_scrape")
        if ne_cpu:
            result.ratio_cpu_to_scrape_cpu = round(result.agent["cpu_ms_per_cycle"] / ne_cpu, 3)
    if "cpu_percent_at_1s" in result.agent:
        met = result.agent["cpu_percent_at_1s"] < TARGET_CPU_PERCENT
        result.targets_met["cpu_below_1_percent"] = met
    if "snapshot" in samples:
        met = statistics.median(samples["snapshot"]) * 1000 < TARGET_SNAPSHOT_MS
        result.targets_met["snapshot_below_50ms"] = met


# --- report ----------------------------------------------------------------------------


def growth(results: Sequence[Result]) -> dict[str, dict[str, float]]:
    """Each median relative to the smallest tree's (1.0 = no growth)."""
    if len(results) < 2:
        return {}
    first = results[0]
    out: dict[str, dict[str, float]] = {}
    for result in results[1:]:
        factors = {"adapters": result.tree.adapters / first.tree.adapters}
        for side, key in (
            ("agent", "snapshot_ms"),
            ("agent", "cycle_ms"),
            ("agent", "cpu_ms_per_cycle"),
            ("node_exporter", "scrape_ms"),
            ("node_exporter", "cpu_ms_per_scrape"),
        ):
            base = _median(getattr(first, side).get(key))
            now = _median(getattr(result, side).get(key))
            if base and now is not None:
                factors[f"{side}.{key}"] = round(now / base, 2)
        out[result.tree.label] = factors
    return out


def _median(value: Any) -> float | None:
    if isinstance(value, dict):
        value = value.get("median")
    return float(value) if isinstance(value, int | float) else None


def machine(binary: Path | None) -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "node_exporter": binary_version(binary) if binary is not None else None,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def print_table(report: dict[str, Any], results: Sequence[Result]) -> None:
    head = (
        f"{'cards x ports':<14}{'ports':>6}{'values':>7}{'snapshot':>9}{'cycle':>8}{'read':>8}"
        f"{'rates':>7}{'scrape':>8}{'ratio':>7}{'cpu':>7}{'ne cpu':>8}{'cpu%@1s':>8}{'ne ib':>6}"
    )
    print(head)

    def cell(value: Any, width: int) -> str:
        return f"{value:>{width}.2f}" if isinstance(value, float) else f"{'-':>{width}}"

    for r in results:
        a, n = r.agent, r.node_exporter
        print(
            f"{r.tree.label:<14}{r.tree.ports:>6}{a.get('counter_values_read', 0):>7}"
            + cell(_median(a.get("snapshot_ms")), 9)
            + cell(_median(a.get("cycle_ms")), 8)
            + cell(_median(a.get("read_ms")), 8)
            + cell(_median(a.get("rates_ms")), 7)
            + cell(_median(n.get("scrape_ms")), 8)
            + cell(r.ratio_cycle_to_scrape, 7)
            + cell(a.get("cpu_ms_per_cycle"), 7)
            + cell(n.get("cpu_ms_per_scrape"), 8)
            + cell(a.get("cpu_percent_at_1s"), 8)
            + f"{n.get('infiniband_series', '-'):>6}"
        )
        for error in r.errors:
            print(f"  ! {error}")
    print(f"ms; wall times are medians of {report['runs']} runs, cpu is per cycle/scrape")
    for label, factors in report["growth"].items():
        print(f"growth to {label}: " + ", ".join(f"{k} x{v}" for k, v in factors.items()))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--runs", type=int, default=15, help=f"timed runs (>= {MIN_RUNS})")
    parser.add_argument("--adapters", default="2,16,64", help="tree sizes, comma-separated")
    parser.add_argument("--ports-per-adapter", type=int, default=2)
    parser.add_argument("--cycles", type=int, default=60, help="cycles for CPU time")
    parser.add_argument("--paced", type=int, default=0, help="also run N real 1 s cycles")
    parser.add_argument("--install", action="store_true", help="apt-get node_exporter")
    parser.add_argument("--no-baseline", action="store_true", help="skip node_exporter")
    parser.add_argument("--tmp", type=Path, default=None, help="where to render the trees")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run that checks the script still works, numbers meaningless "
        "(--runs 3 --adapters 1,2 --cycles 3; options given still win); a missing "
        "node_exporter is reported under `skipped`, not as an error",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    elif args.runs < MIN_RUNS:  # a smoke run's medians are not figures anyway
        parser.error(f"--runs must be at least {MIN_RUNS}")
    try:
        args.sizes = [int(part) for part in args.adapters.split(",") if part.strip()]
    except ValueError:
        parser.error(f"--adapters: expected comma-separated integers, got {args.adapters!r}")
    if not args.sizes or min(args.sizes) < 1:
        parser.error("--adapters: sizes must be positive")
    return args


def default_tmp() -> Path | None:
    # sysfs lives in memory; so should the tree both sides read, or disk caching skews it.
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    binary: Path | None = None
    errors: list[str] = []
    skipped: str | None = None
    if not args.no_baseline:
        try:
            binary = find_binary(install=args.install)
        except BaselineUnavailable as exc:
            if args.smoke:  # a smoke run checks the agent side; the baseline is optional
                skipped = f"node_exporter baseline: {exc}"
            else:
                errors.append(f"node_exporter: {exc}")
    tmp_base = args.tmp or default_tmp()
    with tempfile.TemporaryDirectory(prefix="nicfleet-bench-", dir=tmp_base) as tmp:
        trees = render_trees(args.sizes, args.ports_per_adapter, Path(tmp))
        results = [measure(tree, args, binary) for tree in trees]
        fs = _filesystem(Path(tmp))
    report: dict[str, Any] = {
        "machine": machine(binary) | {"tree_filesystem": fs},
        "runs": args.runs,
        "cpu_cycles": args.cycles,
        "ports_per_adapter": args.ports_per_adapter,
        "targets": {
            "cycle_to_scrape_ratio_max": TARGET_RATIO,
            "cpu_percent_at_1s_max": TARGET_CPU_PERCENT,
            "snapshot_ms_max": TARGET_SNAPSHOT_MS,
        },
        "results": [asdict(r) | {"tree": asdict(r.tree) | {"root": None}} for r in results],
        "growth": growth(results),
        "errors": errors,
    }
    if args.smoke:
        report["smoke"] = True
    if skipped is not None:
        report["skipped"] = skipped
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print_table(report, results)
        for error in errors:
            print(f"! {error}")
        if skipped is not None:
            print(f"skipped: {skipped}")
    return 1 if errors or any(r.errors for r in results) else 0


def _filesystem(path: Path) -> str:
    best, kind = "", "unknown"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            _, mount, fstype, *_ = line.split()
            if str(path).startswith(mount) and len(mount) > len(best):
                best, kind = mount, fstype
    except OSError:
        pass
    return kind


if __name__ == "__main__":
    sys.exit(main())
