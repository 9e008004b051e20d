"""nicfleetctl's errors a person can act on, its context file and shell completion, against
real aggregator APIs on 127.0.0.1 (an unreachable server is a closed port)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from aggregator.api.auth import parse_token_file
from aggregator.ctl.main import cli
from aggregator.fleet.state import Fleet
from tests.integration.api.test_api_auth import READ, TOKENS, app_with
from tests.support.api_fixtures import Harness, sample_fleet, serve_in_thread

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serve_in_thread(Harness(fleet=sample_fleet()).app()) as url:
        yield url


@pytest.fixture(scope="module")
def secured() -> Iterator[str]:
    with serve_in_thread(app_with(parse_token_file(TOKENS, source="tokens"))) as url:
        yield url


@pytest.fixture
def closed_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    return tmp_path / "nicfleet" / "config.yaml"


def ctl(*args: str, config: Path | None = None, env: dict[str, str] | None = None) -> Result:
    base: dict[str, str | None] = {
        "NICFLEET_SERVER": None,
        "NICFLEET_TOKEN_FILE": None,
        "NICFLEET_CONFIG": str(config) if config else "/nonexistent/nicfleet-config.yaml",
        "NO_COLOR": "1",
    }
    return CliRunner().invoke(cli, list(args), env={**base, **(env or {})}, prog_name="nicfleetctl")


def write_config(path: Path, contexts: list[dict[str, str]], current: str | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, object] = {"contexts": contexts}
    if current:
        doc["current-context"] = current
    path.write_text(yaml.safe_dump(doc))


def test_unreachable_names_url_source_and_how_to_set_it(closed_url: str) -> None:
    result = ctl("--server", closed_url, "nodes")
    assert result.exit_code == 3
    assert f"cannot reach nicfleet aggregator at {closed_url} (from --server)" in result.stderr
    for hint in ("--server URL", "NICFLEET_SERVER", "nicfleetctl config set-context"):
        assert hint in result.stderr
    env = ctl("node", "gpu-001", env={"NICFLEET_SERVER": closed_url})
    assert env.exit_code == 3
    assert f"at {closed_url} (from NICFLEET_SERVER)" in env.stderr


def test_unreachable_from_a_context(closed_url: str, config_file: Path) -> None:
    write_config(config_file, [{"name": "lab", "server": closed_url}], "lab")
    result = ctl("resources", config=config_file)
    assert result.exit_code == 3
    assert f"at {closed_url} (from context 'lab' in {config_file})" in result.stderr


def test_auth_refused_names_the_token_file(secured: str, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.token"
    wrong.write_text("wrong-token-0123456789abcdef\n")
    result = ctl("--server", secured, "--token-file", str(wrong), "topology", "gpu-001")
    assert result.exit_code == 4
    assert f"sent the token in {wrong} (from --token-file)" in result.stderr
    env = ctl("--server", secured, "nodes", env={"NICFLEET_TOKEN_FILE": str(wrong)})
    assert env.exit_code == 4
    assert "(from NICFLEET_TOKEN_FILE)" in env.stderr
    none = ctl("--server", secured, "nodes")
    assert none.exit_code == 4
    assert "no token was sent: check --token-file" in none.stderr


def test_token_from_the_context_is_used_and_named(
    secured: str, tmp_path: Path, config_file: Path
) -> None:
    (config_file.parent).mkdir(parents=True)
    (config_file.parent / "read.token").write_text(READ)
    (config_file.parent / "bad.token").write_text("bad-token-0123456789abcdef")
    contexts = [
        {"name": "good", "server": secured, "token-file": "read.token"},  # relative: to the file
        {"name": "bad", "server": secured, "token-file": "bad.token"},
    ]
    write_config(config_file, contexts, "good")
    assert ctl("nodes", config=config_file).exit_code == 0
    result = ctl("--context", "bad", "nodes", config=config_file)
    assert result.exit_code == 4
    assert f"{config_file.parent / 'bad.token'} (from context 'bad' in {config_file})" in (
        result.stderr
    )


def test_unknown_node_lists_close_matches(server: str) -> None:
    for command in ("node", "topology"):
        result = ctl("--server", server, command, "gpu-02")
        assert result.exit_code == 1
        assert "unknown node 'gpu-02'; did you mean: " in result.stderr
        assert "gpu-002" in result.stderr
    far = ctl("--server", server, "node", "zzzzzzzz")
    assert far.exit_code == 1
    assert "none of the 5 known nodes is close (see `nicfleetctl nodes`)" in far.stderr


def test_empty_fleet_says_what_to_check() -> None:
    with serve_in_thread(Harness(fleet=Fleet()).app()) as empty:
        result = ctl("--server", empty, "nodes")
        unknown = ctl("--server", empty, "node", "gpu-001")
    assert result.exit_code == 0
    assert result.stdout == ""
    for hint in (
        "has heard from no agent yet",
        "agents running",
        "--nats-url",
        "nicfleetctl check",
    ):
        assert hint in result.stderr
    assert "the aggregator knows no node yet" in unknown.stderr


def test_empty_state_filter(server: str) -> None:
    with serve_in_thread(Harness(fleet=Fleet()).app()) as empty:
        result = ctl("--server", empty, "nodes", "--state", "stale")
    assert "None is in state stale" in result.stderr


def test_precedence_flag_env_context_default(
    server: str, closed_url: str, config_file: Path
) -> None:
    write_config(config_file, [{"name": "down", "server": closed_url}], "down")
    assert ctl("nodes", config=config_file).exit_code == 3  # context
    env = {"NICFLEET_SERVER": server}
    assert ctl("nodes", config=config_file, env=env).exit_code == 0  # env beats context
    flag = ctl("--server", closed_url, "nodes", config=config_file, env=env)
    assert flag.exit_code == 3  # flag beats env
    assert "(from --server)" in flag.stderr


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("contexts: [\n", ":2: not valid YAML", id="bad-yaml"),
        pytest.param("contexts: []\nserver: x\n", ":2: $.server: unknown key", id="unknown-key"),
        pytest.param(
            "contexts:\n- name: a\n", ":2: $.contexts[0].server: is required", id="no-server"
        ),
        pytest.param(
            "contexts:\n- name: a\n  server: ftp://x\n", ":3: $.contexts[0].server", id="bad-url"
        ),
    ],
)
def test_bad_context_file_is_exit_2_naming_file_line_field(
    server: str, config_file: Path, text: str, fragment: str
) -> None:
    config_file.parent.mkdir(parents=True)
    config_file.write_text(text)
    result = ctl("--server", server, "nodes", config=config_file)
    assert result.exit_code == 2, result.output
    assert f"{config_file}{fragment}" in result.stderr
    assert "Traceback" not in result.output
    # Offline commands do not need it.
    assert ctl("completion", "bash", config=config_file).exit_code == 0


def test_bad_server_in_env_is_exit_2() -> None:
    result = ctl("nodes", env={"NICFLEET_SERVER": "localhost:8080"})
    assert result.exit_code == 2
    assert "NICFLEET_SERVER: 'localhost:8080' is not an http(s) URL" in result.stderr


def test_unknown_context_is_exit_2(config_file: Path) -> None:
    write_config(config_file, [{"name": "a", "server": "http://127.0.0.1:1"}], None)
    result = ctl("--context", "b", "nodes", config=config_file)
    assert result.exit_code == 2
    assert "no context named 'b' (have: a)" in result.stderr


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts(shell: str) -> None:
    result = ctl("completion", shell)
    assert result.exit_code == 0, result.output
    assert "_NICFLEETCTL_COMPLETE" in result.stdout
    assert (
        f"{shell}_complete" in result.stdout
        or f"{shell}_source" in result.stdout
        or ("complete" in result.stdout)
    )


def test_completion_of_commands_and_node_names(server: str, closed_url: str) -> None:
    def complete(words: str, env: dict[str, str] | None = None) -> list[str]:
        result = CliRunner().invoke(
            cli,
            [],
            prog_name="nicfleetctl",
            env={
                "_NICFLEETCTL_COMPLETE": "bash_complete",
                "COMP_WORDS": words,
                "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
                "NICFLEET_CONFIG": "/nonexistent/config.yaml",
                **(env or {}),
            },
        )
        assert result.exit_code == 0, result.output
        return [line.split(",", 1)[1] for line in result.stdout.splitlines() if line]

    assert "topology" in complete("nicfleetctl to")
    assert complete(f"nicfleetctl --server {server} node gpu-00") == [
        "gpu-001", "gpu-002", "gpu-003",
    ]  # fmt: skip
    assert complete("nicfleetctl topology ro", {"NICFLEET_SERVER": server}) == ["roce-01"]
    assert complete(f"nicfleetctl --server {server} trace gpu-01") == ["gpu-010"]
    assert complete(f"nicfleetctl --server {server} findings --node r") == ["roce-01"]
    assert complete(f"nicfleetctl --server {closed_url} node g") == []  # quietly nothing
