"""`nicfleet-agent run --dra`: off by default; on, it shares the registry and CDI dirs and
polls port states as fast as the device plugin does."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from click.testing import CliRunner

from agent.cli import agent_settings, main
from agent.dra.pluginrunner import DraSettings
from tests.unit.agent.test_cli_settings import DEFAULTS


def test_dra_is_off_by_default() -> None:
    assert agent_settings(DEFAULTS, node_name="n", verbs=False).dra is None


def test_dra_on() -> None:
    flags = dataclasses.replace(
        DEFAULTS,
        dra=True,
        dra_claims_dir=Path("/run/claims"),
        plugins_registry_dir=Path("/reg"),
        cdi_dir=Path("/cdi"),
    )
    settings = agent_settings(flags, node_name="n", verbs=False)
    assert settings.dra == DraSettings(
        plugins_registry_dir=Path("/reg"),
        cdi_dir=Path("/cdi"),
        claims_dir=Path("/run/claims"),
        claims_from="nats",  # the aggregator forwards claims: agents hold no API credentials
    )
    assert settings.dra.endpoint == Path("/var/lib/kubelet/plugins/rdma.nicfleet.io/dra.sock")
    assert settings.state_poll_interval == 0.05


def test_the_flags_are_documented() -> None:
    result = CliRunner().invoke(main, ["run", "--help"])
    assert "--dra " in result.output
    assert "--dra-claims-dir" in result.output
    assert "--dra-claims [nats|dir]" in result.output


def test_dra_claims_from_a_directory() -> None:
    flags = dataclasses.replace(DEFAULTS, dra=True, dra_claims="dir")
    settings = agent_settings(flags, node_name="n", verbs=False)
    assert settings.dra is not None and settings.dra.claims_from == "dir"
