"""`nicfleetctl --token-file` and `nicfleet-aggregator run --api-token-file`, for real."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from aggregator.api.auth import parse_token_file
from aggregator.cli.main import main as aggregator_cli
from aggregator.ctl.main import cli
from tests.integration.api.test_api_auth import ADMIN, READ, TOKENS, app_with
from tests.support.api_fixtures import serve_in_thread

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serve_in_thread(app_with(parse_token_file(TOKENS, source="tokens"))) as url:
        yield url


def ctl(*args: str, env: dict[str, str | None] | None = None) -> Result:
    base: dict[str, str | None] = {
        "NICFLEET_SERVER": None,
        "NICFLEET_TOKEN_FILE": None,
        "NO_COLOR": "1",
    }
    return CliRunner().invoke(cli, list(args), env={**base, **(env or {})}, prog_name="nicfleetctl")


def token_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "token"
    path.write_text(text)
    return str(path)


def test_token_file_option(server: str, tmp_path: Path) -> None:
    result = ctl("--server", server, "--token-file", token_file(tmp_path, f"{READ}\n"), "nodes")
    assert result.exit_code == 0, result.output
    assert "gpu-001" in result.stdout


def test_token_file_from_env_and_every_command(server: str, tmp_path: Path) -> None:
    env: dict[str, str | None] = {"NICFLEET_TOKEN_FILE": token_file(tmp_path, f"  {ADMIN}  \n")}
    for args in (("nodes", "-o", "json"), ("node", "gpu-002"), ("resources",)):
        result = ctl("--server", server, *args, env=env)
        assert result.exit_code == 0, (args, result.output)


def test_missing_token_is_refused_with_exit_4(server: str) -> None:
    result = ctl("--server", server, "nodes")
    assert result.exit_code == 4, result.output
    assert f"authentication refused by {server}" in result.stderr
    assert "check --token-file" in result.stderr


def test_wrong_token_is_refused_with_exit_4(server: str, tmp_path: Path) -> None:
    wrong = "wrong-token-0123456789abcdef"
    result = ctl("--server", server, "--token-file", token_file(tmp_path, wrong), "node", "gpu-001")
    assert result.exit_code == 4, result.output
    assert "invalid bearer token" in result.stderr
    assert wrong not in result.output


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("", "exactly one token", id="empty"),
        pytest.param("two tokens\n", "exactly one token", id="two-words"),
    ],
)
def test_unusable_token_file_is_a_usage_error(tmp_path: Path, text: str, fragment: str) -> None:
    result = ctl("--token-file", token_file(tmp_path, text), "nodes")
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr


def test_missing_token_file_is_a_usage_error(tmp_path: Path) -> None:
    result = ctl("--token-file", str(tmp_path / "absent"), "nodes")
    assert result.exit_code == 2, result.output
    assert "cannot read" in result.stderr


def test_help_documents_exit_code_4() -> None:
    result = ctl("nodes", "--help")
    assert "4  authentication refused" in result.stdout
    assert "NICFLEET_TOKEN_FILE" in ctl("--help").stdout


@pytest.mark.parametrize(
    ("text", "where"),
    [
        pytest.param(f"read {READ}\nbogus {ADMIN}\n", ":2: scope must be", id="bad-scope"),
        pytest.param("# nothing\n", ": no tokens", id="no-tokens"),
    ],
)
def test_aggregator_refuses_a_bad_token_file(tmp_path: Path, text: str, where: str) -> None:
    path = token_file(tmp_path, text)
    result = CliRunner().invoke(aggregator_cli, ["run", "--api-token-file", path])
    assert result.exit_code == 2, result.output
    assert f"error: --api-token-file: {path}" in result.stderr
    assert where in result.stderr
    assert READ not in result.output and ADMIN not in result.output


def test_aggregator_refuses_a_missing_token_file(tmp_path: Path) -> None:
    path = str(tmp_path / "absent")
    result = CliRunner().invoke(aggregator_cli, ["run", "--api-token-file", path])
    assert result.exit_code == 2, result.output
    assert "cannot read" in result.stderr
