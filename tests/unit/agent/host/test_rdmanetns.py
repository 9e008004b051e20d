"""The RDMA subsystem's netns mode: the pure parser of ib_core's netns_mode parameter, and
the reader on lab trees (shared, exclusive, a kernel without the parameter, no ib_core)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from agent.errors import ParseError, ReadErrorLog
from agent.host.inventory import collect_snapshot
from agent.host.platform import read_rdma_netns_mode
from agent.host.rdmanetns import PARAMETER, parse_netns_mode
from agent.host.sysfs import Sysfs
from agent.lab.render import render
from agent.lab.spec import load_builtin
from proto.inventory import RdmaNetnsMode


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        pytest.param("Y\n", "shared", id="kernel-shared"),
        pytest.param("N\n", "exclusive", id="kernel-exclusive"),
        pytest.param("1", "shared", id="int-backport-shared"),
        pytest.param("0\n", "exclusive", id="int-backport-exclusive"),
    ],
)
def test_parse_netns_mode(text: str, mode: RdmaNetnsMode) -> None:
    assert parse_netns_mode(text) == mode


@pytest.mark.parametrize("text", ["", "\n", "y", "shared", "YN", "2"])
def test_parse_netns_mode_refuses_junk(text: str) -> None:
    with pytest.raises(ParseError, match="RDMA netns mode"):
        parse_netns_mode(text)


def _render(tmp_path: Path, **changes: object) -> Path:
    spec = msgspec.structs.replace(load_builtin("roce-cx6dx"), **changes)
    render(spec, tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("mode", "written"),
    [pytest.param("shared", "Y\n", id="shared"), pytest.param("exclusive", "N\n", id="exclusive")],
)
def test_lab_renders_and_agent_reads_the_mode(
    tmp_path: Path, mode: RdmaNetnsMode, written: str
) -> None:
    root = _render(tmp_path, rdma_netns_mode=mode)
    assert (root / PARAMETER).read_text() == written
    snap = collect_snapshot(Sysfs(root), node="lab", seq=1, now=0.0, agent_version="test")
    assert snap.platform.rdma_netns_mode == mode
    assert not [e for e in snap.errors if "netns_mode" in e.path]


def test_kernel_without_the_parameter_is_null_and_quiet(tmp_path: Path) -> None:
    root = _render(tmp_path, rdma_netns_mode=None)
    assert (root / "module/ib_core").is_dir() and not (root / PARAMETER).exists()
    errors = ReadErrorLog()
    assert read_rdma_netns_mode(Sysfs(root), errors) is None
    assert len(errors) == 0


def test_no_ib_core_is_null_and_quiet(tmp_path: Path) -> None:
    spec = load_builtin("roce-cx6dx")
    modules = {k: v for k, v in spec.modules.items() if k != "ib_core"}
    root = _render(tmp_path, modules=modules)
    errors = ReadErrorLog()
    assert read_rdma_netns_mode(Sysfs(root), errors) is None
    assert len(errors) == 0


def test_junk_is_recorded(tmp_path: Path) -> None:
    root = _render(tmp_path)
    (root / PARAMETER).write_text("maybe\n")
    errors = ReadErrorLog()
    assert read_rdma_netns_mode(Sysfs(root), errors) is None
    assert errors.get(f"/{PARAMETER}") == "unparsable: 'maybe'"
