"""nicfleetctl's context file: validation (file, line, field), precedence, and the
`config` commands that edit it."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from aggregator.ctl.config import (
    DEFAULT_SERVER,
    Config,
    Context,
    CtlConfigError,
    config_path,
    load_config,
    parse_config,
    resolve,
    save_config,
)
from aggregator.ctl.main import cli

P = Path("/etc/nicfleet/config.yaml")
GOOD = """\
contexts:
- name: prod
  server: https://nicfleet.example:8443
  token-file: tokens/prod.token
- name: lab
  server: http://127.0.0.1:8080
current-context: prod
"""


def test_parse_good_file_resolves_relative_token_path() -> None:
    config = parse_config(GOOD, P)
    assert config.current_context == "prod"
    assert config.contexts == (
        Context("prod", "https://nicfleet.example:8443", "/etc/nicfleet/tokens/prod.token"),
        Context("lab", "http://127.0.0.1:8080", None),
    )
    assert parse_config("", P) == Config(path=P)
    assert parse_config("# nothing yet\n", P) == Config(path=P)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("contexts: [\n", ":2: not valid YAML", id="bad-yaml"),
        pytest.param("- a\n", ":1: $: must be a mapping", id="not-a-mapping"),
        pytest.param("context: []\n", ":1: $.context: unknown key; expected one of", id="typo"),
        pytest.param("contexts: {}\n", ":1: $.contexts: must be a list", id="contexts-map"),
        pytest.param("contexts:\n- lab\n", ":2: $.contexts[0]: must be a mapping", id="item"),
        pytest.param(
            "contexts:\n- name: a\n  server: http://x\n  token: t\n",
            ":4: $.contexts[0].token: unknown key; expected one of name, server, token-file",
            id="unknown-context-key",
        ),
        pytest.param(
            "contexts:\n- name: a\n", ":2: $.contexts[0].server: is required", id="no-server"
        ),
        pytest.param(
            "contexts:\n- server: http://x\n", ":2: $.contexts[0].name: is required", id="no-name"
        ),
        pytest.param(
            "contexts:\n- name: a\n  server: 8080\n",
            ":3: $.contexts[0].server: must be a non-empty string",
            id="server-number",
        ),
        pytest.param(
            "contexts:\n- name: a\n  server: localhost:8080\n",
            ":3: $.contexts[0].server: 'localhost:8080' is not an http(s) URL",
            id="server-no-scheme",
        ),
        pytest.param(
            "contexts:\n- {name: a, server: 'http://x'}\n- {name: a, server: 'http://y'}\n",
            ":3: $.contexts[1].name: duplicate context 'a'",
            id="duplicate",
        ),
        pytest.param(
            "contexts:\n- {name: a, server: 'http://x'}\ncurrent-context: b\n",
            ":3: $.current-context: no context named 'b' (have: a)",
            id="missing-current",
        ),
        pytest.param("contexts: []\ncontexts: []\n", ":2: $.contexts: given twice", id="twice"),
    ],
)
def test_parse_errors_name_file_line_and_field(text: str, expected: str) -> None:
    with pytest.raises(CtlConfigError) as caught:
        parse_config(text, P)
    assert caught.value.exit_code == 2
    assert caught.value.format_message().startswith(str(P))
    assert expected in caught.value.format_message()


def test_precedence_flag_env_context_default() -> None:
    config = parse_config(GOOD, P)
    kwargs: dict[str, str | None] = {
        "server_flag": None, "server_env": None, "token_flag": None, "token_env": None,
    }  # fmt: skip
    via_context = resolve(config=config, **kwargs)
    assert via_context.server == "https://nicfleet.example:8443"
    assert via_context.server_source == f"context 'prod' in {P}"
    assert via_context.token_file == "/etc/nicfleet/tokens/prod.token"
    env = resolve(config=config, **{**kwargs, "server_env": "http://env", "token_env": "/t"})
    assert (env.server, env.server_source, env.token_file, env.token_source) == (
        "http://env", "NICFLEET_SERVER", "/t", "NICFLEET_TOKEN_FILE",
    )  # fmt: skip
    flag = resolve(
        config=config,
        **{**kwargs, "server_env": "http://env", "server_flag": "http://flag", "token_flag": "/f"},
    )
    assert (flag.server_source, flag.token_source) == ("--server", "--token-file")
    lab = resolve(config=config, context="lab", **kwargs)
    assert (lab.server, lab.token_file, lab.context) == ("http://127.0.0.1:8080", None, "lab")
    default = resolve(config=None, **kwargs)
    assert (default.server, default.server_source, default.token_file) == (
        DEFAULT_SERVER, "default", None,
    )  # fmt: skip
    with pytest.raises(CtlConfigError, match="no context named 'x'"):
        resolve(config=config, context="x", **kwargs)
    with pytest.raises(CtlConfigError, match="there is no context file"):
        resolve(config=None, context="x", **kwargs)


def test_config_path() -> None:
    assert config_path({"NICFLEET_CONFIG": "/x.yaml", "HOME": "/h"}) == Path("/x.yaml")
    assert config_path({"XDG_CONFIG_HOME": "/xdg"}) == Path("/xdg/nicfleet/config.yaml")
    assert config_path({"HOME": "/h"}) == Path("/h/.config/nicfleet/config.yaml")


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "config.yaml"
    assert load_config(path) is None
    config = Config(path, (Context("a", "http://a", "/t"), Context("b", "https://b")), "b")
    save_config(config)
    assert load_config(path) == config
    assert path.stat().st_mode & 0o777 == 0o600
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(CtlConfigError, match="cannot read the context file"):
        load_config(path)


def ctl(path: Path, *args: str) -> Result:
    env = {"NICFLEET_CONFIG": str(path), "NICFLEET_SERVER": None, "NICFLEET_TOKEN_FILE": None}
    return CliRunner().invoke(cli, list(args), env=env, prog_name="nicfleetctl")


def test_config_commands(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    assert "No contexts in" in ctl(path, "config", "get-contexts").stderr
    new = ctl(path, "config", "set-context", "lab", "--server", "http://127.0.0.1:8080")
    assert new.exit_code == 0, new.output
    assert f'Context "lab" created in {path}.' in new.stdout
    token = tmp_path / "prod.token"
    prod = ctl(path, "config", "set-context", "prod", "--server", "https://p", "--token-file",
               str(token))  # fmt: skip
    assert prod.exit_code == 0, prod.output
    listed = ctl(path, "config", "get-contexts").stdout.splitlines()
    assert listed[0].split() == ["CURRENT", "NAME", "SERVER", "TOKEN-FILE"]
    assert listed[1].split() == ["*", "lab", "http://127.0.0.1:8080", "-"]  # the first one
    assert listed[2].split() == ["prod", "https://p", str(token)]
    switched = ctl(path, "config", "use-context", "prod")
    assert switched.stdout == 'Switched to context "prod".\n'
    assert load_config(path) is not None
    assert load_config(path).current_context == "prod"  # type: ignore[union-attr]
    edit = ctl(path, "config", "set-context", "prod", "--server", "https://q")
    assert 'Context "prod" modified' in edit.stdout
    loaded = load_config(path)
    assert loaded is not None
    assert loaded.get("prod") == Context("prod", "https://q", str(token))  # token kept


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        pytest.param(("use-context", "nope"), "no context named 'nope' (have: none)", id="use"),
        pytest.param(("set-context", "x"), "a new context needs --server", id="no-server"),
        pytest.param(("set-context", "x", "--server", "x:1"), "is not an http", id="url"),
    ],
)
def test_config_command_errors_exit_2(tmp_path: Path, args: tuple[str, ...], fragment: str) -> None:
    result = ctl(tmp_path / "config.yaml", "config", *args)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr
    assert not (tmp_path / "config.yaml").exists()


def test_broken_file_is_reported_by_config_commands(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("contexts:\n- name: a\n  servr: http://x\n")
    result = ctl(path, "config", "get-contexts")
    assert result.exit_code == 2
    assert f"{path}:3: $.contexts[0].servr: unknown key" in result.stderr
