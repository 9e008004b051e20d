"""No secret reaches the logs: an aggregator (embedded nats-server with NKey users, API
tokens) and an agent run as processes in debug JSON mode; requests with good and bad
tokens are served; every line of both logs is one JSON event and holds no seed or token."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agent.lab.render import render
from agent.lab.spec import load_builtin, with_node_name
from aggregator.bus.keys import provision
from tests.support.paths import REPO
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration
NODE = "logs-secret-01"
READ_TOKEN = "read-token-do-not-log-0123456789abcdef"
ADMIN_TOKEN = "admin-token-do-not-log-0123456789abcdef"
JSON_LOGS = ("--log-level", "debug", "--log-format", "json")


def spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, *args], cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


async def test_debug_json_logs_hold_no_token_and_no_seed(tmp_path: Path) -> None:
    keys = provision(tmp_path / "nats", (NODE,))
    tokens = tmp_path / "tokens"
    tokens.write_text(f"read {READ_TOKEN}\nadmin {ADMIN_TOKEN}\n")
    ready = tmp_path / "ready.json"
    tree = tmp_path / "tree"
    render(with_node_name(load_builtin("roce-cx6dx"), NODE), tree)
    logs = {"aggregator": tmp_path / "aggregator.log", "agent": tmp_path / "agent.log"}
    aggregator = spawn(
        ["-m", "aggregator", "run", *JSON_LOGS, "--listen", "127.0.0.1:0",
         "--ready-file", str(ready), "--nats-store-dir", str(tmp_path / "js"),
         "--nats-server-config", str(keys.config),
         "--nats-nkey-seed-file", str(keys.aggregator_seed),
         "--api-token-file", str(tokens)],
        logs["aggregator"],
    )  # fmt: skip
    agent: subprocess.Popen[bytes] | None = None
    try:

        def aggregator_ready() -> bool:
            assert aggregator.poll() is None, logs["aggregator"].read_text()[-3000:]
            return ready.exists()

        await wait_until(aggregator_ready, timeout=30, what="aggregator ready")
        urls = json.loads(ready.read_text())
        agent = spawn(
            ["-m", "agent", *JSON_LOGS, "run", "--nats-url", urls["nats_url"],
             "--nats-nkey-seed-file", str(keys.agent_seeds[NODE]), "--sysfs-root", str(tree),
             "--node-name", NODE, "--no-netlink", "--verbs", "off"],
            logs["agent"],
        )  # fmt: skip
        async with httpx.AsyncClient(base_url=urls["api_url"]) as http:
            bearer = {"Authorization": f"Bearer {READ_TOKEN}"}

            async def node_known() -> bool:
                response = await http.get("/api/v1/nodes", headers=bearer)
                assert response.status_code == 200, response.text
                return NODE in response.text

            await wait_until(node_known, timeout=30, what="the agent's node in the API")
            wrong = await http.get("/api/v1/nodes", headers={"Authorization": "Bearer x" * 3})
            assert wrong.status_code == 401
            admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            assert (await http.get("/metrics", headers=admin)).status_code == 200
    finally:
        if agent is not None:
            stop(agent)
        stop(aggregator)
    secrets = [READ_TOKEN, ADMIN_TOKEN, keys.aggregator_seed.read_text().strip(),
               keys.agent_seeds[NODE].read_text().strip()]  # fmt: skip
    for name, path in logs.items():
        text = path.read_text()
        events = [json.loads(line) for line in text.splitlines() if line.strip()]
        assert any(e["level"] == "debug" for e in events) or name == "agent", name
        assert any(e.get("node") == NODE for e in events) or name == "aggregator", name
        for secret in secrets:
            assert secret not in text, f"{name} log holds a secret"
