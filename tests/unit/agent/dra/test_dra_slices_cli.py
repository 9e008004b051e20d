"""`nicfleet-agent dra slices` on lab trees: the objects, in JSON and YAML, validate
against the 1.37 schema and carry each device kind's attributes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import msgspec
import pytest
from click.testing import CliRunner

from agent.cli import main
from agent.lab.render import render
from agent.lab.spec import load_builtin

KUBERNETES_VERSION = "1.37"
ROOT = "resource.kubernetes.io/pcieRoot"


@pytest.fixture(scope="module")
def cx8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cx8")
    render(load_builtin("cx8-dd-lag"), root)
    return root


def slices(root: Path, *extra: str) -> list[dict[str, Any]]:
    args = ["dra", "slices", "--sysfs-root", str(root), "--node-name", "gb300-01", *extra]
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 0, done.output
    if "yaml" in extra:
        return [msgspec.yaml.decode(doc) for doc in done.stdout.split("---\n")]
    listing = json.loads(done.stdout)
    assert (listing["apiVersion"], listing["kind"]) == ("v1", "List")
    items: list[dict[str, Any]] = listing["items"]
    return items


def by_name(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        d["name"]: {k: next(iter(v.values())) for k, v in d["attributes"].items()}
        for o in objects
        for d in o["spec"]["devices"]
    }


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param((), id="json"),
        pytest.param(("-o", "yaml"), id="yaml"),
        pytest.param(("--share", "3"), id="copies"),
        pytest.param(("--share", "4", "--consumable", "-o", "yaml"), id="consumable"),
    ],
)
def test_output_validates(cx8: Path, extra: tuple[str, ...]) -> None:
    objects = slices(cx8, *extra)
    assert objects
    for obj in objects:
        assert kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True) == "1.37"
        assert obj["spec"]["nodeName"] == "gb300-01"
        assert obj["spec"]["pool"]["name"] == "gb300-01"


def test_every_kind_on_the_cx8_node(cx8: Path) -> None:
    devices = by_name(slices(cx8, "--rail", "mlx5_0=1"))
    assert {n: d["kind"] for n, d in devices.items()} == {
        "mlx5-0": "pf",
        "mlx5-3": "vf",
        "mlx5-4": "vf",
        "mlx5-5": "sf",
        "mlx5-bond-0": "bond",
    }
    # Data Direct: the NIC is matched to the GPU's root, its own root kept beside it.
    for name in ("mlx5-0", "mlx5-3", "mlx5-4", "mlx5-5"):
        assert (devices[name][ROOT], devices[name]["nicPcieRoot"]) == ("pci0000:2a", "pci0000:25")
    bond = devices["mlx5-bond-0"]
    assert (bond[ROOT], bond["nicPcieRoot"]) == ("pci0000:1a", "pci0000:15")
    assert bond["bondPciBusIDs"] == "0000:16:00.0,0000:16:00.1"
    assert devices["mlx5-5"]["sfNumber"] == 88
    assert devices["mlx5-3"]["pfPciBusID"] == "0000:26:00.0"
    assert devices["mlx5-0"]["rail"] == 1
    assert devices["mlx5-0"]["model"] == "ConnectX-8"
    assert devices["mlx5-0"]["rateGbps"] == 800


def test_copies_and_consumable(cx8: Path) -> None:
    copies = by_name(slices(cx8, "--share", "2"))
    assert sorted(copies)[:2] == ["mlx5-0-s0", "mlx5-0-s1"]
    assert len(copies) == 10
    (one, *_) = slices(cx8, "--share", "4", "--consumable")
    device = one["spec"]["devices"][0]
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"]["shares"]["value"] == "4"


def test_node_without_data_direct_has_own_root(tmp_path: Path) -> None:
    render(load_builtin("roce-cx6dx-2"), tmp_path)
    devices = by_name(slices(tmp_path))
    assert devices["mlx5-0"][ROOT] == "pci0000:d7"
    assert "nicPcieRoot" not in devices["mlx5-0"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--node-name", "Bad_Name"], "--node-name", id="node-name"),
        pytest.param(
            ["--node-name", "n", "--sysfs-root", "/nonexistent"], "--sysfs-root", id="root"
        ),
        pytest.param(["--node-name", "n", "--rail", "mlx5_0"], "--rail", id="rail"),
        pytest.param(["--node-name", "n", "--share", "0"], "--share", id="share"),
    ],
)
def test_bad_arguments(cx8: Path, args: list[str], message: str) -> None:
    base = (
        ["dra", "slices"] if "--sysfs-root" in args else ["dra", "slices", "--sysfs-root", str(cx8)]
    )
    done = CliRunner().invoke(main, [*base, *args])
    assert done.exit_code == 2
    assert message in done.output
