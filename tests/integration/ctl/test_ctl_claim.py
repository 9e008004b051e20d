"""`nicfleetctl claim explain` on files as kubectl prints them: a table or JSON per node,
exit 0/1 by whether any node can allocate, 2 naming the bad file or field, and hostile
input (huge or odd YAML, CEL too expensive) refused rather than hung."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from agent.lab.render import render
from agent.lab.spec import load_builtin
from aggregator.ctl.main import cli
from tests.support.paths import FIXTURES

pytestmark = pytest.mark.integration

DATA = FIXTURES / "dra"
GPU_NIC = DATA / "gpu-nic-template.yaml"
TWO_NICS = DATA / "two-nics-claim.yaml"
SLICES = DATA / "slices.yaml"
GPU_CLASS = DATA / "gpu-class.yaml"


def explain(*args: str | Path) -> Result:
    env: dict[str, str | None] = {"NICFLEET_SERVER": None, "NO_COLOR": "1"}
    return CliRunner().invoke(
        cli, ["claim", "explain", *map(str, args)], env=env, prog_name="nicfleetctl"
    )


def claim_file(tmp_path: Path, expression: str, name: str = "claim.yaml") -> Path:
    doc = yaml.safe_load(TWO_NICS.read_text())
    doc["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"] = (
        expression
    )
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def test_gpu_and_nic_table_says_why_the_second_node_fails() -> None:
    got = explain("-f", GPU_NIC, "--class", GPU_CLASS, "--slices", SLICES)
    assert got.exit_code == 0, got.output
    lines = got.stdout.splitlines()
    assert lines[0].split() == ["NODE", "REQUEST", "RESULT", "WHY"]
    assert lines[2].split()[:4] == ["gpu-ib-01", "nic", "ok", "would"]
    assert "gpu-ib-02  nic      fails" in got.stdout
    assert "on gpu-ib-02: mlx5-3 port DOWN" in got.stdout


def test_json_and_exit_1_when_no_node_can(tmp_path: Path) -> None:
    got = explain("-f", TWO_NICS, "--slices", SLICES, "-o", "json")
    assert got.exit_code == 0
    body = json.loads(got.stdout)
    assert body["allocatable"] is True
    assert [n["ok"] for n in body["nodes"]] == [True, False]
    one_node = yaml.safe_load(SLICES.read_text())
    one_node["items"] = [i for i in one_node["items"] if i["spec"]["nodeName"] == "gpu-ib-02"]
    path = tmp_path / "slices.yaml"
    path.write_text(yaml.safe_dump(one_node))
    got = explain("-f", TWO_NICS, "--slices", path, "-o", "json")
    assert got.exit_code == 1
    assert json.loads(got.stdout)["allocatable"] is False


def test_exit_1_names_the_claim(tmp_path: Path) -> None:
    path = claim_file(tmp_path, 'device.attributes["rdma.nicfleet.io"].rateGbps > 800')
    got = explain("-f", path, "--slices", SLICES)
    assert got.exit_code == 1
    assert "No node can allocate claim two-nics." in got.stderr
    assert "request nics selector #0 rejects" in got.stdout


def test_multi_document_slices_and_several_files(tmp_path: Path) -> None:
    items = yaml.safe_load(SLICES.read_text())["items"]
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(yaml.safe_dump_all(items[:2]))
    second.write_text(yaml.safe_dump_all(items[2:]))
    got = explain("-f", GPU_NIC, "--class", GPU_CLASS, "--slices", first, "--slices", second)
    assert got.exit_code == 0, got.output
    assert "mlx5-3 port DOWN" in got.stdout


def test_a_class_not_given_is_exit_2_with_the_kubectl_hint() -> None:
    got = explain("-f", GPU_NIC, "--slices", SLICES)
    assert got.exit_code == 2
    assert "deviceClassName 'gpu.nvidia.com': no such DeviceClass given" in got.stderr
    assert "kubectl get deviceclass gpu.nvidia.com -o yaml" in got.stderr


def test_cel_syntax_error_names_request_and_expression(tmp_path: Path) -> None:
    got = explain("-f", claim_file(tmp_path, "device.driver =="), "--slices", SLICES)
    assert got.exit_code == 2
    assert (
        "request nics selector #0: CEL expression 'device.driver ==' does not compile" in got.stderr
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("- 1\n- 2\n", "document 1: expected a mapping, got list", id="list"),
        pytest.param("just a string\n", "document 1: expected a mapping, got str", id="scalar"),
        pytest.param("a: [\n", "not YAML", id="broken"),
        pytest.param("kind: Pod\nspec: {}\n", "document 1.kind: 'Pod'", id="pod"),
        pytest.param(
            "---\nkind: ResourceClaim\n---\nkind: ResourceClaim\n", "got 2 documents", id="two"
        ),
    ],
)
def test_bad_claim_files_are_exit_2_naming_file_and_field(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "claim.yaml"
    path.write_text(text)
    got = explain("-f", path, "--slices", SLICES)
    assert got.exit_code == 2
    assert f"{path}: " in got.stderr
    assert message in got.stderr


def test_non_dict_slice_documents_and_bad_fields(tmp_path: Path) -> None:
    path = tmp_path / "slices.yaml"
    path.write_text("--- 7\n")
    got = explain("-f", TWO_NICS, "--slices", path)
    assert got.exit_code == 2
    assert f"{path}: document 1: expected a mapping, got int" in got.stderr
    doc = yaml.safe_load(SLICES.read_text())
    doc["items"][1]["spec"]["devices"][0]["attributes"]["rateGbps"] = {"int": "fast"}
    path.write_text(yaml.safe_dump(doc))
    got = explain("-f", TWO_NICS, "--slices", path)
    assert got.exit_code == 2
    assert "document 1.items[1].spec.devices[0].attributes.rateGbps.int" in got.stderr


def test_a_missing_file_is_exit_2(tmp_path: Path) -> None:
    got = explain("-f", tmp_path / "nope.yaml", "--slices", SLICES)
    assert got.exit_code == 2
    assert "nope.yaml: cannot read" in got.stderr


def test_a_huge_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as out:
        out.truncate(17 * 1024 * 1024)
    got = explain("-f", TWO_NICS, "--slices", path)
    assert got.exit_code == 2
    assert "exceeds 16777216" in got.stderr


def test_an_alias_bomb_stays_small(tmp_path: Path) -> None:
    # aliases share one object in PyYAML, and the size limits stop the walk early
    lines = [
        'a0: &a0 {"kind": "ResourceSlice", "spec": {"driver": "d", "pool": {"name": "p"}, '
        '"nodeName": "n", "devices": [{"name": "x"}]}}'
    ]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 12)]
    lines.append("kind: List\nitems: *a11")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    got = explain("-f", TWO_NICS, "--slices", path)
    assert got.exit_code == 2
    assert "document 1.items[0]: expected a mapping, got list" in got.stderr


def test_expensive_cel_is_stopped_at_the_timeout_naming_the_selector(tmp_path: Path) -> None:
    big = "[" + ",".join(str(i) for i in range(400)) + "]"
    slow = f"{big}.all(a, {big}.all(b, {big}.all(c, a + b + c >= 0)))"
    got = explain("-f", claim_file(tmp_path, slow), "--slices", SLICES, "--timeout", "0.5")
    assert got.exit_code == 2
    assert "evaluation took longer than --timeout 0.5s" in got.stderr
    assert "running request nics selector #0" in got.stderr


def test_without_slices_it_asks_the_aggregator() -> None:
    got = explain("-f", TWO_NICS, "--server", "http://127.0.0.1:9")
    assert got.exit_code == 3
    assert "127.0.0.1:9" in got.stderr


def test_as_a_user_runs_it() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "aggregator.ctl",
            "claim",
            "explain",
            "-f",
            str(GPU_NIC),
            "--class",
            str(GPU_CLASS),
            "--slices",
            str(SLICES),
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["nodes"][1]["requests"][1]["ok"] is False


def test_slices_printed_by_the_agent_feed_it(tmp_path: Path) -> None:
    root = tmp_path / "h100"
    render(load_builtin("h100-ib-12nic"), root)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent",
            "dra",
            "slices",
            "--sysfs-root",
            str(root),
            "--node-name",
            "gpu-ib-01",
            "-o",
            "yaml",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    slices = tmp_path / "slices.yaml"
    slices.write_text(done.stdout)
    got = explain("-f", TWO_NICS, "--slices", slices, "-o", "json")
    assert got.exit_code == 0, got.output
    (node,) = json.loads(got.stdout)["nodes"]
    assert node["node"] == "gpu-ib-01"
    assert len(node["requests"][0]["devices"]) == 2


def test_deep_nesting_is_refused_before_libyaml_recurses(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n")
    # a subprocess: without the guard this crashes the interpreter (SIGSEGV), not a test
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "aggregator.ctl",
            "claim",
            "explain",
            "-f",
            str(TWO_NICS),
            "--slices",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"{path}: nested deeper than 64 levels" in done.stderr
