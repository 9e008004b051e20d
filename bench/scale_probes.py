"""Probes for bench/ingest_scale.py (issue 8): the aggregator and the bare subscriber as
processes with their /metrics, API and /proc figures, nats-server's monitoring endpoint,
and the py-spy summary. Imported by the harness; not a script of its own, so it has no
--smoke of its own: `bench/ingest_scale.py --smoke` (and `bench/shard_scale.py --smoke`),
which `make test` runs, exercise these probes.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

REPO: Final = Path(__file__).resolve().parents[1]
PY: Final = sys.executable
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def wait_for(check: Any, timeout: float, what: str, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(every)


class Aggregator:
    """`python -m aggregator run` on the given NATS; its /metrics, API and /proc figures."""

    def __init__(self, nats_url: str, workdir: Path) -> None:
        self.ready_file = workdir / "aggregator.ready"
        self.log_path = workdir / "aggregator.log"
        self.log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                PY,
                "-m",
                "aggregator",
                "run",
                "--nats-url",
                nats_url,
                "--listen",
                "127.0.0.1:0",
                "--ready-file",
                str(self.ready_file),
            ],
            cwd=REPO,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.api_url = ""

    async def ready(self, http: aiohttp.ClientSession) -> None:
        async def up() -> bool:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"aggregator exited with {self.proc.returncode}:\n{tail}")
            return self.ready_file.exists()

        await wait_for(up, 60, "the aggregator's ready file")
        self.api_url = json.loads(self.ready_file.read_text())["api_url"]

    async def applied(self, http: aiohttp.ClientSession) -> dict[str, float]:
        """From /metrics: messages applied and rejected ("messages:<kind>",
        "rejected:<kind>"), rule engine cycles, findings and firing alerts."""
        async with http.get(f"{self.api_url}/metrics") as resp:
            text = await resp.text()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            if family.name in ("nicfleet_ingest_messages", "nicfleet_ingest_rejected"):
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        key = f"{family.name.rsplit('_', 1)[1]}:{sample.labels.get('kind')}"
                        out[key] = out.get(key, 0.0) + sample.value
            elif family.name == "nicfleet_rule_evaluations":  # engine cycles, any trigger
                total = sum(s.value for s in family.samples if s.name.endswith("_total"))
                out["rule_cycles"] = total
            elif family.name in ("nicfleet_findings", "nicfleet_alerts_firing"):
                out[family.name.removeprefix("nicfleet_")] = sum(s.value for s in family.samples)
        return out

    async def lag(self, http: aiohttp.ClientSession, node: str) -> tuple[float, float] | None:
        """(received_at - collected_at, now - collected_at) of the node's newest applied
        batch (collected_at = send time): the processing lag and the age of what it shows."""
        async with http.get(f"{self.api_url}/api/v1/nodes/{node}") as resp:
            if resp.status != 200:
                return None
            doc = await resp.json()
        counters, received = doc.get("counters"), doc.get("counters_received_at")
        if not counters or received is None:
            return None
        sent = float(counters["collected_at"])
        return float(received) - sent, time.time() - sent

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def nats_trouble(self) -> dict[str, int]:
        """How often the aggregator logged a lost connection / a NATS error."""
        text = self.log_path.read_text(errors="replace")
        return {
            "disconnected": text.count("disconnected from NATS"),
            "nats_errors": text.count("NATS error"),
            "slow_consumer": text.lower().count("slow consumer"),
        }


class Bare:
    """bench/bare_subscriber.py as a process; its JSON lines are kept as they arrive."""

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self.lines: list[dict[str, Any]] = []
        self._reader: asyncio.Task[None] | None = None

    async def start(self, nats_url: str) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            PY,
            str(REPO / "bench" / "bare_subscriber.py"),
            "--nats-url",
            nats_url,
            stdout=asyncio.subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        first = await asyncio.wait_for(self.proc.stdout.readline(), 30)
        if not first or not json.loads(first).get("ready"):
            raise RuntimeError("bare subscriber did not start")
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            self.lines.append(json.loads(line))

    def counters(self) -> float:
        return float(self.lines[-1]["counts"]["counters"]) if self.lines else 0.0

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()
        if self._reader is not None:
            await self._reader


async def nats_monitor(http: aiohttp.ClientSession, mon: int) -> dict[str, Any]:
    base = f"http://127.0.0.1:{mon}"
    async with http.get(f"{base}/varz") as resp:
        varz = await resp.json(content_type=None)
    async with http.get(f"{base}/connz") as resp:
        connz = await resp.json(content_type=None)
    pending = {c.get("name", ""): c.get("pending_bytes", 0) for c in connz.get("connections", [])}
    return {"slow_consumers": varz.get("slow_consumers", 0), "pending_bytes": pending}


GENERIC_FRAMES: Final = (
    "<frozen",
    "click/",
    "asyncio/",
    "aggregator/__main__.py",
    "aggregator/cli/main.py",
    "aggregator/cli/reviewflags.py",
    "proto/runtime/natsflags.py",
)


def summarize_profile(raw: Path, top: int = 15) -> dict[str, Any]:
    """py-spy --format raw (collapsed stacks) -> self and inclusive % per function."""
    self_n: Counter[str] = Counter()
    incl_n: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_frame(f) for f in stack.split(";") if f]
        if frames:
            self_n[frames[-1]] += count
        for name in set(frames):
            incl_n[name] += count

    def share(counter: Counter[str]) -> list[dict[str, Any]]:
        return [
            {"function": k, "pct": round(100 * v / max(total, 1), 1)}
            for k, v in counter.most_common(top)
        ]

    # Frames on every stack (runpy, click, the event loop, the CLI) say nothing.
    for name in [k for k in incl_n if k.split(" (")[-1].startswith(GENERIC_FRAMES)]:
        del incl_n[name]
    return {"samples": total, "self": share(self_n), "inclusive": share(incl_n)}


def _frame(text: str) -> str:
    """`fn (.../aggregator/fleet/ingest.py:55)` -> `fn (aggregator/fleet/ingest.py)`: our
    modules from their package root, others by their last two parts (line numbers merged)."""
    name, _, where = text.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    if not path:
        return name
    parts = Path(path).parts
    ours = [i for i, part in enumerate(parts) if part in ("agent", "aggregator", "proto")]
    return f"{name} ({'/'.join(parts[ours[-1] if ours else -2 :])})"
