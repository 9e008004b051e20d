"""Table tests of `nicfleet-agent run`'s options turned into AgentSettings (agent.cli)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agent.cli import RunFlags, agent_settings
from agent.deviceplugin.advertised import (
    DEFAULT_CDI_DIR,
    DEFAULT_DEVICE_PLUGIN_DIR,
    DEFAULT_PLUGINS_REGISTRY_DIR,
)
from proto.runtime.natsconnect import NO_SECURITY

CONFIG = Path("/etc/nicfleet/device-plugin.json")
DEFAULTS = RunFlags(
    nats_url="nats://127.0.0.1:4222",
    nats_security=NO_SECURITY,
    sysfs_root=Path("/sys"),
    node_name=None,
    verbs="auto",
    verbs_path=None,
    counter_interval=1.0,
    counter_full_every=30,
    state_poll_interval=None,
    inventory_interval=300.0,
    netns=None,
    no_netlink=False,
    device_plugin_config=None,
    device_plugin_enabled=False,
    desired_config=True,
    device_plugin_dir=DEFAULT_DEVICE_PLUGIN_DIR,
    plugins_registry_dir=DEFAULT_PLUGINS_REGISTRY_DIR,
    registration_mode="auto",
    cdi=False,
    cdi_dir=DEFAULT_CDI_DIR,
    no_topology=False,
    metrics_addr=None,
)


@pytest.mark.parametrize(
    ("changes", "poll"),
    [
        pytest.param({}, 0.1, id="no-plugin"),
        pytest.param({"device_plugin_enabled": True}, 0.05, id="plugin-flag"),
        pytest.param({"device_plugin_config": CONFIG}, 0.05, id="plugin-file"),
        pytest.param(
            {"device_plugin_enabled": True, "desired_config": False}, 0.05, id="plugin-no-source"
        ),
        pytest.param({"state_poll_interval": 0.3}, 0.3, id="explicit"),
        pytest.param(
            {"device_plugin_config": CONFIG, "state_poll_interval": 0.2}, 0.2, id="explicit-plugin"
        ),
    ],
)
def test_state_poll_interval_is_faster_with_the_device_plugin(
    changes: dict[str, object], poll: float
) -> None:
    flags = dataclasses.replace(DEFAULTS, **changes)  # type: ignore[arg-type]
    assert agent_settings(flags, node_name="n1", verbs=False).state_poll_interval == poll


def test_negative_flags_and_device_plugin_settings() -> None:
    flags = dataclasses.replace(
        DEFAULTS, no_netlink=True, no_topology=True, cdi=True, registration_mode="legacy"
    )
    settings = agent_settings(flags, node_name="n1", verbs=True)
    assert (settings.node_name, settings.verbs, settings.netlink) == ("n1", True, False)
    assert settings.device_plugin.topology is False
    assert settings.device_plugin.cdi is True
    assert settings.device_plugin.registration_mode == "legacy"
    assert settings.device_plugin.device_plugin_dir == DEFAULT_DEVICE_PLUGIN_DIR
