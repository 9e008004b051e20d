"""LiveConfig checks each source resource by resource: the valid entries go to the advertised
resources, the invalid ones into the status (`config-invalid`, with the field) and the log,
once per config applied; a whole-config error keeps the last good config."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agent.deviceplugin.advertised import AdvertisedResources, DevicePluginSettings
from agent.deviceplugin.liveconfig import LiveConfig
from proto.messages.config import DesiredConfig, DevicePluginConfig, ResourceConfig, Selectors
from proto.messages.status import DevicePluginStatus

NODE = "n1"
SELECT = Selectors(vendors=("15b3",))


def resource(name: str, prefix: str = "rdma") -> ResourceConfig:
    return ResourceConfig(
        resource_name=name, resource_prefix=prefix, rdma_hca_max=4, selectors=SELECT
    )


def desired(generation: int, *resources: ResourceConfig) -> DesiredConfig:
    return DesiredConfig(
        node=NODE, generation=generation, device_plugin=DevicePluginConfig(config_list=resources)
    )


def live(tmp_path: Path) -> tuple[LiveConfig, AdvertisedResources, list[DevicePluginStatus]]:
    statuses: list[DevicePluginStatus] = []
    settings = DevicePluginSettings(
        device_plugin_dir=tmp_path / "dp", plugins_registry_dir=tmp_path / "no-registry"
    )
    resources = AdvertisedResources(settings, node=NODE, on_status=statuses.append)
    return LiveConfig(resources, file=None, watch_interval=1.0), resources, statuses


def test_valid_entries_are_served_and_the_invalid_one_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config, resources, statuses = live(tmp_path)
    bad = resource("b", prefix="nvidia.kubernetes.io")
    with caplog.at_level(logging.ERROR, logger="agent.deviceplugin.liveconfig"):
        config.on_desired(desired(3, resource("a"), bad, resource("c")))
        config.on_desired(desired(3, resource("a"), bad, resource("c")))  # the same again
    rows = {r.name: r for r in statuses[-1].resources}
    assert sorted(rows) == ["nvidia.kubernetes.io/b", "rdma/a", "rdma/c"]
    invalid = rows["nvidia.kubernetes.io/b"]
    assert invalid.registration == "config-invalid"
    assert invalid.config_path == "configList[1].resourcePrefix"
    assert invalid.config_error == "'nvidia.kubernetes.io' is reserved for Kubernetes"
    assert (rows["rdma/a"].config_error, rows["rdma/a"].registration) == (None, "starting")
    assert not statuses[-1].registered  # not every configured resource is registered
    assert [i.name for i in config.invalid] == ["nvidia.kubernetes.io/b"]
    logged = [r.getMessage() for r in caplog.records if "is not served" in r.getMessage()]
    assert logged == [
        "device-plugin config generation 3: nvidia.kubernetes.io/b is not served:"
        " configList[1].resourcePrefix: 'nvidia.kubernetes.io' is reserved for Kubernetes"
    ]
    assert config.errors == 0

    # Fixed in the next generation: three served, nothing reported.
    config.on_desired(desired(4, resource("a"), resource("b", prefix="nvidia.com"), resource("c")))
    assert [r.name for r in resources.status()] == ["rdma/a", "rdma/c", "nvidia.com/b"]
    assert all(r.config_error is None for r in statuses[-1].resources)
    assert config.invalid == ()


def test_a_whole_config_error_keeps_the_last_good_config(tmp_path: Path) -> None:
    config, resources, _ = live(tmp_path)
    config.on_desired(desired(1, resource("a")))
    config.on_desired(desired(2, resource("a"), resource("a")))  # duplicate: refused whole
    assert config.errors == 1
    assert [r.name for r in resources.status()] == ["rdma/a"]
    assert resources.plugin_status().config_generation == 1
