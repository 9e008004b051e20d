"""The device plugin's config in force, applied live to the advertised resources.

Keeps what each source last said — the config file (polled here, every version applied
live) and the aggregator's desired config (handed in by agent.bus.desired through the
service) — and applies the one `configsource.effective_config` picks. Both are checked
resource by resource (proto.dpconfig): the valid entries are served, each invalid one is
logged once per config applied and listed in the status. Counts what was applied and
refused for agent.metrics, read at scrape time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from msgspec.structs import replace

from agent.deviceplugin.advertised import AdvertisedResources
from agent.deviceplugin.configsource import Served, effective_config
from proto import subjects
from proto.dpconfig import (
    CheckedConfig,
    ConfigError,
    InvalidResource,
    check_device_plugin_resources,
    parse_device_plugin_resources,
)
from proto.messages.config import DesiredConfig, DevicePluginConfig

log = logging.getLogger(__name__)

_Applied = tuple[DevicePluginConfig, int, tuple[InvalidResource, ...]]


class LiveConfig:
    def __init__(
        self, resources: AdvertisedResources, *, file: Path | None, watch_interval: float
    ) -> None:
        self._resources = resources
        self._file = file
        self._watch_interval = watch_interval
        self._file_config: tuple[CheckedConfig, int] | None = None
        self._desired: tuple[DesiredConfig, CheckedConfig] | None = None
        self._applied: _Applied | None = None
        self.source: Served | None = None  # None: nothing applied yet
        self.errors = 0  # config versions refused whole (logged)
        self.applied: dict[str, int] = {}  # configs applied, by source

    @property
    def invalid(self) -> tuple[InvalidResource, ...]:
        """The entries of the config in force that are not served."""
        return self._applied[2] if self._applied is not None else ()

    async def watch_file(self, stop: asyncio.Event) -> None:
        """Apply the config file, and every later version of it, live."""
        assert self._file is not None
        path = self._file
        seen: tuple[int, int] | None = None
        generation = 0
        while not stop.is_set():
            try:
                stat = path.stat()
                stamp = (stat.st_mtime_ns, stat.st_size)
                if stamp != seen:
                    seen = stamp
                    checked = parse_device_plugin_resources(path.read_bytes(), source=str(path))
                    generation += 1
                    self._file_config = (checked, generation)
                    self._apply()
            except (OSError, ConfigError) as exc:
                # A broken edit keeps the last good config serving; the error is logged.
                self.errors += 1
                log.error("device-plugin config not applied: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._watch_interval)

    def on_desired(self, desired: DesiredConfig | None) -> None:
        if desired is None:
            self._desired = None
        else:
            source = f"{subjects.KV_CONFIG}/{subjects.node_token(desired.node)}"
            try:  # agent.bus.desired refused whole-config errors already; a safety net
                checked = check_device_plugin_resources(desired.device_plugin, source=source)
            except ConfigError as exc:
                self.errors += 1
                log.error("desired config not applied, the last good one stays: %s", exc)
                return
            self._desired = (desired, checked)
        self._apply()

    def _apply(self) -> None:
        desired = None
        if self._desired is not None:
            wanted, checked = self._desired
            desired = replace(wanted, device_plugin=checked.config)
        file = None
        if self._file_config is not None:
            file = (self._file_config[0].config, self._file_config[1])
        chosen = effective_config(
            desired=desired,
            file=file,
            applied_generation=self._applied[1] if self._applied is not None else 0,
        )
        invalid: tuple[InvalidResource, ...] = ()
        if chosen.source is Served.AGGREGATOR and self._desired is not None:
            invalid = self._desired[1].invalid
        elif chosen.source is Served.FILE and self._file_config is not None:
            invalid = self._file_config[0].invalid
        applied = (chosen.config, chosen.generation, invalid)
        if applied == self._applied:
            return
        if chosen.source is Served.FILE and self.source is Served.AGGREGATOR:
            log.info("desired config removed; back to the config file")
        self._applied, self.source = applied, chosen.source
        self._resources.apply_config(chosen.config, chosen.generation, invalid=invalid)
        self.applied[chosen.source.value] = self.applied.get(chosen.source.value, 0) + 1
        log.info(
            "device-plugin config generation %d applied (from %s): %d resources served,"
            " %d not served",
            chosen.generation,
            chosen.source.value,
            len(chosen.config.config_list),
            len(invalid),
        )
        for bad in invalid:  # once per config applied: a re-read of the same one is quiet
            log.error(
                "device-plugin config generation %d: %s is not served: %s: %s",
                chosen.generation,
                bad.name,
                bad.path,
                bad.reason,
                extra={"resource": bad.name},
            )
