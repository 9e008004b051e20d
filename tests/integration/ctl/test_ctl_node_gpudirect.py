"""`nicfleetctl node NAME` shows the GPUDirect path(s) and the IOMMU mode, with why, from
the API's `gpudirect` (CLI runner against a served aggregator API on lab snapshots)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result

from aggregator.ctl.main import cli
from tests.support.api_fixtures import NOW, Harness, serve_in_thread
from tests.support.gpudirectlab import TUNED, UNTUNED, kernel_facts_fleet

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    fleet = kernel_facts_fleet(tmp_path_factory.mktemp("lab"), NOW)
    with serve_in_thread(Harness(fleet=fleet).app()) as url:
        yield url


def ctl(*args: str) -> Result:
    env = {"NICFLEET_SERVER": None, "NO_COLOR": "1", "COLUMNS": "400"}
    return CliRunner().invoke(cli, list(args), env=env, prog_name="nicfleetctl")


def _row(out: str, label: str) -> str:
    (line,) = [line for line in out.splitlines() if line.startswith(label)]
    return " ".join(line.removeprefix(label).split())


def test_tuned_host(server: str) -> None:
    result = ctl("--server", server, "node", TUNED)
    assert result.exit_code == 0, result.output
    assert _row(result.stdout, "GPUDirect:") == (
        "dma-buf, peermem (dma-buf: open NVIDIA kernel modules on Linux 6.8.0-45-generic; "
        "peermem: nvidia_peermem loaded)"
    )
    assert _row(result.stdout, "IOMMU:") == (
        "off (no IOMMU unit registered: /sys/class/iommu is empty)"
    )


def test_untuned_host(server: str) -> None:
    result = ctl("--server", server, "node", UNTUNED)
    assert result.exit_code == 0, result.output
    row = _row(result.stdout, "GPUDirect:")
    assert row.startswith("none (dma-buf: not with the proprietary NVIDIA kernel modules")
    assert row.endswith("peermem: nvidia_peermem not loaded)")


def test_json_carries_the_field(server: str) -> None:
    result = ctl("--server", server, "node", UNTUNED, "-o", "json")
    assert result.exit_code == 0, result.output
    gd = json.loads(result.stdout)["gpudirect"]
    assert (gd["path"], gd["iommu"], gd["kernel_release"]) == ("none", "off", "5.15.0-105-generic")
