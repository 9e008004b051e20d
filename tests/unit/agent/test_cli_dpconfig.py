"""`nicfleet-agent run --device-plugin-config` at start: a document that fails whole is a
usage error (exit 2, naming the field); one whose only errors are in single entries starts
(the agent serves the others and reports those, docs/device-plugin-config.md)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from agent.cli import _check_run_flags
from tests.unit.agent.test_cli_settings import DEFAULTS


def entry(name: str, **fields: object) -> dict[str, object]:
    return {"resourceName": name, "rdmaHcaMax": 4, "selectors": {"vendors": ["15b3"]}, **fields}


def check(tmp_path: Path, *entries: dict[str, object]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"configList": list(entries)}))
    _check_run_flags(dataclasses.replace(DEFAULTS, device_plugin_config=path))


def test_an_invalid_entry_among_valid_ones_starts(tmp_path: Path) -> None:
    check(tmp_path, entry("a"), entry("b", resourcePrefix="nvidia.kubernetes.io"))


def test_a_whole_document_error_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        check(tmp_path, entry("a"), entry("a"))
    assert exited.value.code == 2
    assert "configList[1].resourceName" in capsys.readouterr().err
