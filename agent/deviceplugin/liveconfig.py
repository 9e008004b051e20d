"""The device plugin's config in force, applied live to the advertised resources.

Keeps what each source last said — the config file (polled here, every version applied
live) and the aggregator's desired config (handed in by agent.bus.desired through the
service) — and applies the one `configsource.effective_config` picks. Counts what was
applied and refused for agent.metrics, read at scrape time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from agent.deviceplugin.advertised import AdvertisedResources
from agent.deviceplugin.configsource import Served, effective_config
from proto.dpconfig import ConfigError, parse_device_plugin_config
from proto.messages.config import DesiredConfig, DevicePluginConfig

log = logging.getLogger(__name__)


class LiveConfig:
    def __init__(
        self, resources: AdvertisedResources, *, file: Path | None, watch_interval: float
    ) -> None:
        self._resources = resources
        self._file = file
        self._watch_interval = watch_interval
        self._file_config: tuple[DevicePluginConfig, int] | None = None
        self._desired: DesiredConfig | None = None
        self._applied: tuple[DevicePluginConfig, int] | None = None
        self.source: Served | None = None  # None: nothing applied yet
        self.errors = 0  # config file versions refused (logged)
        self.applied: dict[str, int] = {}  # configs applied, by source

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
                    config = parse_device_plugin_config(path.read_bytes(), source=str(path))
                    generation += 1
                    self._file_config = (config, generation)
                    self._apply()
            except (OSError, ConfigError) as exc:
                # A broken edit keeps the last good config serving; the error is logged.
                self.errors += 1
                log.error("device-plugin config not applied: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._watch_interval)

    def on_desired(self, desired: DesiredConfig | None) -> None:
        self._desired = desired
        self._apply()

    def _apply(self) -> None:
        chosen = effective_config(
            desired=self._desired,
            file=self._file_config,
            applied_generation=self._applied[1] if self._applied is not None else 0,
        )
        wanted = (chosen.config, chosen.generation)
        if wanted == self._applied:
            return
        if chosen.source is Served.FILE and self.source is Served.AGGREGATOR:
            log.info("desired config removed; back to the config file")
        self._applied, self.source = wanted, chosen.source
        self._resources.apply_config(*wanted)
        self.applied[chosen.source.value] = self.applied.get(chosen.source.value, 0) + 1
        log.info(
            "device-plugin config generation %d applied (from %s)",
            chosen.generation,
            chosen.source.value,
        )
