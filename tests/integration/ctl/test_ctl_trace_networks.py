"""The `attachment` and `ip-pool` links through the API (GET /api/v1/trace) and
`nicfleetctl trace`, on a real API server (127.0.0.1): a pod requesting a NAD that does not
exist, and a full NV-IPAM block."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import msgspec
import pytest
from click.testing import CliRunner, Result

from aggregator.cluster import (
    ClusterView,
    IpPool,
    NetworkAttachment,
    NetworkStatus,
    PodRequest,
    PoolBlock,
)
from aggregator.ctl.main import cli
from tests.support.api_fixtures import serve_in_thread
from tests.support.chain_fixtures import RES, ChainHarness, chain_cluster

pytestmark = pytest.mark.integration


def cluster() -> ClusterView:
    base = chain_cluster()
    nad = NetworkAttachment(
        namespace="ml", name="ib-pool", cni_type="ipoib", master="ib1", ipam_type="nv-ipam",
        ipam_pools=("p1",),
    )  # fmt: skip
    pool = IpPool(
        kind="nv-ipam-ippool", namespace="nvidia-network-operator", name="p1",
        network="10.0.0.0/24", block_size=1,
        blocks={"gpu-002": PoolBlock(node="gpu-002", first="10.0.0.1", last="10.0.0.1")},
    )  # fmt: skip
    pods = (
        PodRequest(namespace="ml", name="t-0", node="gpu-001", phase="Pending",
                   requests={RES: 1}, networks=("ml/missing",)),
        PodRequest(namespace="ml", name="t-2", node="gpu-002", phase="Running",
                   requests={RES: 1}, networks=("ml/ib-pool",),
                   network_status=(NetworkStatus(name="ml/ib-pool", interface="net1",
                                                 ips=("10.0.0.1",)),)),
    )  # fmt: skip
    return msgspec.structs.replace(
        base, pods=pods, attachments=(*base.attachments, nad), ip_pools=(pool,)
    )


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serve_in_thread(ChainHarness(cluster=cluster()).app()) as url:
        yield url


def ctl(*args: str) -> Result:
    env: dict[str, str | None] = {"NICFLEET_SERVER": None, "NO_COLOR": None, "FORCE_COLOR": "1"}
    return CliRunner().invoke(cli, list(args), env=env, prog_name="nicfleetctl")


def test_api_names_the_missing_nad(server: str) -> None:
    body = httpx.get(f"{server}/api/v1/trace", params={"node": "gpu-001", "resource": RES}).json()
    links = {link["name"]: link for link in body["links"]}
    attachment = links["attachment"]
    assert attachment["status"] == "broken"
    assert "ml/missing, which does not exist" in attachment["cause"]
    assert body["links"][body["first_broken"]]["name"] == "attachment"
    assert links["ip-pool"]["status"] == "ok"  # the annotated NAD has no IPAM


def test_ctl_trace_shows_the_full_block(server: str) -> None:
    # gpu-002's adapters are down: its first broken link is rdma-device, the pool still shows.
    result = ctl("--server", server, "trace", "gpu-002", RES)
    assert result.exit_code == 1, result.output
    assert "ip-pool" in result.stdout
    assert "block 10.0.0.1-10.0.0.1 of gpu-002 has 0 of 1 addresses free" in result.stdout
