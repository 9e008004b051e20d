"""Go encoding/json.Unmarshal into the upstream plugin's UserConfigList, reproduced: each rule
of decode.go as a table row (what Go 1.25 does with the document)."""

from __future__ import annotations

from typing import Any

import pytest

from proto.gojson import GoJsonError, fold, unmarshal
from proto.rsdpupstream import USER_CONFIG_LIST

ENTRY = '"resourceName": "a", "rdmaHcaMax": 5'


def doc(entry: str, top: str = "") -> str:
    return "{" + top + '"configList": [{' + entry + "}]}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(doc(ENTRY), {"resourceName": "a", "rdmaHcaMax": 5}, id="exact-tags"),
        pytest.param(
            doc('"RESOURCENAME": "a", "RdmaHcaMax": 5'),
            {"resourceName": "a", "rdmaHcaMax": 5},
            id="keys-match-case-insensitively",
        ),
        pytest.param(
            doc('"reſourceName": "a", "rdmaHcaMax": 5'),
            {"resourceName": "a", "rdmaHcaMax": 5},
            id="equalfold-long-s",
        ),
        pytest.param(
            doc('"resourceName": "a", "resourceName": "b", "rdmaHcaMax": 5'),
            {"resourceName": "b", "rdmaHcaMax": 5},
            id="duplicate-last-wins",
        ),
        pytest.param(
            doc('"resourceName": "a", "ResourceName": "b", "rdmaHcaMax": 5'),
            {"resourceName": "b", "rdmaHcaMax": 5},
            id="duplicate-by-case-last-wins",
        ),
        pytest.param(
            doc(
                ENTRY
                + ', "selectors": {"vendors": ["15b3"]}, "selectors": {"drivers": ["mlx5_core"]}'
            ),
            {
                "resourceName": "a",
                "rdmaHcaMax": 5,
                "selectors": {"vendors": ["15b3"], "drivers": ["mlx5_core"]},
            },
            id="duplicate-struct-merges",
        ),
        pytest.param(
            doc(ENTRY + ', "devices": ["ib0"], "devices": ["ib1", "ib2"]'),
            {"resourceName": "a", "rdmaHcaMax": 5, "devices": ["ib1", "ib2"]},
            id="duplicate-slice-replaced",
        ),
        pytest.param(
            doc(ENTRY + ', "pciAddresses": ["x"], "exclusive": true'),
            {"resourceName": "a", "rdmaHcaMax": 5},
            id="unknown-fields-ignored",
        ),
        pytest.param(
            doc('"resourceName": "a", "rdmaHcaMax": null'),
            {"resourceName": "a"},
            id="null-into-int-no-effect",
        ),
        pytest.param(
            doc('"resourceName": "a", "rdmaHcaMax": 5, "rdmaHcaMax": null'),
            {"resourceName": "a", "rdmaHcaMax": 5},
            id="null-keeps-earlier-value",
        ),
        pytest.param(
            doc(ENTRY + ', "devices": ["ib0"], "devices": null'),
            {"resourceName": "a", "rdmaHcaMax": 5, "devices": None},
            id="null-into-slice-sets-nil",
        ),
        pytest.param(
            doc(ENTRY + ', "devices": [null, "ib0"]'),
            {"resourceName": "a", "rdmaHcaMax": 5, "devices": ["", "ib0"]},
            id="null-element-is-zero-string",
        ),
        pytest.param(
            doc('"resourceName": "a\\ud800"'),
            {"resourceName": "a\ufffd"},
            id="lone-surrogate-escape-replaced",
        ),
        pytest.param(
            doc('"resourceName": "a", "rdmaHcaMax": -0'),
            {"resourceName": "a", "rdmaHcaMax": 0},
            id="minus-zero-int",
        ),
        pytest.param(
            " \n\t" + doc(ENTRY) + " \r\n", {"resourceName": "a", "rdmaHcaMax": 5}, id="ws"
        ),
    ],
)
def test_decodes_like_go(text: str, expected: dict[str, Any]) -> None:
    assert unmarshal(text, USER_CONFIG_LIST)["configList"] == [expected]


