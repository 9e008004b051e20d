"""The DRA path end to end through the real services: the AggregatorService (kmock as its
Kubernetes API, `dra_publish` on, a real nats-server) and an AgentService with `--dra` and
claims from NATS on a lab sysfs tree, registered with the lab DRA kubelet.

The aggregator publishes the node's ResourceSlice; a ResourceClaim allocated the way the
scheduler writes it (status.allocation.devices.results + nodeSelector, reservedFor the
pod) prepares with its CDI id through the aggregator's own claim watcher and answerer;
another node's claim is that claim's error only. The pod holding the claim (spec.
resourceClaims from a template, the resourceclaim controller's resourceClaimStatuses, the
kubelet's allocatedResourcesStatus) traces ok over the HTTP API and `nicfleetctl trace
--pod`, with no finding. A lab port fault turns the slice's portState DOWN, the health
stream Unhealthy, the pod's `device-healthy` link broken and fires
dra-claim-unhealthy-device; unprepare removes the CDI spec. Nothing here is wired by hand.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import pytest

from agent.dra.cdi import spec_file_name
from agent.lab.faults import port_down
from agent.lab.kubeletdra import DraKubeletEmulator, claim_object
from agent.service import AgentService, AgentSettings
from aggregator.bus.natsserver import NatsServer
from aggregator.kube.client import KubeSettings
from aggregator.kube.watch import WatchSettings
from aggregator.rules.dra import UNHEALTHY
from aggregator.service import AggregatorService, AggregatorSettings
from aggregator.trace.dra import CLAIM_LINK_NAMES
from proto.dra import api_pb2, health_pb2
from tests.integration.dra.fixtures import lab_dra_settings, running
from tests.integration.kube.sliceapi import ApiServer, aggregator_api, port_state
from tests.support.paths import REPO
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

NODE, OTHER = "e2e-roce-01", "e2e-roce-02"
DRIVER = "rdma.nicfleet.io"
SLICE = f"{NODE}-rdma-nicfleet-io-0"
NS, POD, POD_UID = "ml", "train-0", "5a6e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
UID_MINE = "3e5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
UID_OTHER = "4f5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
# The pod's claim, named by the resourceclaim controller (<pod>-<entry>-<random>) from its
# template; allocated mlx5-0 on NODE.
MINE = (NS, UID_MINE, "train-0-nic-7xk2p")
ELSEWHERE = (NS, UID_OTHER, "nic-elsewhere")  # allocated on OTHER
RESOURCE_ID = f"{DRIVER}/{NODE}/mlx5-0"  # the kubelet's name of the device
# The cluster lists (pods, claims, slices, classes) at once, not every 30 s.
WATCH = WatchSettings(pods_every_s=0.05, retry_s=0.05, retry_max_s=0.2)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="drae", dir="/tmp"))  # unix sockets: 107 bytes
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def scheduled(
    claim: tuple[str, str, str], node: str, device: str, *, pod: str | None = None
) -> dict[str, Any]:
    """The claim as the scheduler leaves it: one result in `node`'s pool, pinned there,
    reserved for `pod` (a name in the claim's namespace) when given."""
    obj = claim_object(claim, [("nic", DRIVER, node, device)])
    obj["spec"] = {
        "devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "rdma"}}]}
    }
    obj["status"]["allocation"]["nodeSelector"] = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }
    if pod is not None:
        obj["status"]["reservedFor"] = [{"resource": "pods", "name": pod, "uid": POD_UID}]
    return obj


