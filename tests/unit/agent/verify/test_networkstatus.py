"""The downward-API annotations file (kubelet's FormatMap: sorted `key="strconv.Quote(value)"`
lines) and Multus network-status with device-info, parsed without I/O; and the reader,
which turns a missing file into "not known" and a bad one into a read error."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.verify.evidence import read_attachments
from agent.verify.networkstatus import (
    AnnotationsError,
    attachments_from_annotations,
    parse_annotations_file,
    parse_network_status,
    unquote_go,
)
from proto.inventory import ReadError
from proto.messages.validation import AttachmentEvidence

# As kubelet writes it for a pod Multus attached to an SR-IOV network: Multus indents the
# JSON, so the value carries \n escapes; no trailing newline after the last line.
ANNOTATIONS = (
    'k8s.v1.cni.cncf.io/network-status="[{\\n    \\"name\\": \\"k8s-pod-network\\",\\n'
    '    \\"interface\\": \\"eth0\\",\\n    \\"ips\\": [\\n        \\"10.244.1.7\\"\\n    ],\\n'
    '    \\"mac\\": \\"0a:58:0a:f4:01:07\\",\\n    \\"default\\": true,\\n    \\"dns\\": {}\\n'
    '},{\\n    \\"name\\": \\"default/rdma-net\\",\\n    \\"interface\\": \\"net1\\",\\n'
    '    \\"ips\\": [\\n        \\"10.10.0.11\\"\\n    ],\\n    \\"mac\\": \\"0c:42:a1:e1:7f:40\\",'
    '\\n    \\"dns\\": {},\\n    \\"device-info\\": {\\n        \\"type\\": \\"pci\\",\\n'
    '        \\"version\\": \\"1.1.0\\",\\n        \\"pci\\": {\\n'
    '            \\"pci-address\\": \\"0000:1a:00.2\\",\\n'
    '            \\"rdma-device\\": \\"mlx5_4\\",\\n'
    '            \\"pf-pci-address\\": \\"0000:1a:00.0\\"\\n        }\\n    }\\n}]"\n'
    'k8s.v1.cni.cncf.io/networks="rdma-net"\n'
    'kubernetes.io/config.seen="2026-12-02T01:00:00.000000000Z"'
)


def test_a_kubelet_annotations_file_gives_the_attachments_in_order() -> None:
    assert attachments_from_annotations(ANNOTATIONS) == (
        AttachmentEvidence(name="k8s-pod-network", interface="eth0", ips=("10.244.1.7",),
                           mac="0a:58:0a:f4:01:07", default=True),
        AttachmentEvidence(name="default/rdma-net", interface="net1", ips=("10.10.0.11",),
                           mac="0c:42:a1:e1:7f:40", device_type="pci",
                           pci_address="0000:1a:00.2", pf_pci_address="0000:1a:00.0",
                           rdma_device="mlx5_4"),
    )  # fmt: skip


def test_annotations_file_keys_and_values() -> None:
    parsed = parse_annotations_file(ANNOTATIONS)
    assert sorted(parsed) == [
        "k8s.v1.cni.cncf.io/network-status",
        "k8s.v1.cni.cncf.io/networks",
        "kubernetes.io/config.seen",
    ]
    assert parsed["k8s.v1.cni.cncf.io/networks"] == "rdma-net"


def test_no_network_status_is_no_attachments() -> None:
    assert attachments_from_annotations('a="b"\n\n') == ()
    assert attachments_from_annotations("") == ()


@pytest.mark.parametrize(
    ("quoted", "value"),
    [
        pytest.param("plain", "plain", id="plain"),
        pytest.param('a\\"b\\\\c', 'a"b\\c', id="quote-and-backslash"),
        pytest.param("l1\\nl2\\tx", "l1\nl2\tx", id="newline-tab"),
        pytest.param("\\x41\\u00e9\\U0001F600", "Aé\U0001f600", id="hex-escapes"),
        pytest.param("\\101", "A", id="octal"),
        pytest.param("\\xff", "\ufffd", id="invalid-utf8-byte"),
        pytest.param("é kept", "é kept", id="printable-unicode-is-not-escaped"),
    ],
)
def test_unquote_go(quoted: str, value: str) -> None:
    assert unquote_go(quoted) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("no-equals-sign", "line 1 is not key", id="not-key-value"),
        pytest.param('a="b"\nb=unquoted', "line 2 is not key", id="unquoted"),
        pytest.param('a="\\q"', "unknown escape \\q", id="bad-escape"),
        pytest.param('a="\\x4"', "bad escape digits", id="short-hex"),
        pytest.param('a="x\\"', "lone backslash", id="lone-backslash"),
    ],
)
def test_bad_annotations_files(text: str, message: str) -> None:
    with pytest.raises(AnnotationsError, match=message.replace("\\", "\\\\")):
        parse_annotations_file(text)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("{", "is not JSON", id="not-json"),
        pytest.param('{"name": "x"}', "is not a JSON array", id="object"),
        pytest.param('[{"interface": "net1"}]', r"network-status\[0\] has no string name",
                     id="no-name"),
    ],
)  # fmt: skip
def test_bad_network_status(value: str, message: str) -> None:
    with pytest.raises(AnnotationsError, match=message):
        parse_network_status(value)


def test_odd_entries_keep_what_is_readable() -> None:
    value = (
        '[{"name": "a", "ips": ["10.0.0.1", 5], "default": "yes", "unknown": 1,'
        ' "device-info": {"type": "vdpa", "version": "1.1.0", "vdpa": {"path": "/dev/x"}}},'
        ' {"name": "b", "device-info": "garbage"}]'
    )
    assert parse_network_status(value) == (
        AttachmentEvidence(name="a", ips=("10.0.0.1",), device_type="vdpa"),
        AttachmentEvidence(name="b"),
    )


def test_the_annotations_reader_never_fails_the_run(tmp_path: Path) -> None:
    assert read_attachments(None) == (None, (), None)
    assert read_attachments(tmp_path / "not-mounted") == (None, (), None)
    good = tmp_path / "good"
    good.write_text(ANNOTATIONS)
    path, attachments, error = read_attachments(good)
    assert (path, len(attachments), error) == (str(good), 2, None)
    bad = tmp_path / "bad"
    bad.write_text("k8s.v1.cni.cncf.io/network-status=[]")
    assert read_attachments(bad) == (
        str(bad),
        (),
        ReadError(path=str(bad), error='line 1 is not key="value"'),
    )
    _, _, error = read_attachments(tmp_path)  # a directory where the file should be
    assert error is not None and error.error == "EISDIR"
