"""A pod's trace on sharded replicas (docs/scaling.md, "API"): every replica lists every
pod, but only the holder of the pod's node has that node's record, so
`/api/v1/trace/pods/NS/NAME` is forwarded there by the node the pod is bound to, on real
aiohttp servers (127.0.0.1)."""

from __future__ import annotations

import nats
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from aggregator.api.shards import FORWARDED_BY, SERVED_BY, add_shard_routes, node_of
from aggregator.fleet.state import Fleet
from aggregator.replicas.owner import ShardOwner
from aggregator.replicas.partitions import ShardSettings
from tests.support.builders import T0
from tests.support.chain_fixtures import ChainHarness, chain_fleet
from tests.support.pod_trace_fixtures import pod_cluster

P = 12


class Now:
    def __call__(self) -> float:
        return T0


def owner_of(name: str, fleet: Fleet) -> ShardOwner:
    """A ShardOwner never started: its plan and its peers' URLs are set by the test."""
    return ShardOwner(
        nats.NATS(), ShardSettings(partitions=P), identity=name, fleet=fleet,
        nodes_kv=None,  # type: ignore[arg-type]
        handle=lambda _s, _d: True, on_change=lambda _n, _k: None, resync=lambda _p: None,
        clock=Now(),
    )  # fmt: skip


def replica_app(owner: ShardOwner, fleet: Fleet) -> web.Application:
    app = ChainHarness(fleet=fleet, cluster=pod_cluster()).app()
    add_shard_routes(app, owner, fleet, lambda: ())
    return app


def test_a_pod_trace_asks_about_the_pods_node() -> None:
    app = ChainHarness(cluster=pod_cluster()).app()
    assert node_of(make_mocked_request("GET", "/api/v1/trace/pods/ml/t-0", app=app)) == "gpu-001"
    pending = make_mocked_request("GET", "/api/v1/trace/pods/ml/t-9", app=app)
    assert node_of(pending) is None  # not bound: answered here
    assert node_of(make_mocked_request("GET", "/api/v1/trace/pods/ml/nope", app=app)) is None
    assert node_of(make_mocked_request("GET", "/api/v1/trace/pods/ml", app=app)) is None


async def test_a_pod_trace_is_answered_by_the_holder_of_its_node() -> None:
    mine, theirs = Fleet(), chain_fleet()  # b holds gpu-001 and gpu-002, a holds nothing
    a, b = owner_of("a", mine), owner_of("b", theirs)
    for owner in (a, b):
        owner.owners = dict.fromkeys(range(P), "b")
    async with TestServer(replica_app(b, theirs), host="127.0.0.1") as server_b:
        a.api_urls["b"] = str(server_b.make_url("")).rstrip("/")
        b.owners = dict.fromkeys(range(P), "a")  # b's plan is stale: must not bounce back
        b.api_urls["a"] = "http://127.0.0.1:9"  # never called
        async with TestClient(TestServer(replica_app(a, mine), host="127.0.0.1")) as client:
            reply = await client.get("/api/v1/trace/pods/ml/t-0")
            assert reply.status == 200 and reply.headers[SERVED_BY] == "b"
            body = await reply.json()
            assert (body["node"], body["ok"]) == ("gpu-001", True)
            (chain,) = body["traces"]
            assert chain["links"][0]["name"] == "agent"
            assert chain["links"][0]["status"] == "ok"  # b has the node's record
            pending = await client.get("/api/v1/trace/pods/ml/t-9")  # no node: answered here
            assert pending.status == 200 and SERVED_BY not in pending.headers
            assert (await pending.json())["traces"] == []
            unknown = await client.get("/api/v1/trace/pods/ml/t-00")
            assert unknown.status == 404 and SERVED_BY not in unknown.headers
            bad = await client.get("/api/v1/trace/pods/ML/t-0")
            assert bad.status == 400 and (await bad.json())["error"]["field"] == "namespace"
            # Already forwarded (b's view of the plan is stale): answered where it lands.
            here = await client.get("/api/v1/trace/pods/ml/t-0", headers={FORWARDED_BY: "b"})
            assert here.status == 200 and here.headers[SERVED_BY] == "a"
            (local,) = (await here.json())["traces"]
            assert local["links"][0]["status"] == "broken"  # a has no record of gpu-001
