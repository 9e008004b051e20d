"""Table tests of where the device plugin's config comes from (agent.deviceplugin.configsource)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.deviceplugin.configsource import (
    Effective,
    Served,
    Wiring,
    config_sources,
    effective_config,
)
from proto.messages.config import DesiredConfig, DevicePluginConfig
from tests.support.dpfakes import resource

FILE = Path("/etc/nicfleet/device-plugin.json")


@pytest.mark.parametrize(
    ("config_file", "plugin_enabled", "desired_config", "wiring", "plugin", "aggregator"),
    [
        pytest.param(None, False, True, Wiring.OFF, False, False, id="no-flags-off"),
        pytest.param(None, False, False, Wiring.OFF, False, False, id="no-desired-still-off"),
        pytest.param(None, True, True, Wiring.AGGREGATOR, True, True, id="plugin-flag-only"),
        pytest.param(None, True, False, Wiring.NOTHING, True, False, id="plugin-no-source"),
        pytest.param(FILE, False, True, Wiring.FILE_AND_AGGREGATOR, True, True, id="file"),
        pytest.param(FILE, True, True, Wiring.FILE_AND_AGGREGATOR, True, True, id="file+flag"),
        pytest.param(FILE, False, False, Wiring.FILE, True, False, id="file-no-desired"),
    ],
)
def test_config_sources_follow_the_flags(
    config_file: Path | None,
    plugin_enabled: bool,
    desired_config: bool,
    wiring: Wiring,
    plugin: bool,
    aggregator: bool,
) -> None:
    sources = config_sources(
        config_file=config_file, plugin_enabled=plugin_enabled, desired_config=desired_config
    )
    assert sources.wiring is wiring
    assert (sources.plugin, sources.aggregator) == (plugin, aggregator)
    assert sources.file == config_file
    assert sources.why  # every decision says why, for the start-up log line


FILE_CONFIG = DevicePluginConfig(config_list=(resource("from_file"),))
WANTED = DevicePluginConfig(config_list=(resource("from_aggregator"),))
DESIRED = DesiredConfig(node="n1", generation=7, device_plugin=WANTED)


@pytest.mark.parametrize(
    ("desired", "file", "applied_generation", "expected"),
    [
        pytest.param(
            DESIRED, (FILE_CONFIG, 2), 2,
            Effective(config=WANTED, generation=7, source=Served.AGGREGATOR),
            id="desired-wins-over-file",
        ),
        pytest.param(
            DESIRED, None, 0,
            Effective(config=WANTED, generation=7, source=Served.AGGREGATOR),
            id="desired-only",
        ),
        pytest.param(
            None, (FILE_CONFIG, 3), 7,
            Effective(config=FILE_CONFIG, generation=3, source=Served.FILE),
            id="desired-deleted-back-to-file",
        ),
        pytest.param(
            None, None, 7,
            Effective(config=DevicePluginConfig(), generation=7, source=Served.NONE),
            id="neither-serves-nothing-keeps-generation",
        ),
        pytest.param(
            None, None, 0,
            Effective(config=DevicePluginConfig(), generation=0, source=Served.NONE),
            id="nothing-yet",
        ),
    ],
)  # fmt: skip
def test_effective_config_prefers_the_aggregator(
    desired: DesiredConfig | None,
    file: tuple[DevicePluginConfig, int] | None,
    applied_generation: int,
    expected: Effective,
) -> None:
    chosen = effective_config(desired=desired, file=file, applied_generation=applied_generation)
    assert chosen == expected


def test_served_is_the_metric_label() -> None:
    assert [s.value for s in Served] == ["file", "aggregator", "none"]
    assert Served.FILE == "file"  # type: ignore[comparison-overlap]  # equal to the plain string
