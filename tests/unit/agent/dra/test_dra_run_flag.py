"""`nicfleet-agent run --dra`: off by default; on, it shares the registry and CDI dirs and
polls port states as fast as the device plugin does; `--dra-share/--dra-consumable/
--dra-rail` as `dra slices` parses them, bad values refused naming the option."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli import RunFlags, agent_settings, main, run
from agent.dra.cli import slice_settings
from agent.dra.pluginrunner import DraSettings
from proto.draslices import SliceSettings
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


RUN = ("--nats-url", "nats://127.0.0.1:1", "--node-name", "n")


def parsed(*args: str) -> RunFlags:
    """`run`'s sharing options as click parses them, without running the agent."""
    with run.make_context("run", [*RUN, *args]) as ctx:
        params = ctx.params
    return dataclasses.replace(
        DEFAULTS,
        dra=params["dra"],
        dra_share=params["dra_share"],
        dra_consumable=params["dra_consumable"],
        dra_rails=params["dra_rails"],
    )


@pytest.mark.parametrize(
    ("args", "slices"),
    [
        pytest.param([], SliceSettings(), id="exclusive-by-default"),
        pytest.param(["--dra-share", "4"], SliceSettings(sharing="copies", share=4), id="copies"),
        pytest.param(
            ["--dra-share", "4", "--dra-consumable"],
            SliceSettings(sharing="consumable", share=4),
            id="consumable",
        ),
        pytest.param(
            ["--dra-rail", "mlx5_0=0", "--dra-rail", "mlx5_1=7"],
            SliceSettings(rails={"mlx5_0": 0, "mlx5_1": 7}),
            id="rails",
        ),
    ],
)
def test_sharing_on_run_dra_is_the_slices_commands(args: list[str], slices) -> None:
    settings = agent_settings(parsed("--dra", *args), node_name="n", verbs=False)
    assert settings.dra is not None and settings.dra.slices == slices
    # ...the very settings `nicfleet-agent dra slices` builds from the same values.
    share = int(args[args.index("--dra-share") + 1]) if "--dra-share" in args else 1
    assert (
        slice_settings(share=share, consumable="--dra-consumable" in args, rails=slices.rails)
        == slices
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--dra", "--dra-share", "0"], "Invalid value for '--dra-share'", id="zero"),
        pytest.param(["--dra", "--dra-share", "x"], "Invalid value for '--dra-share'", id="nan"),
        pytest.param(
            ["--dra", "--dra-rail", "mlx5_0"], "Invalid value for '--dra-rail'", id="no-rail"
        ),
        pytest.param(
            ["--dra", "--dra-rail", "mlx5_0=-1"], "expected RDMA_DEVICE=RAIL", id="negative"
        ),
        pytest.param(["--dra-share", "2"], "--dra-share: needs --dra", id="share-without-dra"),
        pytest.param(["--dra-consumable"], "--dra-consumable: needs --dra", id="no-dra"),
        pytest.param(["--dra-rail", "mlx5_0=1"], "--dra-rail: needs --dra", id="rail-no-dra"),
    ],
)
def test_bad_sharing_values_name_the_option(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["run", *RUN, *args])
    assert result.exit_code == 2
    assert message in result.output
