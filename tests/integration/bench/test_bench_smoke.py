"""Every bench script still runs: `bench/X.py --smoke` (tiny sizes, seconds, the real code
path) exits 0 and prints the JSON document its docs describe. Shape only: no value and no
timing is asserted (bench/ owns the numbers). A bench script with a `__main__` block but
no `--smoke` fails here, so a figure in docs/performance.md cannot silently stop
reproducing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.integration

BENCH: Final = REPO / "bench"
RUN_TIMEOUT_S: Final = 120.0
HELP_TIMEOUT_S: Final = 60.0
MAIN_GUARD: Final = re.compile(r"""^if __name__ == ["']__main__["']:""", re.MULTILINE)

# Top-level keys of each script's smoke document (keys that exist only sometimes, such as
# agent_collect's `skipped` when node_exporter is missing, are left out). A script without
# an entry is only checked to print a non-empty JSON object: add its keys here.
EXPECTED_KEYS: Final[dict[str, frozenset[str]]] = {
    "loop_stall": frozenset({"results", "smoke"}),
    "rules_evaluate": frozenset({"results", "smoke"}),
    "memory_scale": frozenset(
        {"benchmark", "lab", "messages", "process", "where", "machine", "smoke"}
    ),
    "nats_restart": frozenset({"benchmark", "runs", "recovery_s", "smoke"}),
    "plot_growth": frozenset({"out", "bytes", "panels", "smoke"}),
    "policy_fanout": frozenset({"agents", "changes", "median_p50_s", "median_p99_s", "smoke"}),
    "resync": frozenset(
        {"benchmark", "runs", "jitter_s", "restart_converge_s", "cut_converge_s", "smoke"}
    ),
    "shard_scale": frozenset({"benchmark", "partitions", "rows", "max_sustained_nodes", "smoke"}),
    "shard_takeover": frozenset(
        {"benchmark", "replicas", "partitions", "nodes", "takeover_s", "median_s", "smoke"}
    ),
    "bare_subscriber": frozenset({"t", "counts", "errors", "smoke"}),
    "alert_latency": frozenset({"machine", "runs", "nicfleet", "netns", "smoke"}),
    "loadgen": frozenset(
        {"nodes", "processes", "snapshots", "counters", "events", "errors", "smoke"}
    ),
    "agent_bytes": frozenset(
        {
            "spec",
            "ports",
            "busy_ports",
            "rounds",
            "full_every",
            "runs",
            "counters_bytes_per_s_before",
            "counters_bytes_per_s_after",
            "ratio_after_to_before",
            "snapshot_bytes",
            "details",
            "varz_in_bytes_per_s_before",  # smoke runs with --nats
            "varz_in_bytes_per_s_after",
            "smoke",
        }
    ),
    "agent_collect": frozenset(
        {"machine", "runs", "cpu_cycles", "targets", "results", "growth", "errors", "smoke"}
    ),
    "agent_restart": frozenset({"benchmark", "runs", "registered_s", "fleet_updated_s", "smoke"}),
    "aggregator_restart": frozenset({"benchmark", "target_s", "sizes", "machine", "smoke"}),
    "api_latency": frozenset({"benchmark", "concurrency", "sizes", "machine", "smoke"}),
    "codec_counters": frozenset(
        {"ports", "full_map", "delta_map", "ingest_full_map_us", "ingest_delta_map_us", "smoke"}
    ),
    "deviceplugin_latency": frozenset({"machine", "fault", "allocate", "restart", "smoke"}),
    "dra_latency": frozenset({"machine", "prepare", "writes", "fault", "slices", "smoke"}),
    "ingest_scale": frozenset(
        {"tree", "machine", "encoding", "points", "capacity", "largest_sustained_nodes", "smoke"}
    ),
    "kv_failover": frozenset({"benchmark", "runs", "write_resumed_s", "smoke"}),
    "kv_writes": frozenset({"nodes", "snapshot_bytes", "flush_s", "writes_per_s", "smoke"}),
    "agent_join": frozenset(
        {"benchmark", "agents", "review_ms", "first_join", "rejoin_cached", "smoke"}
    ),
}


def bench_scripts() -> list[Path]:
    """bench/*.py that run as scripts; helper modules (no `__main__` block) are left out."""
    return sorted(p for p in BENCH.glob("*.py") if MAIN_GUARD.search(p.read_text()))


def outputs() -> dict[Path, tuple[int, int]]:
    """(mtime, size) of what real runs write: bench/results/ and the plots under docs/.
    A smoke run must leave them alone (its numbers mean nothing)."""
    paths = [*(REPO / "bench" / "results").rglob("*"), *(REPO / "docs").rglob("*.png")]
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in paths if p.is_file()}


def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_discovery_finds_the_scripts_and_leaves_helpers_out() -> None:
    names = {p.stem for p in bench_scripts()}
    assert set(EXPECTED_KEYS) <= names
    assert not {"exporter", "ingest_verdict"} & names  # imported by scripts, not run


@pytest.mark.timeout(RUN_TIMEOUT_S + HELP_TIMEOUT_S + 30)
@pytest.mark.parametrize("script", bench_scripts(), ids=lambda p: p.stem)
def test_smoke_run_prints_its_json(script: Path) -> None:
    name = script.stem
    rel = str(script.relative_to(REPO))
    shown = run([rel, "--help"], HELP_TIMEOUT_S)
    assert shown.returncode == 0, f"{rel} --help failed:\n{shown.stderr[-3000:]}"
    if "--smoke" not in shown.stdout:
        pytest.fail(f"{rel} has no --smoke: every bench script needs one (see this test)")
    argv = [rel, "--smoke"] + (["--json"] if "--json" in shown.stdout else [])
    before = outputs()
    done = run(argv, RUN_TIMEOUT_S)
    written = sorted(str(p.relative_to(REPO)) for p, v in outputs().items() if before.get(p) != v)
    assert not written, f"{rel} --smoke wrote results or plots: {written}"
    assert done.returncode == 0, (
        f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    )
    try:
        document = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        pytest.fail(f"{rel} --smoke printed no JSON document ({exc}):\n{done.stdout[-2000:]}")
    assert isinstance(document, dict), f"{rel}: expected a JSON object"
    assert document, f"{rel}: empty JSON document"
    missing = EXPECTED_KEYS.get(name, frozenset()) - set(document)
    assert not missing, f"{rel} --smoke: keys missing from its JSON: {sorted(missing)}"
