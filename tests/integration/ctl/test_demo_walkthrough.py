"""docs/troubleshooting.md's "Try it on the demo" runs as written against `nicfleetctl demo
--serve`: every `nicfleet-agent lab fault` line is executed (by bash, `$W` and `&` as a user
types them) and every `nicfleetctl` line's output shown in the doc must appear (tables
compared column by column, times and ages not, numbers in messages masked, `...` eliding).
The demo's lab traffic gives ports a rate the API reports. Slow: one demo for the module.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from aggregator.ctl.main import cli as ctl_cli
from tests.support.paths import REPO
from tests.support.waits import wait_until

# One demo start (about a minute) serves the module; the walkthrough itself takes another.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(480)]

DOC = REPO / "docs" / "troubleshooting.md"
SECTION = "## Try it on the demo"
# Columns whose values depend on when the command runs.
VOLATILE = frozenset({"AGE", "SINCE", "LAST-SEEN", "LATENCY"})
_HEADER = re.compile(r"^[A-Z][A-Z-]*(\s{2,}[A-Z][A-Z-]*)+$")
_NUMBER = re.compile(r"\d+(\.\d+)?")


@dataclass
class Step:
    line: int
    command: str
    output: list[str] = field(default_factory=list)


def walkthrough(text: str) -> list[Step]:
    """The `$ ` commands of the section's console blocks, each with the output shown."""
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    first = text[: text.index(SECTION)].count("\n") + 1
    steps: list[Step] = []
    fence = False
    for number, raw in enumerate(section.splitlines(), start=first):
        if raw.startswith("```"):
            fence = raw.strip() == "```console"
            continue
        if not fence:
            continue
        if raw.startswith("$ "):
            steps.append(Step(number, raw[2:]))
        elif steps:
            steps[-1].output.append(raw.rstrip())
    return steps


def _mask(text: str) -> str:
    return _NUMBER.sub("N", " ".join(text.split()))


def _same(shown: str, actual: str) -> bool:
    """A shown line (maybe cut short with `...`) against a real one, numbers masked."""
    shown, actual = _mask(shown), _mask(actual)
    if shown.endswith("..."):
        return actual.startswith(shown[:-3].rstrip())
    return shown == actual


def _row(header: str, line: str) -> dict[str, str]:
    names = header.split()
    values = re.split(r"\s{2,}", line.strip(), maxsplit=len(names) - 1)
    return dict(zip(names, values, strict=False))


def _row_matches(header: str, shown: str, actual: str) -> bool:
    want, got = _row(header, shown), _row(header, actual)
    return all(
        k in got and (k in VOLATILE or v == "..." or _same(v, got[k])) for k, v in want.items()
    )


def missing_lines(shown: list[str], actual: list[str]) -> list[str]:
    """The shown lines not found in `actual`, in order: table rows under the same header
    (matched per column), other lines as text; `...` lines elide."""
    missing: list[str] = []
    header = None
    at = 0
    for line in shown:
        if line.strip() in ("", "...", "…"):
            continue
        if _HEADER.match(line.strip()):
            header = line.strip()
            names = header.split()
            found = next((i for i in range(at, len(actual)) if actual[i].split() == names), None)
            if found is None:
                missing.append(line)
                header = None
                continue
            at = found + 1
            continue
        if header is not None and len(re.split(r"\s{2,}", line.strip())) > 1:
            if not any(_row_matches(header, line, a) for a in actual[at:]):
                missing.append(line)
            continue
        header = None
        found = next((i for i in range(at, len(actual)) if _same(line, actual[i])), None)
        if found is None:
            missing.append(line)
        else:
            at = found + 1
    return missing


def test_the_matcher_compares_what_is_stable() -> None:
    actual = [
        "STATE   SEVERITY  RULE       NODE  SUBJECT   SINCE                 MESSAGE",
        "firing  warning   link-flap  n1    mlx5_2/1  2026-12-02T03:24:47Z  mlx5_2/1 at 19.8/s, x",
    ]
    shown = [
        "STATE   SEVERITY  RULE       NODE  SUBJECT   SINCE                 MESSAGE",
        "firing  warning   link-flap  n1    mlx5_2/1  2026-11-30T13:28:02Z  mlx5_2/1 at 20/s, ...",
    ]
    assert missing_lines(shown, actual) == []
    assert missing_lines([shown[0], shown[1].replace("firing", "resolved")], actual) != []
    assert missing_lines(["NAME  AGE", "n1  0s"], ["NAME  LAST-SEEN", "n1  0s"]) != []
    assert missing_lines(["a", "...", "c"], ["a", "b", "c"]) == []
    assert missing_lines(["c", "a"], ["a", "b", "c"]) == ["a"]


