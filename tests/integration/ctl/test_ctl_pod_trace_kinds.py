"""`nicfleetctl trace --pod` for pods beside the RDMA chain, against a real API server
(127.0.0.1): a GPU resource next to an RDMA one is named as not traced, and a pod that
attaches a network with no RDMA resource says there is no RDMA chain."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest
from click.testing import CliRunner, Result

from aggregator.cluster import PodRequest
from aggregator.ctl.main import cli
from tests.support.api_fixtures import serve_in_thread
from tests.support.chain_fixtures import RES, ChainHarness
from tests.support.pod_trace_fixtures import pod_cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    base = pod_cluster()
    extra = (
        PodRequest(namespace="ml", name="mixed", node="gpu-001", phase="Running",
                   requests={RES: 1, "nvidia.com/gpu": 8}),
        PodRequest(namespace="ml", name="net-only", node="gpu-001", phase="Running",
                   networks=("ml/ib",)),
    )  # fmt: skip
    cluster = msgspec.structs.replace(base, pods=(*base.pods, *extra))
    with serve_in_thread(ChainHarness(cluster=cluster).app()) as url:
        yield url


def ctl(*args: str) -> Result:
    env: dict[str, str | None] = {"NICFLEET_SERVER": None, "NO_COLOR": None, "FORCE_COLOR": "1"}
    return CliRunner().invoke(cli, list(args), env=env, prog_name="nicfleetctl")


def test_a_gpu_beside_the_rdma_resource_is_named_not_traced(server: str) -> None:
    result = ctl("--server", server, "trace", "--pod", "ml/mixed")
    assert result.exit_code == 0, result.output
    assert " - nvidia.com/gpu not traced: no policy configures it and no agent's device " in (
        result.stdout
    )
    assert "rdma/ib on gpu-001:" in result.stdout


def test_a_network_only_pod_says_there_is_no_rdma_chain(server: str) -> None:
    result = ctl("--server", server, "trace", "--pod", "ml/net-only")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "pod ml/net-only on gpu-001 (Running), requests no resource: ok"
    assert lines[2].startswith(
        " - no RDMA chain: ml/net-only requests no device-plugin resource; it attaches ml/ib"
    )