def test_invalid_utf8_in_a_string_becomes_replacement_char() -> None:
    raw = doc('"resourceName": "a\xff"').encode("latin-1")
    assert unmarshal(raw, USER_CONFIG_LIST)["configList"] == [{"resourceName": "a\ufffd"}]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(b"\xe2\x82", "\ufffd\ufffd", id="truncated-sequence-one-per-byte"),
        pytest.param(b"\xed\xa0\x80", "\ufffd" * 3, id="encoded-surrogate"),
        pytest.param("é".encode(), "é", id="valid-utf8"),
    ],
)
def test_invalid_utf8_is_replaced_per_byte(raw: bytes, expected: str) -> None:
    data = b'{"configList": [{"resourceName": "' + raw + b'"}]}'
    assert unmarshal(data, USER_CONFIG_LIST)["configList"] == [{"resourceName": expected}]


def test_invalid_utf8_outside_a_string_is_a_syntax_error() -> None:
    with pytest.raises(GoJsonError) as caught:
        unmarshal(b'{"configList": []}\xff', USER_CONFIG_LIST)
    assert caught.value.kind == "syntax"


def test_periodic_update_interval_null_is_nil_pointer() -> None:
    out = unmarshal('{"periodicUpdateInterval": null, "configList": []}', USER_CONFIG_LIST)
    assert out == {"periodicUpdateInterval": None, "configList": []}


@pytest.mark.parametrize(
    ("text", "kind", "path", "words"),
    [
        pytest.param(doc(ENTRY) + " {}", "syntax", "", "Extra data", id="trailing-data"),
        pytest.param("\ufeff" + doc(ENTRY), "syntax", "", "beginning of value", id="bom"),
        pytest.param(doc('"resourceName": NaN'), "syntax", "", "invalid character", id="nan"),
        pytest.param(doc('"resourceName": "a",'), "syntax", "", "not valid JSON", id="comma"),
        pytest.param("configList: []", "syntax", "", "not valid JSON", id="yaml-is-not-json"),
        pytest.param("", "syntax", "", "not valid JSON", id="empty"),
        pytest.param(doc('"resourceName": "a\x01"'), "syntax", "", "not valid JSON", id="ctl-char"),
        pytest.param(
            doc('"resourceName": 7'), "type", "configList[0].resourceName", "number", id="n-str"
        ),
        pytest.param(
            doc('"rdmaHcaMax": "5"'), "type", "configList[0].rdmaHcaMax", "string", id="str-in-int"
        ),
        pytest.param(
            doc('"rdmaHcaMax": 1.0'), "type", "configList[0].rdmaHcaMax", "number 1.0", id="float"
        ),
        pytest.param(
            doc('"rdmaHcaMax": 1e2'), "type", "configList[0].rdmaHcaMax", "number 1e2", id="exp"
        ),
        pytest.param(
            doc('"rdmaHcaMax": 9223372036854775808'),
            "type",
            "configList[0].rdmaHcaMax",
            "9223372036854775808",
            id="int64-overflow",
        ),
        pytest.param(
            doc('"devices": "ib0"'), "type", "configList[0].devices", "string", id="str-not-list"
        ),
        pytest.param(
            doc('"selectors": {"vendors": [4099]}'),
            "type",
            "configList[0].selectors.vendors[0]",
            "number",
            id="number-in-list",
        ),
        pytest.param(doc('"selectors": []'), "type", "configList[0].selectors", "array", id="arr"),
        pytest.param('{"configList": {}}', "type", "configList", "object", id="list-is-object"),
        pytest.param("[]", "type", "", "array", id="top-level-array"),
        pytest.param('{"periodicUpdateInterval": "60"}', "type", "periodicUpdateInterval", "string",
                     id="interval-string"),
    ],
)  # fmt: skip
def test_refuses_like_go(text: str, kind: str, path: str, words: str) -> None:
    with pytest.raises(GoJsonError) as caught:
        unmarshal(text, USER_CONFIG_LIST)
    assert (caught.value.kind, caught.value.path) == (kind, path)
    assert words in caught.value.reason


def test_top_level_null_leaves_everything_zero() -> None:
    assert unmarshal("null", USER_CONFIG_LIST) == {}


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        pytest.param("deviceIDs", "DEVICEIDS", True, id="ascii"),
        pytest.param("linkTypes", "linkType", False, id="different"),
        pytest.param("k", "\u212a", True, id="kelvin-sign"),
        pytest.param("s", "\u017f", True, id="long-s"),
    ],
)
def test_fold_is_equalfold(a: str, b: str, equal: bool) -> None:
    assert (fold(a) == fold(b)) is equal