def test_the_walkthrough_has_the_faults_it_promises() -> None:
    steps = walkthrough(DOC.read_text())
    faults = [shlex.split(s.command)[3] for s in steps if s.command.startswith("nicfleet-agent")]
    for kind in ("port-down", "port-up", "counter", "pcie-width", "device-remove"):
        assert kind in faults, f"the walkthrough lost its {kind} step"
    rules = {w for s in steps for w in shlex.split(s.command, comments=True)}
    assert {"counter-errors", "link-flap", "pcie-degraded"} <= rules


@dataclass
class Demo:
    api: str
    workdir: Path
    proc: subprocess.Popen[bytes]


def _started(out: Path) -> bool:
    return b"Press Ctrl-C" in out.read_bytes()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    base = tmp_path_factory.mktemp("walkthrough")
    workdir, out = base / "demo", base / "demo.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aggregator.ctl", "demo", "--serve", "--workdir", str(workdir)],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:

        async def up() -> None:
            def ready() -> bool:
                assert proc.poll() is None, out.read_text()[-3000:]
                return _started(out)

            await wait_until(ready, timeout=240, interval=0.2, what="demo --serve")

        asyncio.run(up())
        api = re.search(r"API: (http://\S+)", out.read_text())
        assert api is not None
        yield Demo(api.group(1), workdir, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_demo_traffic_gives_every_active_port_a_rate(demo: Demo) -> None:
    """With the demo running, the API reports rx and tx rates above 0 on each port."""

    def moving() -> bool:
        doc = httpx.get(f"{demo.api}/api/v1/nodes/gpu-ib-02", timeout=5).json()
        ports = (doc.get("counters") or {}).get("ports", [])
        rates = [(p["rates"].get("rx_bytes", 0), p["rates"].get("tx_bytes", 0)) for p in ports]
        return len(rates) == 4 and all(rx > 0 and tx > 0 for rx, tx in rates)

    await wait_until(moving, timeout=30, interval=0.5, what="a rate on every port of gpu-ib-02")


async def test_the_walkthrough_runs_as_written(demo: Demo) -> None:
    env = {**os.environ, "W": str(demo.workdir), "NICFLEET_SERVER": demo.api}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    background: list[subprocess.Popen[bytes]] = []
    try:
        for step in walkthrough(DOC.read_text()):
            words = shlex.split(step.command, comments=True)
            where = f"{DOC.name}:{step.line}: {step.command}"
            if words[0] == "nicfleet-agent":
                _run_fault(step, words, env, background, where)
            elif words[0] == "nicfleetctl" and "--follow" not in words:
                await _check_ctl(step, words[1:], demo.api, where)
            else:
                # `export`/`W=` lines set what the test already set; --follow streams forever.
                assert words[0] in {"export", "nicfleetctl"} or "=" in words[0], where
    finally:
        for proc in background:
            proc.terminate()
            proc.wait(timeout=30)


def _run_fault(
    step: Step,
    words: list[str],
    env: dict[str, str],
    background: list[subprocess.Popen[bytes]],
    where: str,
) -> None:
    command = step.command.rstrip()
    if command.endswith("&"):
        background.append(subprocess.Popen(["bash", "-c", command[:-1]], env=env))
        return
    done = subprocess.run(
        ["bash", "-c", command], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"{where}\n{done.stderr}"
    record = json.loads(done.stdout.splitlines()[-1])
    assert record["fault"] == words[3], where
    for shown in step.output:  # {"fault":"port-down","target":"mlx5_0/1",...}
        target = re.search(r'"target":"([^"]+)"', shown)
        assert target is None or record["target"] == target.group(1), where


async def _check_ctl(step: Step, args: list[str], api: str, where: str) -> None:
    runner = CliRunner()
    last: list[str] = []

    def shown() -> bool:
        nonlocal last
        done = runner.invoke(ctl_cli, args, env={"NICFLEET_SERVER": api})
        last = done.output.splitlines()
        return not missing_lines(step.output, last)

    try:
        await wait_until(shown, timeout=40, interval=0.5, what=where)
    except BaseException:
        gone = missing_lines(step.output, last)
        pytest.fail(f"{where}: not in its output: {gone}\n--- output:\n" + "\n".join(last))
