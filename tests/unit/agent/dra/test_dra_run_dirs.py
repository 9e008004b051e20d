"""`nicfleet-agent run --dra-plugins-dir/--dra-state-dir`: where the DRA socket and the
checkpoint go (the demo runs four agents on one machine, each in its own dirs)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from click.testing import CliRunner

from agent.cli import agent_settings, main
from agent.dra.pluginrunner import DEFAULT_PLUGINS_DIR, DEFAULT_STATE_DIR
from tests.unit.agent.test_cli_settings import DEFAULTS


def test_the_kubelet_defaults_without_the_flags() -> None:
    settings = agent_settings(dataclasses.replace(DEFAULTS, dra=True), node_name="n", verbs=False)
    assert settings.dra is not None
    assert (settings.dra.plugins_dir, settings.dra.state_dir) == (
        DEFAULT_PLUGINS_DIR,
        DEFAULT_STATE_DIR,
    )


def test_the_flags_move_the_socket_and_the_checkpoint() -> None:
    flags = dataclasses.replace(
        DEFAULTS, dra=True, dra_plugins_dir=Path("/k/plugins"), dra_state_dir=Path("/s")
    )
    settings = agent_settings(flags, node_name="n", verbs=False)
    assert settings.dra is not None
    assert settings.dra.endpoint == Path("/k/plugins/rdma.nicfleet.io/dra.sock")
    assert settings.dra.checkpoint == Path("/s/checkpoint.json")


def test_the_flags_are_documented() -> None:
    result = CliRunner().invoke(main, ["run", "--help"])
    assert "--dra-plugins-dir" in result.output
    assert "--dra-state-dir" in result.output
