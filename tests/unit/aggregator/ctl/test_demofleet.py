"""The demo's children stop when the demo dies, even by SIGKILL: a parent process spawns a
child with `die_with_this_process()` (and one without, the control), prints their pids and
is SIGKILLed; the armed child gets SIGTERM from the kernel, the other lives on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.waits import wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")

PARENT = """
import subprocess, sys
from aggregator.ctl.demofleet import die_with_this_process
sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
armed = subprocess.Popen(sleep, preexec_fn=die_with_this_process())
plain = subprocess.Popen(sleep)
print(armed.pid, plain.pid, flush=True)
sys.stdin.read()
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


@pytest.fixture
def parent() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    yield proc
    proc.kill()
    proc.wait()
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    proc.stdout.close()


async def test_a_child_armed_with_it_dies_with_a_sigkilled_parent(
    parent: subprocess.Popen[str],
) -> None:
    assert parent.stdout is not None
    armed, plain = map(int, parent.stdout.readline().split())
    try:
        assert _alive(armed) and _alive(plain)
        parent.kill()
        parent.wait()
        await wait_until(lambda: not _alive(armed), timeout=20, what="the armed child to exit")
        assert _alive(plain)  # without it, a child outlives its killed parent
    finally:
        for pid in (armed, plain):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
