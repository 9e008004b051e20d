"""Hostile HTTP clients against a real `python -m aggregator run` (embedded nats-server,
no tokens) whose fd limit is 256 (RLIMIT_NOFILE set in the child): slowloris, nested and
oversize JSON bodies, cross-origin and non-JSON POSTs, and each bound's 503."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from aggregator.cli.main import main
from tests.support.livemetrics import families
from tests.support.paths import REPO
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

FD_LIMIT = 256
SLOWLORIS = 300
HEADER_TIMEOUT = 2.0
VALIDATIONS = "/api/v1/validations"
STREAM = "/api/v1/alerts/stream"
# One accept-error line per this many seconds at most (aggregator.api.limits default).
ACCEPT_LOG_INTERVAL = 10.0


@dataclass
class Aggregator:
    proc: subprocess.Popen[bytes]
    log: Path
    url: str

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        return host, int(port)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _fd_limit() -> None:  # runs in the child between fork and exec
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@pytest.fixture
def start(tmp_path: Path) -> Iterator[object]:
    started: list[subprocess.Popen[bytes]] = []

    def run(name: str, *flags: str) -> Aggregator:
        ready, log = tmp_path / f"{name}.ready", tmp_path / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "aggregator", "run", "--listen", "127.0.0.1:0",
                 "--ready-file", str(ready), "--nats-store-dir", str(tmp_path / f"{name}-js"),
                 "--log-format", "json", *flags],
                cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=_fd_limit,
            )  # fmt: skip
        started.append(proc)
        return Aggregator(proc, log, "")

    yield run
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


async def ready(agg: Aggregator, name: str, tmp: Path) -> Aggregator:
    ready_file = tmp / f"{name}.ready"

    def up() -> bool:
        assert agg.proc.poll() is None, agg.log_text()[-3000:]
        return ready_file.exists()

    await wait_until(up, timeout=30, what="aggregator ready")
    agg.url = json.loads(ready_file.read_text())["api_url"]
    return agg


def metric(agg: Aggregator, name: str, **labels: str) -> float:
    text = httpx.get(agg.url + "/metrics", timeout=10).text
    assert name in families(text), name
    total = 0.0
    for line in text.splitlines():
        series = line.split("{", 1)[0].split(" ", 1)[0]
        if series not in (name, name + "_total"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def get(agg: Aggregator, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    # Blocking is fine: the server is another process.
    return httpx.get(agg.url + path, headers=headers, timeout=10)


def healthz_answers(agg: Aggregator) -> bool:
    try:
        return httpx.get(agg.url + "/healthz", timeout=3).status_code == 200
    except httpx.HTTPError:
        return False


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True  # reset


async def test_300_slowloris_leave_healthz_answering_and_are_cut_at_the_header_timeout(
    start: object, tmp_path: Path
) -> None:
    agg = await ready(
        start("slow", "--http-header-timeout", str(HEADER_TIMEOUT)),  # type: ignore[operator]
        "slow",
        tmp_path,
    )
    lines_before = agg.log_text().count("\n")
    began = time.monotonic()
    hanging = []
    for _ in range(SLOWLORIS):  # a request line and one header, never the blank line
        sock = socket.create_connection(agg.address, timeout=10)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        hanging.append(sock)
    try:
        for sock in hanging:
            sock.setblocking(False)
        # While they hang: a new connection is answered (the oldest idle one makes room).
        await wait_until(lambda: healthz_answers(agg), timeout=15, what="/healthz 200")
        assert sum(closed_by_server(s) for s in hanging) < SLOWLORIS  # some still hang
        closed: set[int] = set()

        def all_closed() -> bool:
            closed.update(
                i for i, s in enumerate(hanging) if i not in closed and closed_by_server(s)
            )
            return len(closed) == SLOWLORIS

        await wait_until(all_closed, timeout=HEADER_TIMEOUT + 20, what="slowloris closed")
        took = time.monotonic() - began
    finally:
        for sock in hanging:
            sock.close()
    assert healthz_answers(agg)
    episode = agg.log_text().splitlines()[lines_before:]
    accept_lines = [line for line in episode if "accept" in line]
    # The numbers of docs/reliability.md (pytest -s shows them).
    print(f"all {SLOWLORIS} closed after {took:.1f} s; {len(accept_lines)} accept-error lines")
    # asyncio's own line (one per accept attempt, ~1,300/s before) never reaches the log;
    # ours is at most one per interval.
    assert not [line for line in episode if "socket.accept() out of system resource" in line]
    assert len(accept_lines) <= 1 + took / ACCEPT_LOG_INTERVAL
    assert metric(agg, "nicfleet_api_connections_closed", reason="header-timeout") > 0
    assert metric(agg, "nicfleet_api_connections_closed", reason="evicted") > 0


def post(agg: Aggregator, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(agg.url + VALIDATIONS, content=body, headers=headers, timeout=10)


def declared(agg: Aggregator, status: int) -> bool:
    doc = httpx.get(agg.url + "/api/v1/openapi.json", timeout=10).json()
    return str(status) in doc["paths"][VALIDATIONS]["post"]["responses"]


async def test_hostile_post_bodies_get_a_4xx_naming_the_bound(
    start: object, tmp_path: Path
) -> None:
    agg = await ready(start("bodies"), "bodies", tmp_path)  # type: ignore[operator]
    as_json = {"Content-Type": "application/json"}
    nested = post(agg, b"[" * 4096, as_json)
    assert nested.status_code == 400, nested.text  # was a 500: RecursionError in json.loads
    error = nested.json()["error"]
    assert (error["code"], error["field"]) == ("bad_request", "body")
    assert "deeper than 16 levels" in error["message"]
    deep_object = post(agg, b'{"a":' * 17 + b"1" + b"}" * 17, as_json)
    assert deep_object.status_code == 400
    assert "deeper than 16 levels" in deep_object.json()["error"]["message"]
    oversize = post(agg, b'{"nodes": "' + b"x" * 5000 + b'"}', as_json)
    assert oversize.status_code == 400
    assert "at most 4096 bytes" in oversize.json()["error"]["message"]
    assert declared(agg, 400)
    assert "Traceback" not in agg.log_text()
    assert healthz_answers(agg)  # still serving


async def test_no_token_mode_refuses_cross_origin_and_non_json_posts(
    start: object, tmp_path: Path
) -> None:
    agg = await ready(start("csrf"), "csrf", tmp_path)  # type: ignore[operator]
    body = json.dumps({"nodes": ["gpu-001", "gpu-002"], "resource": "rdma/ib"}).encode()
    evil = post(agg, body, {"Content-Type": "application/json", "Origin": "http://evil.example"})
    assert evil.status_code == 403, evil.text
    assert evil.json()["error"]["code"] == "cross_origin"
    assert "Origin 'http://evil.example'" in evil.json()["error"]["message"]
    # The CORS "simple request" a cross-site form or no-cors fetch sends without preflight.
    simple = post(agg, body, {"Content-Type": "text/plain"})
    assert simple.status_code == 415, simple.text
    assert simple.json()["error"]["code"] == "unsupported_media_type"
    assert declared(agg, 403) and declared(agg, 415)
    # Same origin, JSON: reaches the handler (no such nodes here: 404 naming the field).
    same = post(agg, body, {"Content-Type": "application/json", "Origin": agg.url})
    assert same.status_code == 404, same.text
    assert same.json()["error"]["field"].startswith("nodes")
    no_origin = post(agg, body, {"Content-Type": "application/json; charset=utf-8"})
    assert no_origin.status_code == 404, no_origin.text  # curl, nicfleetctl
    # GETs are unaffected by either rule.
    got = get(agg, VALIDATIONS, {"Origin": "http://evil.example"})
    assert got.status_code == 200


async def test_stream_and_in_flight_bounds_answer_503_and_spare_the_probes(
    start: object, tmp_path: Path
) -> None:
    agg = await ready(
        start(  # type: ignore[operator]
            "bounds", "--http-max-stream-clients", "2", "--http-max-in-flight", "3"
        ),
        "bounds",
        tmp_path,
    )
    async with httpx.AsyncClient(base_url=agg.url, timeout=10) as http:
        streams = []
        try:
            for _ in range(2):
                stream = http.stream("GET", STREAM)
                response = await stream.__aenter__()
                assert response.status_code == 200
                streams.append(stream)
            third = await http.get(STREAM)
            assert third.status_code == 503
            assert third.headers["Retry-After"] == "1"
            assert "--http-max-stream-clients" in third.json()["error"]["message"]
            # The refused stream holds no in-flight slot: 2 streams + this one = the bound.
            assert (await http.get("/api/v1/nodes")).status_code == 200
            assert (await http.get("/healthz")).status_code == 200
            assert (await http.get("/readyz")).status_code == 200
        finally:
            for stream in streams:
                await stream.__aexit__(None, None, None)
    assert metric(agg, "nicfleet_api_requests_refused", bound="stream-clients") == 1


async def test_in_flight_bound_answers_503_with_retry_after(start: object, tmp_path: Path) -> None:
    agg = await ready(
        start("inflight", "--http-max-in-flight", "2"),  # type: ignore[operator]
        "inflight",
        tmp_path,
    )
    held = []
    try:
        for _ in range(2):  # POST heads whose bodies never come: two requests in flight
            sock = socket.create_connection(agg.address, timeout=10)
            sock.sendall(
                b"POST /api/v1/validations HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
            )
            held.append(sock)

        def refused() -> bool:
            return get(agg, "/api/v1/nodes").status_code == 503

        await wait_until(refused, what="a third request refused")
        busy = get(agg, "/api/v1/nodes")
        assert busy.headers["Retry-After"] == "1"
        assert busy.json()["error"]["code"] == "overloaded"
        assert "--http-max-in-flight" in busy.json()["error"]["message"]
        assert healthz_answers(agg)  # probes are exempt
    finally:
        for sock in held:
            sock.close()
    await wait_until(
        lambda: get(agg, "/api/v1/nodes").status_code == 200,
        what="slots freed when the clients went away",
    )
    assert metric(agg, "nicfleet_api_requests_refused", bound="in-flight") >= 1
    assert "Traceback" not in agg.log_text()


async def test_over_the_connection_bound_with_none_idle_a_new_one_gets_503(
    start: object, tmp_path: Path
) -> None:
    agg = await ready(
        start(  # type: ignore[operator]
            "conns", "--http-max-connections", "16", "--http-max-stream-clients", "64"
        ),
        "conns",
        tmp_path,
    )
    clients = [httpx.AsyncClient(base_url=agg.url, timeout=10) for _ in range(16)]
    streams = [c.stream("GET", STREAM) for c in clients]
    try:
        for stream in streams:
            assert (await stream.__aenter__()).status_code == 200
        refused = get(agg, "/healthz")
        assert refused.status_code == 503
        assert "--http-max-connections" in refused.json()["error"]["message"]
    finally:
        for stream in streams:
            await stream.__aexit__(None, None, None)
        for client in clients:
            await client.aclose()
    await wait_until(lambda: healthz_answers(agg), what="/healthz once streams closed")
    assert metric(agg, "nicfleet_api_connections_closed", reason="refused") >= 1


def test_the_default_listen_address_is_loopback() -> None:
    run = main.commands["run"]
    listen = next(p for p in run.params if p.name == "listen")
    assert listen.default == "127.0.0.1:8080"
