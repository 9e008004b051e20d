"""AdvertisedResources: every advertised resource, kept in step with config and inventory.

The agent service calls `apply_config` (live: servers start, stop or re-send; never a
restart; the entries a config check left out are reported, never served), `update` with
each snapshot and port-state poll (health reaches open ListAndWatch streams at once) and
`run` (one TaskGroup holding a task per resource). `status()` and the `on_status` callback
report what is advertised and registered; the CDI spec is kept here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from msgspec.structs import replace

from agent.deviceplugin.cdi import cdi_spec, remove_cdi_spec, write_cdi_spec
from agent.deviceplugin.plan import PortStates, ResourcePlan, empty_plan, plan_resource
from agent.deviceplugin.registration import Backoff, RegistrationMode, resolve_mode
from agent.deviceplugin.resource import ResourceRunner, RunnerSettings
from agent.deviceplugin.selectors import Selection, select_devices
from agent.deviceplugin.server import ResourceFeed
from proto.dpconfig import InvalidResource, resource_full_name
from proto.inventory import NodeSnapshot
from proto.messages.config import DevicePluginConfig, ResourceConfig
from proto.messages.status import DevicePluginStatus, ResourceStatus

log = logging.getLogger(__name__)

DEFAULT_DEVICE_PLUGIN_DIR: Final = Path("/var/lib/kubelet/device-plugins")
DEFAULT_PLUGINS_REGISTRY_DIR: Final = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_CDI_DIR: Final = Path("/var/run/cdi")
SelectFn = Callable[[NodeSnapshot, ResourceConfig], Selection]
_NOT_WRITTEN: Final = object()  # the CDI file's state is unknown until first written


@dataclass(frozen=True, kw_only=True)
class DevicePluginSettings:
    device_plugin_dir: Path = DEFAULT_DEVICE_PLUGIN_DIR
    plugins_registry_dir: Path = DEFAULT_PLUGINS_REGISTRY_DIR
    registration_mode: RegistrationMode = "auto"
    cdi: bool = False
    cdi_dir: Path = DEFAULT_CDI_DIR
    topology: bool = True
    resend_interval: float = 300.0  # full list re-sent on every stream even without change
    watch_interval: float = 0.1  # stat of our socket and kubelet.sock
    call_timeout: float = 3.0  # every call to the kubelet
    backoff: Backoff = field(default_factory=Backoff)
    watcher_grace: float = 10.0  # auto: legacy fallback when no plugin watcher calls


@dataclass
class _Resource:
    config: ResourceConfig
    feed: ResourceFeed
    runner: ResourceRunner
    task: asyncio.Task[None] | None = None
    previous: asyncio.Task[None] | None = None  # a removed namesake still shutting down


class AdvertisedResources:
    """The resource servers of one node; see the module docstring for the API."""

    def __init__(
        self,
        settings: DevicePluginSettings,
        *,
        node: str,
        select: SelectFn = select_devices,
        clock: Callable[[], float] = time.time,
        on_status: Callable[[DevicePluginStatus], None] | None = None,
    ) -> None:
        self.settings = settings
        self._node = node
        self._select = select
        self._clock = clock
        self._on_status = on_status
        self._resources: dict[str, _Resource] = {}
        self._retiring: dict[str, asyncio.Task[None]] = {}
        self._generation = 0
        self._invalid: tuple[InvalidResource, ...] = ()
        self._snapshot: NodeSnapshot | None = None
        self._port_states: PortStates = {}
        self._selections: dict[str, Selection] = {}
        self._tasks: asyncio.TaskGroup | None = None
        self._last_status: DevicePluginStatus | None = None
        self._cdi_written: object = _NOT_WRITTEN

    # -- the agent's API -------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Serve every configured resource until `stop` is set."""
        async with asyncio.TaskGroup() as tasks:
            self._tasks = tasks
            for name, res in self._resources.items():
                self._start(name, res)
            await stop.wait()
            for res in self._resources.values():
                res.runner.stop(deregister=False)
        self._tasks = None

    def apply_config(
        self,
        config: DevicePluginConfig,
        generation: int,
        *,
        invalid: tuple[InvalidResource, ...] = (),
    ) -> None:
        """Make the served resources match `config`, live; `invalid`: the entries of the
        same document left out of it, listed in the status (a namesake served before is
        deregistered: the entry in force is the invalid one)."""
        self._generation = generation
        self._invalid = invalid
        self._retiring = {n: t for n, t in self._retiring.items() if not t.done()}
        desired = {resource_full_name(rc): rc for rc in config.config_list}
        for name in [n for n in self._resources if n not in desired]:
            gone = self._resources.pop(name)
            self._selections.pop(name, None)
            log.info("%s: removed from the config, deregistering", name)
            gone.runner.stop(deregister=True)
            if gone.task is not None:
                self._retiring[name] = gone.task
        for name, rc in desired.items():
            res = self._resources.get(name)
            if res is None:
                self._add(name, rc)
            elif res.config != rc:
                log.info("%s: config changed", name)
                restart = res.config.exclusive != rc.exclusive
                res.config = rc
                self._selections.pop(name, None)
                self._replan(name, res)
                if restart:  # the plugin options change: the kubelet reads them on register
                    res.runner.restart()
        self._write_cdi()
        self._emit()

    def update(self, snapshot: NodeSnapshot, port_states: PortStates) -> None:
        """New inventory and/or port states: re-plan, push changes to open streams now."""
        if snapshot is not self._snapshot:
            self._selections.clear()
        self._snapshot, self._port_states = snapshot, dict(port_states)
        for name, res in self._resources.items():
            self._replan(name, res)
        self._write_cdi()
        self._emit()

    def status(self) -> tuple[ResourceStatus, ...]:
        """The served resources, then the config's invalid entries (never served)."""
        served = tuple(self._resource_status(res) for res in self._resources.values())
        return served + tuple(_invalid_status(bad) for bad in self._invalid)

    def plugin_status(self) -> DevicePluginStatus:
        resources = self.status()
        return DevicePluginStatus(
            node=self._node,
            config_generation=self._generation,
            registered=bool(resources) and all(r.registration == "registered" for r in resources),
            resources=resources,
            observed_at=self._clock(),
        )

    # -- internals -------------------------------------------------------------------

    def _add(self, name: str, rc: ResourceConfig) -> None:
        s = self.settings
        mode = resolve_mode(s.registration_mode, registry_exists=s.plugins_registry_dir.is_dir())
        feed = ResourceFeed(empty_plan(rc), resend_interval=s.resend_interval)
        runner = ResourceRunner(
            feed,
            RunnerSettings(
                device_plugin_dir=s.device_plugin_dir,
                plugins_registry_dir=s.plugins_registry_dir,
                watch_interval=s.watch_interval,
                call_timeout=s.call_timeout,
                backoff=s.backoff,
                watcher_grace=s.watcher_grace if s.registration_mode == "auto" else None,
            ),
            mode=mode,
            cdi=lambda: self.settings.cdi,
            on_change=self._emit,
        )
        res = _Resource(
            config=rc, feed=feed, runner=runner, previous=self._retiring.pop(name, None)
        )
        self._resources[name] = res
        self._replan(name, res)
        log.info("%s: added (%s registration)", name, mode)
        if self._tasks is not None:
            self._start(name, res)

    def _start(self, name: str, res: _Resource) -> None:
        assert self._tasks is not None
        res.task = self._tasks.create_task(res.runner.serve(res.previous), name=f"dp:{name}")
        res.previous = None

    def _replan(self, name: str, res: _Resource) -> None:
        if self._snapshot is None:
            res.feed.publish(empty_plan(res.config))
            return
        try:
            selection = self._selections.get(name)
            if selection is None:
                selection = self._selections[name] = self._select(self._snapshot, res.config)
            plan = plan_resource(
                res.config,
                selection,
                self._snapshot,
                self._port_states,
                topology=self.settings.topology,
            )
        except Exception:  # one bad input must not stop the other resources' updates
            log.exception("%s: planning failed; keeping the previous device list", name)
            return
        if res.feed.publish(plan):
            log.info(
                "%s: %d devices, %d healthy%s",
                name,
                len(plan.devices),
                plan.healthy_count,
                f" ({plan.unhealthy_reason})" if plan.unhealthy_reason else "",
                extra={"resource": name},
            )

    def _plans(self) -> list[ResourcePlan]:
        return [res.feed.plan for res in self._resources.values()]

    def _write_cdi(self) -> None:
        if not self.settings.cdi:
            return
        adapters = [a for plan in self._plans() for a in plan.adapters]
        spec = cdi_spec(adapters) if adapters else None
        if spec == self._cdi_written:
            return
        try:
            if spec is None:
                remove_cdi_spec(self.settings.cdi_dir)
            else:
                path = write_cdi_spec(self.settings.cdi_dir, spec)
                log.info("CDI spec written: %s (%d devices)", path, len(spec["devices"]))
        except OSError as exc:
            log.error("CDI spec in %s: %s", self.settings.cdi_dir, os.strerror(exc.errno or 0))
            return
        self._cdi_written = spec

    def _resource_status(self, res: _Resource) -> ResourceStatus:
        plan, runner = res.feed.plan, res.runner
        return ResourceStatus(
            name=plan.resource,
            advertised=len(plan.devices),
            healthy=plan.healthy_count,
            devices=tuple(a.name for a in plan.adapters),
            exclusive=res.config.exclusive,
            excluded=dict(plan.excluded),
            unmatched=dict(plan.unmatched),
            unhealthy={a.name: a.reason or "unhealthy" for a in plan.adapters if not a.healthy},
            unhealthy_reason=plan.unhealthy_reason,
            registration=runner.state,
            registration_mode=runner.mode,
            registration_error=runner.error,
            registration_attempts=runner.attempts,
            endpoint=str(runner.endpoint),
        )

    def _emit(self) -> None:
        if self._on_status is None:
            return
        status = self.plugin_status()
        comparable = replace(status, observed_at=0.0)
        if comparable != self._last_status:
            self._last_status = comparable
            try:
                self._on_status(status)
            except Exception:  # the publisher's problem must not stop serving the kubelet
                log.exception("device-plugin status callback failed")


def _invalid_status(bad: InvalidResource) -> ResourceStatus:
    return ResourceStatus(
        name=bad.name,
        registration="config-invalid",
        config_path=bad.path,
        config_error=bad.reason,
    )
