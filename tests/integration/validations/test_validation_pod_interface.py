"""The `pod-interface` link end to end: a pair validation (the API, the runner, kmock's
Kubernetes API over HTTP and a real nats-server) whose verify results are what
`nicfleet-agent verify -o json` really printed in a pod namespace (a veth end renamed net1
holding the RoCE GID's address, the roce-cx6dx lab tree, the downward-API annotations with
Multus' network-status), then the trace of a workload pod on the validated node: its
`pod-interface` link is ok and names net1 with the evidence that identified it. Needs root
and `ip netns` for the verify run; skipped with the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from aggregator.bus.natsserver import NatsServer
from aggregator.cluster import ClusterView, NetworkStatus, PodRequest
from proto.messages.validation import ValidationResult
from tests.integration.verify import test_pod_interfaces as pods
from tests.support.validation_fixtures import RES, answer, validation_stack
from tests.support.waits import wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(pods._NETNS is not None, reason=pods._NETNS or ""),
]
# The pod-namespace, lab-tree and /dev fixtures of the verify tests.
make_pod, roce_tree, dev = pods.make_pod, pods.roce_tree, pods.dev
NODE = "gpu-002"

# The workload pod on NODE, as the aggregator lists it: RES in its limits, Multus'
# network-status naming the adapter verify found (the lab's mlx5_0 at 0000:1a:00.0).
WORKER = PodRequest(
    namespace="ml", name="worker-0", node=NODE, phase="Running", requests={RES: 1},
    networks=("default/rdma-net",),
    network_status=(NetworkStatus(name="default/rdma-net", interface="net1", ips=("10.10.0.11",),
                                  pci_address="0000:1a:00.0", rdma_device="mlx5_0"),),
)  # fmt: skip


@pytest.fixture
def verified(
    roce_tree: Path, dev: Path, make_pod: pods.MakePod, tmp_path: Path
) -> ValidationResult:
    """What verify printed in a Multus pod whose net1 is the RDMA device's."""
    pod = make_pod({"eth0": "10.244.1.7/24", "net1": pods.GID_ADDRESS})
    status = pods.status("0000:1a:00.0", "mlx5_0")
    annotations = pods.write_annotations(tmp_path / "annotations", status)
    done, result = pods.verify(roce_tree, dev, pod, annotations, "-o", "json")
    assert done.returncode == 0 and result is not None, done.stdout + done.stderr
    assert result.evidence.rdma_interfaces  # the identification the link is about
    return result


async def test_a_validations_identification_shows_in_the_pods_trace(
    nats_server: NatsServer, verified: ValidationResult
) -> None:
    def script(vid: str, role: str, node: str) -> list[ValidationResult | bytes]:
        scripted = answer(vid, role, node)  # the pair test's numbers
        return [msgspec.structs.replace(
            verified, validation_id=vid, role=scripted.role, node=node, pod=scripted.pod,
            pair_test=scripted.pair_test, started_at=scripted.started_at,
            finished_at=scripted.finished_at,
        )]  # fmt: skip

    cluster = ClusterView(present=True, pods=(WORKER,))
    stack_cm = validation_stack(nats_server.url, script=script, cluster=cluster)
    async with stack_cm as stack, httpx.AsyncClient(base_url=stack.url) as http:
        body = {"nodes": ["gpu-001", NODE], "resource": RES, "network": "default/rdma-net"}
        created = await http.post("/api/v1/validations", json=body)
        assert created.status_code == 202, created.text
        vid = created.json()["id"]
        box: dict[str, Any] = {}

        async def done() -> bool:
            box["record"] = (await http.get(f"/api/v1/validations/{vid}")).json()
            return bool(box["record"]["phase"] in ("done", "failed", "timed-out"))

        await wait_until(done, timeout=20, interval=0.05, what=f"validation {vid}")
        assert box["record"]["phase"] == "done", box["record"]
        client = box["record"]["client"]
        assert client["evidence"]["rdma_interfaces"][0]["interface"] == "net1"

        reply = await http.get("/api/v1/trace/pods/ml/worker-0")
        assert reply.status_code == 200, reply.text
        trace = reply.json()
    (chain,) = trace["traces"]
    assert (trace["node"], chain["resource"]) == (NODE, RES)
    link = next(x for x in chain["links"] if x["name"] == "pod-interface")
    assert link["status"] == "ok", link
    assert link["evidence"]["interfaces"] == ["net1 (gid-address, device-info)"]
    (side,) = link["evidence"]["verified"]
    assert (side["validation"], side["verdict"]) == (vid, "rdma-path")
    assert side["pod"] == f"nicfleet-system/nicfleet-validate-{vid}-client"
    assert side["devices"] == {"net1": ["mlx5_0"]}
    assert link["evidence"]["network_status"][0]["adapter_selected"] is None  # no inventory
