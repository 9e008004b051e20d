"""Where the device plugin's config comes from: a file, the aggregator, both, or nowhere.

Pure, no I/O: `config_sources` reads the agent's flags once at start; `effective_config`
picks, whenever a source changes, what to serve from what each source last said (a desired
config from the aggregator wins over the file; docs/reconcile.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum
from pathlib import Path

from proto.messages.config import DesiredConfig, DevicePluginConfig


class Wiring(Enum):
    """Which config sources the agent follows (decided once, from its flags)."""

    OFF = "off"  # no device plugin at all
    FILE = "file"  # the config file only
    AGGREGATOR = "aggregator"  # the aggregator's desired config only
    FILE_AND_AGGREGATOR = "file+aggregator"  # the file until a desired config is present
    NOTHING = "nothing"  # the plugin runs but no source can give it a config


class Served(StrEnum):
    """Where the config in force came from (the `source` label of the applied metric)."""

    FILE = "file"
    AGGREGATOR = "aggregator"
    NONE = "none"


@dataclass(frozen=True, kw_only=True)
class ConfigSources:
    wiring: Wiring
    file: Path | None  # polled and applied live when set
    why: str  # for the start-up log line

    @property
    def plugin(self) -> bool:
        return self.wiring is not Wiring.OFF

    @property
    def aggregator(self) -> bool:
        return self.wiring in (Wiring.AGGREGATOR, Wiring.FILE_AND_AGGREGATOR)


def config_sources(
    *, config_file: Path | None, plugin_enabled: bool, desired_config: bool
) -> ConfigSources:
    """The device plugin runs with a config file or when asked to (`--device-plugin`);
    the aggregator's desired config is watched then unless `--no-desired-config`."""
    if config_file is None and not plugin_enabled:
        why = "no --device-plugin-config and no --device-plugin: device plugin off"
        return ConfigSources(wiring=Wiring.OFF, file=None, why=why)
    if config_file is None:
        if desired_config:
            why = "--device-plugin without a config file: the aggregator's desired config only"
            return ConfigSources(wiring=Wiring.AGGREGATOR, file=None, why=why)
        why = "--device-plugin with --no-desired-config and no config file: nothing to serve"
        return ConfigSources(wiring=Wiring.NOTHING, file=None, why=why)
    if desired_config:
        why = f"{config_file}, until the aggregator's desired config is present (it wins)"
        return ConfigSources(wiring=Wiring.FILE_AND_AGGREGATOR, file=config_file, why=why)
    why = f"{config_file} only (--no-desired-config)"
    return ConfigSources(wiring=Wiring.FILE, file=config_file, why=why)


@dataclass(frozen=True, kw_only=True)
class Effective:
    config: DevicePluginConfig
    generation: int
    source: Served


def effective_config(
    *,
    desired: DesiredConfig | None,
    file: tuple[DevicePluginConfig, int] | None,
    applied_generation: int,
) -> Effective:
    """The aggregator's desired config when there is one, else the file's; with neither
    (the desired key was deleted and there is no file) an empty config, keeping the
    generation last applied."""
    if desired is not None:
        return Effective(
            config=desired.device_plugin, generation=desired.generation, source=Served.AGGREGATOR
        )
    if file is not None:
        return Effective(config=file[0], generation=file[1], source=Served.FILE)
    return Effective(config=DevicePluginConfig(), generation=applied_generation, source=Served.NONE)
