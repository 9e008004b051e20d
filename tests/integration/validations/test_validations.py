"""Pair validations end to end: the API, the runner, kmock's Kubernetes API over HTTP and a
real nats-server. The test's `Kubelet` starts the pods and publishes what verify pods would;
every way out (done, timeout, pod failure, shutdown) must leave no pod behind."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx
import nats
import pytest
import requests
from schemathesis import GenerationMode

from aggregator.bus.natsserver import NatsServer
from aggregator.validations.record import ValidationSettings, abandoned, new_record
from aggregator.validations.request import ValidationRequest
from aggregator.validations.runner import KV_VALIDATIONS, ValidationStore
from proto.codec import decode
from proto.http import ValidationRecord
from proto.messages.validation import ValidationResult
from tests.integration.api.test_api_schema import CHECKS, generate, load, operations
from tests.support.validation_fixtures import (
    FAST,
    NS,
    RES,
    Stack,
    answer,
    stack_in_thread,
    validation_stack,
)
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration
REQUEST = ValidationRequest(nodes=("gpu-001", "gpu-002"), resource=RES)


async def post(stack: Stack, body: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=stack.url) as http:
        return await http.post("/api/v1/validations", json=body)


async def get(stack: Stack, path: str, **params: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=stack.url) as http:
        return await http.get(path, params=params)


async def final(stack: Stack, validation_id: str) -> dict[str, Any]:
    """Poll GET /api/v1/validations/{id} until the phase is final; the record."""
    box: dict[str, Any] = {}

    async def finished() -> bool:
        body = (await get(stack, f"/api/v1/validations/{validation_id}")).json()
        box["record"] = body
        return body["phase"] in ("done", "failed", "timed-out")

    await wait_until(finished, timeout=20, interval=0.05, what=f"validation {validation_id}")
    record: dict[str, Any] = box["record"]
    return record


def pair(a: str = "gpu-001", b: str = "gpu-002", resource: str = RES) -> dict[str, Any]:
    return {"nodes": [a, b], "resource": resource}


def counted(stack: Stack, outcome: str) -> float:
    value = stack.registry.get_sample_value(
        "nicfleet_validation_messages_total", {"outcome": outcome}
    )
    return value or 0.0


async def test_pair_validation_creates_pins_collects_deletes_and_stores(
    nats_server: NatsServer,
) -> None:
    async with validation_stack(nats_server.url) as stack:
        response = await post(
            stack, {"nodes": ["gpu-001", "gpu-002"], "resource": RES, "network": "ml/ib-net"}
        )
        assert response.status_code == 202, response.text
        created = response.json()
        vid = created["id"]
        assert created["phase"] == "pending"
        assert response.headers["Location"] == f"/api/v1/validations/{vid}"
        record = await final(stack, vid)

        assert record["phase"] == "done", record
        assert record["passed"] is True
        assert record["bytes_per_second"] == 24e9
        assert record["server_ip"] == "10.0.0.1"
        assert record["pods_deleted"] is True
        assert record["server"]["verdict"] == record["client"]["verdict"] == "rdma-path"
        server = stack.kubelet.seen[f"nicfleet-validate-{vid}-server"]
        client = stack.kubelet.seen[f"nicfleet-validate-{vid}-client"]
        for pod, node in ((server, "gpu-001"), (client, "gpu-002")):
            assert pod["metadata"]["namespace"] == NS
            assert pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "ml/ib-net"
            container = pod["spec"]["containers"][0]
            assert container["resources"]["limits"][RES] == "1"
            terms = pod["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]["nodeSelectorTerms"]
            assert terms[0]["matchFields"][0]["values"] == [node]
            assert pod["spec"]["restartPolicy"] == "Never"
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["NICFLEET_VALIDATION_ID"] == vid
        assert server["spec"]["containers"][0]["args"][-1] == "--serve"
        assert client["spec"]["containers"][0]["args"][-2:] == ["--peer", "10.0.0.1"]
        assert stack.kubelet.pods() == {}  # both deleted

        kv = await stack.nc.jetstream().key_value(KV_VALIDATIONS)
        entry = await kv.get(vid)
        assert entry.value is not None
        listed = (await get(stack, "/api/v1/validations", node="gpu-002")).json()
        assert [item["id"] for item in listed["items"]][:1] == [vid]
        assert stack.store.latest_for("gpu-001", RES) is not None
        assert counted(stack, "accepted") == 2
        trace = (await get(stack, "/api/v1/trace", node="gpu-002", resource=RES)).json()
        last = trace["links"][-1]
        assert (last["name"], last["status"]) == ("tested-data-path", "ok")
        assert (last["evidence"]["validation"], last["evidence"]["bytes_per_second"]) == (
            vid,
            24e9,
        )


async def test_peer_that_never_answers_times_out_and_pods_are_deleted(
    nats_server: NatsServer,
) -> None:
    def server_only(vid: str, role: str, node: str) -> list[ValidationResult | bytes]:
        return [answer(vid, role, node)] if role == "server" else []

    async with validation_stack(nats_server.url, script=server_only) as stack:
        vid = (await post(stack, {"nodes": ["gpu-001", "gpu-003"], "resource": RES})).json()["id"]
        record = await final(stack, vid)
        assert record["phase"] == "timed-out"
        assert record["reason"] == (
            "the client on gpu-003 never answered within 1s after its peer reported"
        )
        assert record["passed"] is False
        assert record["pods_deleted"] is True
        assert stack.kubelet.pods() == {}


async def test_server_pod_that_never_gets_an_ip_times_out(nats_server: NatsServer) -> None:
    settings = ValidationSettings(**{**FAST.__dict__, "start_timeout_s": 0.5})
    async with validation_stack(nats_server.url, settings=settings) as stack:
        stack.kubelet.auto_start = False
        vid = (await post(stack, {"nodes": ["gpu-002", "gpu-001"], "resource": RES})).json()["id"]
        await wait_until(lambda: bool(stack.kubelet.seen), what="server pod")
        stack.kubelet.set_status(
            f"nicfleet-validate-{vid}-server",
            {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes are available: 1 Insufficient rdma/ib.",
                    }
                ],
            },
        )
        record = await final(stack, vid)
        assert record["phase"] == "timed-out"
        assert record["reason"].startswith("server pod on gpu-002 got no IP within 0.5s")
        assert "Insufficient rdma/ib" in record["reason"]
        assert list(stack.kubelet.seen) == [f"nicfleet-validate-{vid}-server"]  # no client
        assert stack.kubelet.pods() == {}


async def test_pod_that_fails_without_a_result_fails_the_validation(
    nats_server: NatsServer,
) -> None:
    async with validation_stack(nats_server.url) as stack:
        stack.kubelet.auto_start = False
        vid = (await post(stack, {"nodes": ["gpu-001", "gpu-002"], "resource": RES})).json()["id"]
        name = f"nicfleet-validate-{vid}-server"
        await wait_until(lambda: name in stack.kubelet.seen, what="server pod")
        terminated = {"reason": "Error", "exitCode": 2, "message": "no RDMA device"}
        stack.kubelet.set_status(
            name,
            {"phase": "Failed", "containerStatuses": [{"state": {"terminated": terminated}}]},
        )
        record = await final(stack, vid)
        assert record["phase"] == "failed"
        assert record["reason"] == (
            "the server pod on gpu-001 ended (Failed: Error, exit code 2: no RDMA device) "
            "without a result"
        )
        assert stack.kubelet.pods() == {}


async def test_malformed_and_foreign_messages_are_counted_and_ignored(
    nats_server: NatsServer,
) -> None:
    def noisy(vid: str, role: str, node: str) -> list[ValidationResult | bytes]:
        good = answer(vid, role, node)
        if role == "client":
            return [good]
        return [
            b"\x00not msgpack",
            b"\x81\xa6schema\xa4nope",  # a map with an unknown tag
            answer("someone-else", role, node),
            answer(vid, role, "gpu-009"),  # the wrong node
            good,
            good,  # a second server result
        ]

    async with validation_stack(nats_server.url, script=noisy) as stack:
        vid = (await post(stack, {"nodes": ["gpu-001", "gpu-002"], "resource": RES})).json()["id"]
        record = await final(stack, vid)
        assert (record["phase"], record["passed"]) == ("done", True)
        assert counted(stack, "malformed") == 2
        assert counted(stack, "rejected") >= 2  # the duplicate may arrive after the end
        assert counted(stack, "accepted") == 2


async def test_shutdown_deletes_the_pods_and_records_why(nats_server: NatsServer) -> None:
    async with validation_stack(nats_server.url) as stack:
        stack.kubelet.auto_start = False
        vid = (await post(stack, {"nodes": ["gpu-001", "gpu-002"], "resource": RES})).json()["id"]
        await wait_until(lambda: bool(stack.kubelet.pods()), what="server pod")
        stack.stop.set()
        await wait_until(
            lambda: (r := stack.store.get(vid)) is not None and r.phase == "failed",
            what="abandoned record",
        )
        record = stack.store.get(vid)
        assert record is not None
        assert record.reason == "the aggregator stopped before the validation finished"
        assert record.pods_deleted
        assert stack.kubelet.pods() == {}
        kv = await stack.nc.jetstream().key_value(KV_VALIDATIONS)
        stored = decode((await kv.get(vid)).value or b"", ValidationRecord)
        assert stored.phase == "failed"


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        pytest.param(pair("gpu-001", "gpu-00"), 404, "nodes[1]", id="unknown-node"),
        pytest.param(pair("gpu-001", "gpu-009"), 409, "resource", id="not-advertised"),
        pytest.param(pair("gpu-001", "gpu-001"), 400, "nodes", id="same-node"),
        pytest.param(pair(resource="ib"), 400, "resource", id="bad-resource"),
        pytest.param({**pair(), "x": 1}, 400, "x", id="unknown-field"),
        pytest.param(["gpu-001"], 400, "body", id="not-an-object"),
    ],
)  # fmt: skip
async def test_bad_requests_create_no_pod(
    own_nats: NatsServer, body: Any, status: int, field: str
) -> None:
    async with validation_stack(own_nats.url) as stack:
        response = await post(stack, body)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["field"] == field
        if status == 404:
            assert error["suggestions"] and all(
                s.startswith("gpu-00") for s in error["suggestions"]
            )
        if status == 409:
            assert error["message"] == (
                "rdma/ib is not advertised on gpu-009; advertised on: gpu-001, gpu-002, gpu-003"
            )
        assert list(stack.emulator) == []  # not one Kubernetes API call
        assert (await get(stack, "/api/v1/validations")).json()["count"] == 0


async def test_bad_json_unknown_ids_and_no_cluster(nats_server: NatsServer) -> None:
    async with (
        validation_stack(nats_server.url, with_cluster=False) as stack,
        httpx.AsyncClient(base_url=stack.url) as http,
    ):
        as_json = {"Content-Type": "application/json"}  # no tokens: JSON only (docs/security.md)
        bad = await http.post("/api/v1/validations", content=b"{nodes:", headers=as_json)
        assert (bad.status_code, bad.json()["error"]["field"]) == (400, "body")
        huge = await http.post("/api/v1/validations", content=b" " * 5000, headers=as_json)
        assert (huge.status_code, huge.json()["error"]["field"]) == (400, "body")
        missing = await http.get("/api/v1/validations/abc")
        assert (missing.status_code, missing.json()["error"]["field"]) == (404, "id")
        invalid = await http.get("/api/v1/validations/Not_An_Id")
        assert (invalid.status_code, invalid.json()["error"]["field"]) == (400, "id")
        limit = await http.get("/api/v1/validations", params={"limit": "0"})
        assert (limit.status_code, limit.json()["error"]["field"]) == (400, "limit")
        good = {"nodes": ["gpu-001", "gpu-002"], "resource": RES}
        nope = await http.post("/api/v1/validations", json=good)
        assert nope.status_code == 503
        assert "Kubernetes API" in nope.json()["error"]["message"]
        doc = (await http.get("/api/v1/openapi.json")).json()
        assert set(doc["paths"]["/api/v1/validations"]) == {"get", "post"}
        assert "/api/v1/validations/{id}" in doc["paths"]


async def test_queue_full_answers_429(nats_server: NatsServer) -> None:
    settings = ValidationSettings(**{**FAST.__dict__, "max_running": 1, "max_queued": 1})
    async with validation_stack(nats_server.url, settings=settings) as stack:
        stack.kubelet.auto_start = False  # the first one holds the only slot
        good = {"nodes": ["gpu-001", "gpu-002"], "resource": RES}
        assert (await post(stack, good)).status_code == 202
        await wait_until(lambda: bool(stack.kubelet.seen), what="first validation running")
        assert (await post(stack, good)).status_code == 202  # queued
        busy = await post(stack, good)
        assert busy.status_code == 429
        assert busy.headers["Retry-After"] == "10"


def test_schemathesis_on_the_validation_routes(own_nats: NatsServer) -> None:
    """The served document describes what the routes answer: fuzzed bodies, ids and queries
    (the same checks as test_api_schema, which serves no NATS and so no validations)."""
    with stack_in_thread(own_nats.url) as stack:
        schema = load(stack.url, {})
        seen: Counter[int] = Counter()
        with requests.Session() as session:
            for operation in operations(schema):
                if not operation.path.startswith("/api/v1/validations"):
                    continue
                for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                    generate(operation, mode, 15, stack.url, session, {}, seen)
            post_op = schema["/api/v1/validations"]["POST"]
            for body, status in ((pair(), 202), (pair("gpu-001", "gpu-009"), 409)):
                response = post_op.Case(body=body).call_and_validate(
                    base_url=stack.url, session=session, checks=CHECKS
                )
                assert response.status_code == status, response.text
                seen[status] += 1
            vid = stack.store.recent(1)[0].id
            get_op = schema["/api/v1/validations/{id}"]["GET"]
            response = get_op.Case(path_parameters={"id": vid}).call_and_validate(
                base_url=stack.url, session=session, checks=CHECKS
            )
            assert response.status_code == 200
        assert seen[500] == 0
        assert seen[400] > 0 and seen[200] > 0


async def test_kubernetes_api_errors_fail_the_validation_with_the_reason(
    own_nats: NatsServer,
) -> None:
    async with validation_stack(own_nats.url, pods_api=False) as stack:
        vid = (await post(stack, pair())).json()["id"]
        record = await final(stack, vid)
        assert record["phase"] == "failed"
        assert record["reason"].startswith(
            f"Kubernetes API: create Pod {NS}/nicfleet-validate-{vid}-server: "
        )
        assert record["pods_deleted"] is True  # 404 on delete: nothing was there
        trace = (await get(stack, "/api/v1/trace", node="gpu-001", resource=RES)).json()
        assert trace["links"][-1]["status"] == "broken"
        assert "Kubernetes API: create Pod" in trace["links"][-1]["cause"]


async def test_no_pod_template_answers_503(own_nats: NatsServer) -> None:
    async with validation_stack(own_nats.url, with_template=False) as stack:
        response = await post(stack, pair())
        assert response.status_code == 503
        assert "--validation-template" in response.json()["error"]["message"]
        assert list(stack.emulator) == []


async def test_every_replica_sees_every_validation(own_nats: NatsServer) -> None:
    """Two stores on one bucket (two replicas): a record written by one reaches the other,
    including records written before it started; an older write never replaces a newer."""
    nc = await nats.connect(own_nats.url)
    try:
        first = await ValidationStore.open(nc, keep=10)
        early = abandoned(new_record(REQUEST, id="early1", namespace=NS, runner="a", now=1.0),
                          "r", 2.0)  # fmt: skip
        await first.put(early)
        second = await ValidationStore.open(nc, keep=10)
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(second.run(stop))
            await wait_until(lambda: second.get("early1") == early, what="initial values")
            late = new_record(REQUEST, id="late1", namespace=NS, runner="a", now=3.0)
            await first.put(late)
            await wait_until(lambda: second.get("late1") == late, what="a live update")
            assert [r.id for r in second.recent(5)][:2] == ["late1", "early1"]
            assert second.latest_for("gpu-001", RES) == early  # late1 is not final
            stop.set()
    finally:
        await nc.drain()
