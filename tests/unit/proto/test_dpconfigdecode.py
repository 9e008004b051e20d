"""The device-plugin config's syntax layer (proto.dpconfigdecode): decoding and the key/type
walk raise `Invalid` with a path; proto.dpconfig names the source (tests/unit/proto/
test_dpconfig.py covers the whole parser)."""

from __future__ import annotations

import pytest

from proto.dpconfigdecode import Invalid, decode, entries, raw_names, walk_struct
from proto.messages.config import DevicePluginConfig

ENTRY = '{"resourceName": "ib", "rdmaHcaMax": 8, "selectors": {"vendors": ["15b3"]}}'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param('{"configList": []}', {"configList": []}, id="json"),
        pytest.param(b"configList: []\n", {"configList": []}, id="yaml-bytes"),
        pytest.param("", None, id="empty"),
    ],
)
def test_decode_reads_json_else_yaml(text: str | bytes, expected: object) -> None:
    assert decode(text) == expected


@pytest.mark.parametrize(
    ("text", "path", "reason"),
    [
        pytest.param(b"\xff", "$", "not UTF-8 text", id="not-utf8"),
        pytest.param('{"configList": [}', "line 1, column 17", "not valid JSON", id="bad-json"),
        pytest.param("a: [b\n", "line 2, column 1", "not valid YAML", id="bad-yaml"),
        pytest.param("[" * 100_000, "$", "nested too deeply", id="deep"),
    ],
)
def test_decode_failures_say_where(text: str | bytes, path: str, reason: str) -> None:
    with pytest.raises(Invalid) as caught:
        decode(text)
    assert caught.value.path == path
    assert caught.value.reason.startswith(reason)


def test_walk_spells_keys_canonically_and_drops_nulls() -> None:
    document = {"configlist": [{"RESOURCENAME": "ib", "rdmaHcaMax": 8, "devices": None}]}
    canonical = walk_struct(document, DevicePluginConfig, "")
    assert canonical == {"configList": [{"resourceName": "ib", "rdmaHcaMax": 8}]}
    assert entries(canonical) == [{"resourceName": "ib", "rdmaHcaMax": 8}]


@pytest.mark.parametrize(
    ("document", "path", "reason"),
    [
        pytest.param(None, "$", "empty document", id="empty"),
        pytest.param("configList", "$", "must be a mapping (the document itself", id="string"),
        pytest.param({"configLst": []}, "configLst", "unknown key; did you mean", id="typo"),
        pytest.param({"configList": [], "ConfigList": []}, "ConfigList", "given twice", id="twice"),
        pytest.param(
            {"configList": [{"resourceName": 5}]},
            "configList[0].resourceName",
            "must be a string, got the number 5",
            id="type",
        ),
    ],
)
def test_walk_failures_name_the_field(document: object, path: str, reason: str) -> None:
    with pytest.raises(Invalid) as caught:
        walk_struct(document, DevicePluginConfig, "")
    assert caught.value.path == path
    assert caught.value.reason.startswith(reason)


def test_raw_names_are_read_from_the_undecoded_entries() -> None:
    document = decode(f'{{"configList": [{ENTRY}, {{"resourcename": "roce"}}, 7, {{}}]}}')
    assert raw_names(document) == {0: "ib", 1: "roce"}
    assert raw_names(["not", "a", "mapping"]) == {}
