"""Every `lab fault`, as the CLI injects it by default, reaches an agent that is already
running: the agent's counter and port-state readers hold their files open and pread them
(a file replaced by rename is a new inode those descriptors never see), the snapshot
re-reads everything. One test per fault kind, with the readers opened before the fault."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import click
import pytest
from click.testing import CliRunner

from agent.counters.reader import CounterReader
from agent.host.inventory import collect_snapshot
from agent.host.portstates import PortStateReader
from agent.host.sysfs import Sysfs
from agent.lab.cli import lab
from agent.lab.faults import FaultKind
from agent.lab.render import render
from agent.lab.spec import load_builtin
from proto.inventory import NodeSnapshot
from proto.messages.counters import PortCounters


@dataclass
class Agent:
    """The readers a running agent keeps, opened (first sample taken) before any fault."""

    root: Path
    counters: CounterReader
    states: PortStateReader
    seq: int = 1

    def port(self, device: str, port: int = 1) -> PortCounters | None:
        self.seq += 1
        batch = self.counters.collect(node="lab", seq=self.seq, now=float(self.seq))
        return next((p for p in batch.ports if (p.device, p.port) == (device, port)), None)

    def snapshot(self) -> NodeSnapshot:
        return collect_snapshot(
            Sysfs(self.root), node="lab", seq=self.seq, now=0.0, agent_version="test"
        )


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    """roce-cx6dx: mlx5_0/mlx5_1 on 1a:00.0/.1 behind switch port 18:00.0 with GPU0."""
    render(load_builtin("roce-cx6dx"), tmp_path)
    sysfs = Sysfs(tmp_path)
    with CounterReader(sysfs) as counters, PortStateReader(sysfs) as states:
        counters.collect(node="lab", seq=1, now=1.0)
        states.collect()
        assert counters.open_files > 0
        yield Agent(tmp_path, counters, states)


def fault(agent: Agent, *args: str) -> None:
    done = CliRunner().invoke(lab, ["fault", *args, "--root", str(agent.root)])
    assert done.exit_code == 0, done.output


def _counter(agent: Agent) -> None:
    fault(agent, "counter", "--device", "mlx5_0", "--name", "symbol_error", "--delta", "7")
    port = agent.port("mlx5_0")
    assert port is not None and port.counters["symbol_error"] == 7


def _hw_counter(agent: Agent) -> None:
    args = ("--device", "mlx5_0", "--name", "hw_counters/out_of_buffer", "--delta", "3")
    fault(agent, "counter", *args)
    port = agent.port("mlx5_0")
    assert port is not None and port.hw_counters["out_of_buffer"] == 3


def _counter_reset(agent: Agent) -> None:
    fault(agent, "counter", "--device", "mlx5_0", "--name", "port_xmit_data", "--delta", "99")
    before = agent.port("mlx5_0")
    assert before is not None and before.tx_bytes == 99 * 4
    fault(agent, "counter-reset", "--device", "mlx5_0")
    after = agent.port("mlx5_0")
    assert after is not None and after.tx_bytes == 0


def _port_down(agent: Agent) -> None:
    fault(agent, "port-down", "--device", "mlx5_1")
    assert agent.states.collect()[("mlx5_1", 1)] == ("DOWN", "Disabled")
    device = next(d for d in agent.snapshot().devices if d.name == "mlx5_1")
    assert (device.interfaces[0].operstate, device.interfaces[0].carrier) == ("down", False)


def _port_up(agent: Agent) -> None:
    fault(agent, "port-down", "--device", "mlx5_1")
    assert agent.states.collect()[("mlx5_1", 1)] == ("DOWN", "Disabled")
    fault(agent, "port-up", "--device", "mlx5_1")
    assert agent.states.collect()[("mlx5_1", 1)] == ("ACTIVE", "LinkUp")


def _pcie_width(agent: Agent) -> None:
    fault(agent, "pcie-width", "--address", "0000:1a:00.0", "--width", "8")
    device = next(d for d in agent.snapshot().devices if d.name == "mlx5_0")
    assert device.pcie is not None
    assert (device.pcie.current_width, device.pcie.degraded) == (8, True)


def _acs(agent: Agent) -> None:
    assert agent.snapshot().platform.acs_enabled_bridges == ()
    fault(agent, "acs", "--address", "0000:18:00.0", "--control", "0x1d")
    assert agent.snapshot().platform.acs_enabled_bridges == ("0000:18:00.0",)


def _device_remove(agent: Agent) -> None:
    fault(agent, "device-remove", "--device", "mlx5_1")
    assert ("mlx5_1", 1) not in agent.states.collect()
    agent.counters.rediscover()  # what the agent does on the device event the poll raises
    assert agent.port("mlx5_1") is None
    assert "mlx5_1" not in {d.name for d in agent.snapshot().devices}


def _device_add(agent: Agent) -> None:
    fault(agent, "device-remove", "--device", "mlx5_1")
    assert ("mlx5_1", 1) not in agent.states.collect()
    fault(agent, "device-add", "--device", "mlx5_1")
    assert agent.states.collect()[("mlx5_1", 1)] == ("ACTIVE", "LinkUp")
    agent.counters.rediscover()
    fault(agent, "counter", "--device", "mlx5_1", "--name", "symbol_error", "--delta", "2")
    port = agent.port("mlx5_1")
    assert port is not None and port.counters["symbol_error"] == 2


@pytest.mark.parametrize(
    "scenario",
    [
        pytest.param(_counter, id="counter"),
        pytest.param(_hw_counter, id="counter-hw_counters"),
        pytest.param(_counter_reset, id="counter-reset"),
        pytest.param(_port_down, id="port-down"),
        pytest.param(_port_up, id="port-up"),
        pytest.param(_pcie_width, id="pcie-width"),
        pytest.param(_acs, id="acs"),
        pytest.param(_device_remove, id="device-remove"),
        pytest.param(_device_add, id="device-add"),
    ],
)
def test_a_running_agent_sees_the_fault(agent: Agent, scenario: Callable[[Agent], None]) -> None:
    scenario(agent)


def test_every_fault_kind_has_a_running_agent_test() -> None:
    tested = {"counter", "counter-reset", "port-down", "port-up", "pcie-width", "acs",
              "device-remove", "device-add"}  # fmt: skip
    assert set(get_args(FaultKind)) == tested
    commands = lab.commands["fault"]
    assert isinstance(commands, click.Group)
    assert set(commands.commands) == tested


def test_atomic_replacement_is_what_a_held_descriptor_misses(agent: Agent) -> None:
    """Why in place is the default: --atomic gives the file a new inode."""
    args = ("--device", "mlx5_0", "--name", "symbol_error", "--delta", "5", "--atomic")
    fault(agent, "counter", *args)
    port = agent.port("mlx5_0")
    assert port is not None and port.counters["symbol_error"] == 0
    agent.counters.rediscover()
    port = agent.port("mlx5_0")
    assert port is not None and port.counters["symbol_error"] == 5


def test_counter_repeat_is_a_rate_that_lasts(agent: Agent) -> None:
    """--repeat: one JSON line per bump, each seen by the held reader as it lands."""
    args = ["fault", "counter", "--root", str(agent.root), "--device", "mlx5_0"]
    args += ["--name", "symbol_error", "--delta", "4", "--repeat", "3", "--every", "0.1"]
    done = CliRunner().invoke(lab, args)
    assert done.exit_code == 0, done.output
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["changes"][0]["new"] for r in lines] == ["4", "8", "12"]
    port = agent.port("mlx5_0")
    assert port is not None and port.counters["symbol_error"] == 12