def training_pod(health: str) -> dict[str, Any]:
    """The running pod with its template claim: the resourceclaim controller's
    resourceClaimStatuses and the kubelet's allocatedResourcesStatus (`health`) of mlx5-0."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": POD, "namespace": NS, "uid": POD_UID},
        "spec": {
            "nodeName": NODE,
            "resourceClaims": [{"name": "nic", "resourceClaimTemplateName": "one-nic"}],
            "containers": [{"name": "trainer", "image": "i",
                            "resources": {"claims": [{"name": "nic"}]}}],
        },
        "status": {
            "phase": "Running",
            "resourceClaimStatuses": [{"name": "nic", "resourceClaimName": MINE[2]}],
            "containerStatuses": [{
                "name": "trainer", "ready": True, "restartCount": 0, "image": "i",
                "allocatedResourcesStatus": [{
                    "name": "claim:nic",
                    "resources": [{"resourceID": RESOURCE_ID, "health": health}],
                }],
            }],
        },
    }  # fmt: skip


async def post_claim(api: ApiServer, obj: dict[str, Any]) -> None:
    path = f"/apis/resource.k8s.io/v1/namespaces/{obj['metadata']['namespace']}/resourceclaims"
    response = await api.post(path, json=obj)
    assert response.status < 300, await response.text()


def agent_settings(root: Path, nats_url: str) -> AgentSettings:
    dra = lab_dra_settings(root, NODE)
    return AgentSettings(
        node_name=NODE, sysfs_root=root / "sys", nats_url=nats_url, netlink=False, dra=dra
    )


class Api:
    """The aggregator's HTTP API as a client reads it, each body waited for by a predicate."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url = http, url

    async def get(self, path: str, **params: str) -> tuple[int, dict[str, Any]]:
        async with self.http.get(self.url + path, params=params) as response:
            body: dict[str, Any] = await response.json()
            return response.status, body

    async def wait(
        self, path: str, done: Callable[[dict[str, Any]], bool], what: str, **params: str
    ) -> dict[str, Any]:
        """The first 200 body `done` accepts; 404 (the pod not listed yet) is waited out."""
        last: dict[str, Any] = {}

        async def answered() -> bool:
            nonlocal last
            code, last = await self.get(path, **params)
            assert code in (200, 404), (code, last)
            return code == 200 and done(last)

        await wait_until(answered, timeout=20, interval=0.05, what=what)
        return last

    async def pod_trace(self, done: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        return await self.wait(f"/api/v1/trace/pods/{NS}/{POD}", done, what)

    async def findings(self, done: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        return await self.wait("/api/v1/findings", done, what, rule=UNHEALTHY)


def claim_chain(trace: dict[str, Any]) -> dict[str, Any] | None:
    chains: list[dict[str, Any]] = trace["claims"]
    return chains[0] if chains else None


def links_of(chain: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {link["name"]: link for link in chain["links"]}


async def ctl_trace_pod(url: str) -> tuple[int, str]:
    """`nicfleetctl trace --pod NS/POD --server URL -o json` as a user runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NICFLEET_")}
    env["NICFLEET_CONFIG"] = "/nonexistent/nicfleet-config.yaml"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aggregator.ctl", "trace", "--pod", f"{NS}/{POD}",
        "--server", url, "-o", "json",
        cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode() or err.decode()


def health_of(response: health_pb2.NodeWatchResourcesResponse, device: str) -> int | None:
    for entry in response.devices:
        if entry.device.device_name == device:
            return int(entry.health)
    return None


async def assert_the_pod_traces_ok(api: Api) -> None:
    """A healthy DRA pod is never called broken: every link of its claim's chain ok, the
    CDI id it was prepared with in `prepared`, and no dra-claim-unhealthy-device."""
    trace = await api.pod_trace(
        lambda t: (c := claim_chain(t)) is not None and c["verdict"] == "ok",
        "the pod's claim chain ok (pod, claim, slice and the agent's prepared claim listed)",
    )
    chain = claim_chain(trace)
    assert chain is not None and len(trace["claims"]) == 1
    assert chain["resource"] == "claim/nic" and chain["node"] == NODE
    assert [link["name"] for link in chain["links"]] == list(CLAIM_LINK_NAMES)
    assert {link["name"]: link["status"] for link in chain["links"]} == dict.fromkeys(
        CLAIM_LINK_NAMES, "ok"
    )
    assert chain["ok"] is True and chain["first_broken"] is None
    assert trace["ok"] is True and trace["node"] == NODE and trace["phase"] == "Running"
    links = links_of(chain)
    assert links["claim"]["evidence"]["claim"] == MINE[2]
    assert links["claim"]["evidence"]["template"] == "one-nic"
    assert links["prepared"]["evidence"]["cdi_ids"] == [f"{DRIVER}/claim={UID_MINE}-mlx5-0"]
    assert links["pod"]["evidence"]["reserved_for"] == [f"{NS}/{POD}"]
    # A rule cycle that saw the same cluster: nothing found about the healthy claim.
    found = await api.findings(
        lambda f: f["evaluated_at"] is not None and f["evaluated_at"] >= trace["checked_at"],
        "a rule evaluation after the trace",
    )
    assert found["items"] == []


async def assert_the_port_fault_breaks_the_chain(api: Api) -> None:
    """mlx5_0's port DOWN: `device-healthy` broken naming mlx5-0 and the port, and the
    finding dra-claim-unhealthy-device about the claim's device on NODE."""

    def healthy_link(t: dict[str, Any]) -> dict[str, Any] | None:
        chain = claim_chain(t)
        return links_of(chain)["device-healthy"] if chain is not None else None

    trace = await api.pod_trace(
        lambda t: (link := healthy_link(t)) is not None and link["status"] == "broken",
        "the port fault in the pod's claim chain",
    )
    chain = claim_chain(trace)
    assert chain is not None
    link = links_of(chain)["device-healthy"]
    assert "mlx5-0" in link["cause"] and "port DOWN" in link["cause"], link["cause"]
    assert link["evidence"]["devices"]["mlx5-0"]["problem"] == "port DOWN"
    assert chain["verdict"] == "broken" and trace["ok"] is False
    assert chain["first_broken"] == list(CLAIM_LINK_NAMES).index("device-healthy")
    assert links_of(chain)["slice-published"]["status"] == "ok"  # still published, DOWN

    found = await api.findings(
        lambda f: any(item["evidence"]["kubelet_unhealthy"] for item in f["items"]),
        f"{UNHEALTHY} with the kubelet's Unhealthy",
    )
    (finding,) = found["items"]
    assert finding["rule"] == UNHEALTHY and finding["severity"] == "critical"
    assert finding["node"] == NODE
    assert finding["subject"] == f"claim/{NS}/{MINE[2]}/mlx5-0"
    evidence = finding["evidence"]
    assert evidence["claim"] == f"{NS}/{MINE[2]}"
    assert (evidence["device"], evidence["rdma_device"]) == ("mlx5-0", "mlx5_0")
    assert evidence["pods"] == evidence["kubelet_unhealthy"] == f"{NS}/{POD}"
    assert "port DOWN" in evidence["reason"]


async def test_slices_claims_health_and_the_pods_trace_through_both_services(
    nats_server: NatsServer, short_dir: Path
) -> None:
    api = aggregator_api(NODE, dra=True)
    settings = agent_settings(short_dir, nats_server.url)
    assert settings.dra is not None
    cdi_spec = settings.dra.cdi_dir / spec_file_name(UID_MINE)
    async with api, kmock.Server(api) as server:
        aggregator = AggregatorService(
            AggregatorSettings(
                nats_url=nats_server.url,
                listen_port=0,
                kube=KubeSettings(host=str(server.url)),
                identity="replica-a",
                dra_publish=True,
                watch=WATCH,
            )
        )
        async with running(aggregator), aiohttp.ClientSession() as http:
            await asyncio.wait_for(aggregator.ready.wait(), 15)
            agent = AgentService(settings)
            rest = Api(http, aggregator.api_url)
            async with (
                DraKubeletEmulator(settings.dra.plugins_registry_dir) as kubelet,
                running(agent),
            ):
                conn = await kubelet.plugin(DRIVER, timeout=15)
                await wait_until(
                    lambda: port_state(api.stored(SLICE), "mlx5-0") == "ACTIVE",
                    timeout=30,
                    what="the leader published the node's ResourceSlice",
                )
                published = api.stored(SLICE)
                assert published is not None
                assert published["spec"]["nodeName"] == NODE
                assert published["spec"]["pool"]["name"] == NODE
                names = sorted(d["name"] for d in published["spec"]["devices"])
                assert names == ["mlx5-0", "mlx5-1", "mlx5-2", "mlx5-3"]

                await conn.wait_health(lambda r: len(r.devices) == 4, timeout=15)
                await wait_until(lambda: agent.nats_connected, what="agent connected")
                await post_claim(api, scheduled(MINE, NODE, "mlx5-0", pod=POD))
                await post_claim(api, scheduled(ELSEWHERE, OTHER, "mlx5-0"))
                api.objects["v1/pods", NS, POD] = training_pod("Healthy")

                answer: api_pb2.NodePrepareResourcesResponse | None = None

                # The aggregator's watcher may not have the claims yet: a retryable
                # per-claim error until it does; wait for the answer, not a time.
                async def both_answered() -> bool:
                    nonlocal answer
                    answer = await conn.prepare(MINE, ELSEWHERE)
                    other = answer.claims[UID_OTHER].error
                    return answer.claims[UID_MINE].error == "" and "not allocated" in other

                await wait_until(both_answered, timeout=20, interval=0.1, what="claims answered")
                assert answer is not None
                mine = answer.claims[UID_MINE]
                assert [(d.pool_name, d.device_name) for d in mine.devices] == [(NODE, "mlx5-0")]
                assert list(mine.devices[0].cdi_device_ids) == [f"{DRIVER}/claim={UID_MINE}-mlx5-0"]
                assert answer.claims[UID_OTHER].devices == []
                assert f"not allocated on node {NODE}" in answer.claims[UID_OTHER].error
                assert cdi_spec.exists()
                assert not (settings.dra.cdi_dir / spec_file_name(UID_OTHER)).exists()

                await assert_the_pod_traces_ok(rest)
                code, out = await ctl_trace_pod(aggregator.api_url)
                assert code == 0, out
                printed = json.loads(out)
                assert [c["resource"] for c in printed["claims"]] == ["claim/nic"]
                assert [link["name"] for link in printed["claims"][0]["links"]] == list(
                    CLAIM_LINK_NAMES
                )
                assert printed["claims"][0]["verdict"] == "ok"

                port_down(settings.sysfs_root, "mlx5_0", 1)
                await wait_until(
                    lambda: port_state(api.stored(SLICE), "mlx5-0") == "DOWN",
                    timeout=30,
                    what="the port fault in the published slice",
                )
                assert port_state(api.stored(SLICE), "mlx5-1") == "ACTIVE"
                await conn.wait_health(
                    lambda r: health_of(r, "mlx5-0") == health_pb2.UNHEALTHY, timeout=15
                )
                assert "mlx5-0" in conn.unhealthy()
                assert "mlx5-1" not in conn.unhealthy()
                # What the kubelet writes on that health: the pod's device Unhealthy.
                api.objects["v1/pods", NS, POD] = training_pod("Unhealthy")
                await assert_the_port_fault_breaks_the_chain(rest)

                done = await conn.unprepare(MINE)
                assert done.claims[UID_MINE].error == ""
                assert not cdi_spec.exists()
                assert agent.dra is not None and agent.dra.state == "registered"
